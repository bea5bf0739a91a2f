"""fp16 GEMMs with fp16 accumulation for the NF4 linears (cuBLAS, `torch.backends.cuda.matmul.
allow_fp16_accumulation`, torch 2.7+).

GeForce Ampere/Ada cards accumulate bf16/fp16 products in float32 at half their fp16-accumulate rate
(RTX 3090: 71 vs 142 TFLOP/s), so this doubles the GEMM rate there; data-centre cards (A100, H100) gain nothing.
The weight is dequantized straight to fp16 and the flag is set only around the GEMM. Under `--compute fp16acc` the
DiT computes in fp16 (speed/options.apply_speed -> WanDiT.set_compute_dtype), so its activations arrive in fp16 and
the output stays fp16: nothing is cast (casting a bf16 model's activations around every GEMM cost 0.063 s of a v2
1.3B chunk on an H200, about what the GEMMs gain on an RTX 4090). fp16 has a smaller range than bf16 (65504); the
residual stream stays float32, so only GEMM outputs and attention see it: the error report in BENCHMARKS.md says
whether it holds.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def available() -> bool:
    return hasattr(torch.backends.cuda.matmul, "allow_fp16_accumulation")


def linear(x: torch.Tensor, w16: torch.Tensor, bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """y = x @ w16.T + bias in fp16 with fp16 accumulation, returned in out_dtype (no cast for fp16 x and out)."""
    flags = torch.backends.cuda.matmul
    before = flags.allow_fp16_accumulation
    flags.allow_fp16_accumulation = True
    try:
        y = F.linear(x.to(torch.float16), w16, None if bias is None else bias.to(torch.float16))
    finally:
        flags.allow_fp16_accumulation = before
    return y.to(out_dtype)

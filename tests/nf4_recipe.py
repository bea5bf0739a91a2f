"""The one-pass NF4 -> FP8 / INT8 recipe (quant/nf4_rows.py) written in torch ops, independently of the kernel:
the CPU tests check it against bitsandbytes' dequantize + the row quantizer, the GPU tests check the kernel
against it. Loaded by path (tests is not a package)."""
import torch

from lingbot_world.quant import fp8, int8


def dequantized(packed: torch.Tensor, state, dtype: torch.dtype) -> torch.Tensor:
    """The [N, K] weight in `dtype` from bnb's packed codes and QuantState (any device)."""
    rows, cols = state.shape
    flat = packed.reshape(-1).to(torch.int64)
    nibbles = torch.stack([flat >> 4, flat & 15], dim=1).reshape(-1)  # even element in the high nibble
    values = state.code.to(device=packed.device, dtype=torch.float32)[nibbles]
    if state.nested:
        inner = state.state2
        outer = inner.absmax.repeat_interleave(inner.blocksize)[: state.absmax.numel()]
        absmax = inner.code.to(torch.float32)[state.absmax.to(torch.int64)] * outer
        absmax = absmax + torch.tensor(float(state.offset), dtype=torch.float32, device=absmax.device)
    else:
        absmax = state.absmax.float()
    return (values * absmax.repeat_interleave(state.blocksize)).to(dtype).reshape(rows, cols)


def reference(packed: torch.Tensor, state, dtype: torch.dtype, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale [1, N]): the dequantized weight through the row quantizer."""
    return (fp8 if kind == "fp8" else int8).quantize_weight(dequantized(packed, state, dtype))

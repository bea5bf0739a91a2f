"""A linear whose weight is stored in FP8 (e4m3 + one float32 scale per output channel): `--weights fp8`.

Unlike `--compute fp8` on NF4 weights, where every forward dequantizes NF4 and re-quantizes the weight
(NF4Linear._prepared), the weight here is quantized once (by the converter, loaders/fp8_writer.py, or while
loading float weights) and the GEMM reads it as it is: `fp8.linear` quantizes the activation per token and runs
`_scaled_mm` on the tensor cores (sm89+), or its float32 emulation on a CPU (`emulated_scaled_mm`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fp8
from .fp8_format import SCALE_DTYPE, WEIGHT_DTYPE, Fp8FormatError
from .nf4_format import LOWP_MIN_ROWS, swap_quantized_linears


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] -> (e4m3 [N, K], float32 scale [N]) with w ~= w8 * scale[:, None] (quant/fp8.py's
    per-row quantizer, correctly rounded, computed in float32 from `w` as given)."""
    w8, scale = fp8.quantize_rows(w, exact=True)
    return w8, scale.view(-1)


def dequantize(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w8 * scale per row, rounded once to `dtype`."""
    return fp8.mul_to(w8.float(), scale.float().view(-1, 1), dtype)


class Fp8Linear(nn.Module):
    """y = x W^T + b with W = weight (e4m3) * weight_scale (per row); created empty on `meta`, filled by
    `load_stored` (a stored FP8 pair) or `load_float_weight` (quantized here, bf16 first).

    Token-wise GEMMs (at least `lowp_min_rows` rows, dims multiples of 16) run in FP8; the few-row ones (time
    embedding, the 512 text rows) multiply the dequantized weight in the compute dtype, as the NF4 linears keep
    them exact: their activations' FP8 error would reach every token. `lora` is the LoRA hook
    (quant.lora.LinearLora): its low-rank terms are added to the output; weight patches (other adapter kinds) are
    applied to the dequantized weight, which is quantized again for the GEMM (once per phase under
    `hold_weight`), the NF4 linears' order of steps.
    """

    lowp_min_rows = LOWP_MIN_ROWS
    fp8_fast_accum = True
    compute_mode = "fp8"  # what the GEMMs run in; `set_compute` cannot change it (the weight is FP8)
    _quantize = None  # the activation quantizer apply_speed picked (Triton row kernel, compiled or eager)
    _held: Optional[dict] = None
    lora = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 compute_dtype: Optional[torch.dtype] = torch.bfloat16, device="meta"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=WEIGHT_DTYPE, device=device),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=SCALE_DTYPE, device=device),
                                         requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=compute_dtype, device=device),
                                     requires_grad=False)
        else:
            self.register_parameter("bias", None)

    # ---- weights --------------------------------------------------------------------------------------------
    def load_stored(self, w8: torch.Tensor, scale: torch.Tensor, where: str = "FP8 linear") -> None:
        """Take a stored pair as it is (on its device); a wrong dtype, shape or scale is named in one line."""
        want = (self.out_features, self.in_features)
        if w8.dtype != WEIGHT_DTYPE or tuple(w8.shape) != want:
            raise Fp8FormatError(f"{where}: weight is {w8.dtype} {tuple(w8.shape)}, expected {WEIGHT_DTYPE} {want}")
        if scale.dtype != SCALE_DTYPE or tuple(scale.shape) != (self.out_features,):
            raise Fp8FormatError(f"{where}: weight_scale is {scale.dtype} {tuple(scale.shape)}, expected "
                                 f"{SCALE_DTYPE} ({self.out_features},)")
        if not bool(torch.isfinite(scale).all() & (scale > 0).all()):
            raise Fp8FormatError(f"{where}: weight_scale holds zero, negative or non-finite values; the file is "
                                 "damaged, convert it again")
        self.weight = nn.Parameter(w8, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self._held = None

    def load_float_weight(self, weight: torch.Tensor) -> None:
        """Quantize a float [out, in] weight on its device, from its bf16 value (as every format loads)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise Fp8FormatError(f"float weight of shape {tuple(weight.shape)} for a linear of shape "
                                 f"{(self.out_features, self.in_features)}")
        self.load_stored(*quantize_weight(weight.detach().to(torch.bfloat16)))

    @property
    def is_quantized(self) -> bool:
        return not self.weight.is_meta

    def dequantized_weight(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The [out, in] weight W = w8 * scale in `dtype` (the DiT's float32 regions read this)."""
        return dequantize(self.weight, self.weight_scale, dtype or self.compute_dtype or torch.float32)

    # ---- compute --------------------------------------------------------------------------------------------
    def set_compute(self, mode: str, min_rows: Optional[int] = None, fast_accum: Optional[bool] = None,
                    ops: Optional[dict] = None) -> None:
        """apply_speed's call on every quantized linear: `mode` is for NF4 weights (FP8 weights always run FP8
        GEMMs); the row threshold, fast accumulation and the activation quantizer apply."""
        if min_rows is not None:
            self.lowp_min_rows = int(min_rows)
        if fast_accum is not None:
            self.fp8_fast_accum = bool(fast_accum)
        self._quantize = (ops or {}).get("fp8")
        self._held = None

    def hold_weight(self) -> None:
        """Keep a LoRA-patched, re-quantized weight for all token chunks of a phase (nothing to do without one)."""
        self._held = {}

    def release_weight(self) -> None:
        self._held = None

    def _fp8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        lora = self.lora
        if lora is None or not lora.patches_weight:
            return self.weight, self.weight_scale
        if self._held is not None and "fp8" in self._held:
            return self._held["fp8"]
        prepared = quantize_weight(lora.patch_weight(self.dequantized_weight(torch.float32)))
        if self._held is not None:
            self._held["fp8"] = prepared
        return prepared

    def _fp8_gemm(self, x: torch.Tensor, dtype: torch.dtype) -> bool:
        rows = x.numel() // max(1, x.shape[-1])
        if rows < max(self.lowp_min_rows, 1) or self.in_features % 16 or self.out_features % 16:
            return False  # _scaled_mm needs K and N multiples of 16
        return not x.is_cuda or dtype in (torch.bfloat16, torch.float16)  # the CPU emulation takes any dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_in, inp_dtype = x, x.dtype
        dtype = self.compute_dtype or x.dtype
        x = x if x.dtype == dtype else x.to(dtype)
        bias = self.bias
        if bias is not None and bias.dtype != dtype:
            bias = bias.to(dtype)
        w8, scale = self._fp8_weight()
        if self._fp8_gemm(x, dtype):
            y = fp8.linear(x, w8, scale.view(1, -1), bias, dtype, quantize=self._quantize or fp8.quantize_rows,
                           fast_accum=self.fp8_fast_accum)
        else:
            y = F.linear(x, dequantize(w8, scale, dtype), bias)
        if self.lora is not None:
            y = self.lora.add_terms(x_in, y)
        return y if y.dtype == inp_dtype else y.to(inp_dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 weights, "
                f"compute_dtype={self.compute_dtype}")


def replace_linears_with_fp8(model: nn.Module, num_layers: int, compute_dtype: torch.dtype) -> list[str]:
    """Swap the quantized set of linears (the NF4 set) of a meta-device DiT for empty Fp8Linear shells."""
    return swap_quantized_linears(model, num_layers, lambda old: Fp8Linear(
        old.in_features, old.out_features, bias=old.bias is not None, compute_dtype=compute_dtype))

"""A linear whose weight is stored in low precision (one float32 scale per output channel): `--weights fp8`
(e4m3, `Fp8Linear`) and `--weights int8` (int8, `Int8Linear`), one class that branches on its format's kind.

Unlike `--compute fp8/int8` on NF4 weights, where every forward dequantizes NF4 and re-quantizes the weight
(NF4Linear._prepared), the weight here is quantized once (by the converter, loaders/lowp_writer.py, or while
loading float weights) and the GEMM reads it as it is: `fp8.linear` / `int8.linear` quantize the activation per
token and run `_scaled_mm` (sm89+) / `_int_mm` (sm80+) on the tensor cores; on a CPU, FP8 runs its float32
emulation and INT8 torch's own `_int_mm`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fp8, int8
from .lowp_format import FORMATS, SCALE_DTYPE, LowpFormatError, StoredFormat
from .nf4_format import LOWP_MIN_ROWS, swap_quantized_linears

# kind -> (the weight quantizer, correctly rounded; the per-token activation quantizer)
_QUANTIZERS = {
    "fp8": (lambda w: fp8.quantize_rows(w, exact=True), fp8.quantize_rows),
    "int8": (lambda w: int8.quantize_rows(w, exact=True), int8.quantize_rows),
}


def quantize_weight(w: torch.Tensor, kind: str = "fp8") -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] -> (stored [N, K], float32 scale [N]) with w ~= w8 * scale[:, None], computed in
    float32 from `w` as given: scale = row amax / max value, w / scale rounded once to the kind's dtype."""
    w8, scale = _QUANTIZERS[kind][0](w)
    return w8, scale.view(-1)


def dequantize(w8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w8 * scale per row, rounded once to `dtype` (either kind: both convert to float32 exactly)."""
    return fp8.mul_to(w8.float(), scale.float().view(-1, 1), dtype)


class StoredLowpLinear(nn.Module):
    """y = x W^T + b with W = weight (stored dtype) * weight_scale (per row); created empty on `meta`, filled by
    `load_stored` (a stored pair) or `load_float_weight` (quantized here, bf16 first). `fmt` is the kind's
    table row (quant/lowp_format.FORMATS); the subclasses below only pick it.

    Token-wise GEMMs (at least `lowp_min_rows` rows, dims multiples of 16) run in low precision; the few-row ones
    (time embedding, the 512 text rows) multiply the dequantized weight in the compute dtype, as the NF4 linears
    keep them exact: their activations' rounding error would reach every token. `lora` is the LoRA hook
    (quant.lora.LinearLora): its low-rank terms are added to the output; weight patches (other adapter kinds) are
    applied to the dequantized weight, which is quantized again for the GEMM (once per phase under
    `hold_weight`), the NF4 linears' order of steps.
    """

    fmt: StoredFormat
    lowp_min_rows = LOWP_MIN_ROWS
    fp8_fast_accum = True
    _quantize = None  # the activation quantizer apply_speed picked (Triton row kernel, compiled or eager)
    _rescale = None  # INT8: the int32 -> float rescale apply_speed picked
    _held: Optional[dict] = None
    lora = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 compute_dtype: Optional[torch.dtype] = torch.bfloat16, device="meta"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=self.fmt.weight_dtype,
                                               device=device), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=SCALE_DTYPE, device=device),
                                         requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=compute_dtype, device=device),
                                     requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @property
    def compute_mode(self) -> str:
        """What the GEMMs run in; `set_compute` cannot change it (the weight is stored so)."""
        return self.fmt.kind

    # ---- weights --------------------------------------------------------------------------------------------
    def load_stored(self, w8: torch.Tensor, scale: torch.Tensor, where: str = "") -> None:
        """Take a stored pair as it is (on its device); a wrong dtype, shape or scale is named in one line."""
        where = where or f"{self.fmt.label} linear"
        want, dtype = (self.out_features, self.in_features), self.fmt.weight_dtype
        if w8.dtype != dtype or tuple(w8.shape) != want:
            raise LowpFormatError(f"{where}: weight is {w8.dtype} {tuple(w8.shape)}, expected {dtype} {want}")
        if scale.dtype != SCALE_DTYPE or tuple(scale.shape) != (self.out_features,):
            raise LowpFormatError(f"{where}: weight_scale is {scale.dtype} {tuple(scale.shape)}, expected "
                                  f"{SCALE_DTYPE} ({self.out_features},)")
        if not bool(torch.isfinite(scale).all() & (scale > 0).all()):
            raise LowpFormatError(f"{where}: weight_scale holds zero, negative or non-finite values; the file is "
                                  "damaged, convert it again")
        self.weight = nn.Parameter(w8, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self._held = None

    def load_float_weight(self, weight: torch.Tensor) -> None:
        """Quantize a float [out, in] weight on its device, from its bf16 value (as every format loads)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise LowpFormatError(f"float weight of shape {tuple(weight.shape)} for a linear of shape "
                                  f"{(self.out_features, self.in_features)}")
        self.load_stored(*quantize_weight(weight.detach().to(torch.bfloat16), self.fmt.kind))

    @property
    def is_quantized(self) -> bool:
        return not self.weight.is_meta

    def dequantized_weight(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The [out, in] weight W = w8 * scale in `dtype` (the DiT's float32 regions read this)."""
        return dequantize(self.weight, self.weight_scale, dtype or self.compute_dtype or torch.float32)

    # ---- compute --------------------------------------------------------------------------------------------
    def set_compute(self, mode: str, min_rows: Optional[int] = None, fast_accum: Optional[bool] = None,
                    ops: Optional[dict] = None) -> None:
        """apply_speed's call on every quantized linear: `mode` is for NF4 weights (stored weights always run
        their own GEMMs); the row threshold, FP8 fast accumulation and the kind's activation quantizer apply."""
        if min_rows is not None:
            self.lowp_min_rows = int(min_rows)
        if fast_accum is not None:
            self.fp8_fast_accum = bool(fast_accum)
        ops = ops or {}
        self._quantize = ops.get(self.fmt.kind)
        self._rescale = ops.get("int8_rescale")
        self._held = None

    def hold_weight(self) -> None:
        """Keep a LoRA-patched, re-quantized weight for all token chunks of a phase (nothing to do without one)."""
        self._held = {}

    def release_weight(self) -> None:
        self._held = None

    def _stored_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        lora = self.lora
        if lora is None or not lora.patches_weight:
            return self.weight, self.weight_scale
        if self._held is not None and "patched" in self._held:
            return self._held["patched"]
        prepared = quantize_weight(lora.patch_weight(self.dequantized_weight(torch.float32)), self.fmt.kind)
        if self._held is not None:
            self._held["patched"] = prepared
        return prepared

    def _lowp_gemm(self, x: torch.Tensor, dtype: torch.dtype) -> bool:
        rows = x.numel() // max(1, x.shape[-1])
        if rows < max(self.lowp_min_rows, 1) or self.in_features % 16 or self.out_features % 16:
            return False  # _scaled_mm needs K and N multiples of 16, _int_mm multiples of 8 (and M > 16)
        return not x.is_cuda or dtype in (torch.bfloat16, torch.float16)  # the CPU paths take any dtype

    def _gemm(self, x, w8, scale, bias, dtype) -> torch.Tensor:
        quantize = self._quantize or _QUANTIZERS[self.fmt.kind][1]
        if self.fmt.kind == "fp8":
            return fp8.linear(x, w8, scale.view(1, -1), bias, dtype, quantize=quantize,
                              fast_accum=self.fp8_fast_accum)
        return int8.linear(x, w8, scale.view(1, -1), bias, dtype, quantize=quantize,
                           rescale_fn=self._rescale or int8.rescale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_in, inp_dtype = x, x.dtype
        dtype = self.compute_dtype or x.dtype
        x = x if x.dtype == dtype else x.to(dtype)
        bias = self.bias
        if bias is not None and bias.dtype != dtype:
            bias = bias.to(dtype)
        w8, scale = self._stored_weight()
        if self._lowp_gemm(x, dtype):
            y = self._gemm(x, w8, scale, bias, dtype)
        else:
            y = F.linear(x, dequantize(w8, scale, dtype), bias)
        if self.lora is not None:
            y = self.lora.add_terms(x_in, y)
        return y if y.dtype == inp_dtype else y.to(inp_dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt.kind} "
                f"{self.fmt.weight_dtype} weights, compute_dtype={self.compute_dtype}")


class Fp8Linear(StoredLowpLinear):
    fmt = FORMATS["fp8"]


class Int8Linear(StoredLowpLinear):
    fmt = FORMATS["int8"]


LINEAR_CLASSES = {"fp8": Fp8Linear, "int8": Int8Linear}


def replace_linears_with_lowp(model: nn.Module, num_layers: int, compute_dtype: torch.dtype,
                              kind: str) -> list[str]:
    """Swap the quantized set of linears (the NF4 set) of a meta-device DiT for empty shells of the kind."""
    cls = LINEAR_CLASSES[kind]
    return swap_quantized_linears(model, num_layers, lambda old: cls(
        old.in_features, old.out_features, bias=old.bias is not None, compute_dtype=compute_dtype))

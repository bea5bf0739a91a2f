"""bitsandbytes NF4 linears for the DiT (spec §1.2): the module, the swap on a meta model, (de)serialization.

Community NF4 experts quantize exactly the 569 `nn.Linear` weights of an expert (14 per block + 9 top-level)
with bnb `quantize_4bit(blocksize=64, compress_statistics=True, quant_type="nf4")` of the bf16 weight, and
store each as bnb's packed state (`QuantState.as_dict(packed=True)`):

    <L>.weight                                   uint8 [n/2, 1]   two 4-bit codes per byte
    <L>.weight.absmax                            uint8 [n/64]     8-bit block scales (double quant)
    <L>.weight.quant_map                         f32   [16]       NF4 codebook
    <L>.weight.nested_absmax                     f32   [ceil(n/64/256)]
    <L>.weight.nested_quant_map                  f32   [256]
    <L>.weight.quant_state.bitsandbytes__nf4     uint8 [k]        JSON: quant_type, blocksize, dtype, shape, nested_*

Everything else (conv, biases, norms, modulation) stays a plain tensor. Deserialization is bitsandbytes' own
(`Params4bit.from_prequantized` -> `QuantState.from_dict`); this module only checks the pieces first so a bad
file gives a message that names it.
"""
from __future__ import annotations

import copy
from typing import Callable, Mapping, Optional

import bitsandbytes.functional as bnbf
import torch
import torch.nn as nn
import torch.nn.functional as F
from bitsandbytes.nn import Linear4bit, Params4bit

from . import fp8, fp16acc, int8
from .nf4_format import (  # noqa: F401 - the format's names, re-exported for the callers of this module
    BLOCK_NF4_LINEARS,
    LOWP_MIN_ROWS,
    NESTED_BLOCKSIZE,
    NF4_BLOCKSIZE,
    NF4_COMPONENT_DTYPES,
    NF4_COMPONENTS,
    QUANT_STATE_KEY,
    TOP_LEVEL_NF4_LINEARS,
    NF4FormatError,
    default_compute_dtype,
    nf4_linear_names,
    packed_shapes,
    parse_quant_state_json,
    swap_quantized_linears,
    token_gemm_mode,
)

# Compute paths of the NF4 linears' forward (quant/compute.py picks one per GPU): the dequantized weight in the
# compute dtype (exact), re-quantized per row to FP8 / INT8 for the low-precision tensor cores, or fp16 GEMMs with
# fp16 accumulation (GeForce cards' 2x mode).
COMPUTE_MODES = ("bf16", "fp8", "int8", "fp16acc")


class NF4Linear(Linear4bit):
    """A bnb `Linear4bit` (NF4, double quant) that is created on `meta` and holds no float weight.

    Its weight is filled later by `load_prequantized` (stored NF4 pieces) or `load_float_weight` (quantized on
    the weight's device). forward = two steps: dequantize the weight (`dequantized_weight`, bitsandbytes' kernel,
    also serving the DiT's fp32 regions), then one GEMM in the compute mode (`set_compute`). For FP8 / INT8 GEMMs
    on a GPU the weight's preparation (dequantize, then quantize per row) runs as one kernel where the speed plan
    offers it (`quant/nf4_rows.py`, the same bits), except under a LoRA that patches the weight. Between
    `hold_weight()` and `release_weight()` the prepared weight is kept for all token chunks of a block phase;
    `keep_weight()` keeps the one its token-wise GEMMs use until `drop_kept_weight()` (the memory plan's resident
    weights: no preparation per call at all), and anything that changes the weight drops it.
    `lora` is the LoRA hook (`quant.lora.LinearLora`, set by `quant.lora.attach`): its weight patches go between
    "dequantize" and "GEMM" (every compute mode starts from the patched weight), its low-rank terms are added to
    the output.
    """

    compute_mode = "bf16"
    lowp_min_rows = LOWP_MIN_ROWS
    fp8_fast_accum = True
    _lowp_ops: Optional[dict] = None  # the quantizers apply_speed picked (Triton row kernel, compiled or eager)
    _held: Optional[dict] = None
    _kept: Optional[tuple] = None  # keep_weight's (key, prepared, source): see _kept_for
    lora = None  # quant.lora.LinearLora while a LoRA is attached

    def __init__(self, in_features: int, out_features: int, bias: bool = True, compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__(
            in_features,
            out_features,
            bias=bias,
            compute_dtype=compute_dtype,
            compress_statistics=True,
            quant_type="nf4",
            quant_storage=torch.uint8,
            device="meta",
        )
        # bnb repacks weights for AVX512-BF16 CPUs on the first forward, storing bf16 block scales (lossy) and
        # replacing weight.data; keep the standard layout so dequantized_weight() and forward agree everywhere.
        self.support_avx512bf16_for_cpu = False

    @property
    def is_quantized(self) -> bool:
        return getattr(self.weight, "quant_state", None) is not None and not self.weight.is_meta

    def _set_weight(self, param: Params4bit) -> None:
        self._kept = None  # prepared from the old weight
        self.weight = param
        self.quant_state = param.quant_state

    def _apply(self, fn, recurse=True):
        self._kept = None  # .to() / .cpu() / .half() move or change the weight; the kept copy would stay behind
        return super()._apply(fn, recurse)

    def load_prequantized(self, packed: torch.Tensor, pieces: Mapping[str, torch.Tensor], where: str = "") -> None:
        """Rebuild the weight from its stored pieces (keys as in NF4_COMPONENTS) with bnb's deserialization.

        The tensors should already be on the target device (the JSON blob may stay on the CPU).
        """
        where = where or "NF4 linear"
        missing = [c for c in ("absmax", "quant_map", QUANT_STATE_KEY) if c not in pieces]
        if missing:
            raise NF4FormatError(f"{where}: missing {', '.join('weight.' + m for m in missing)}")
        qs = parse_quant_state_json(pieces[QUANT_STATE_KEY], where)
        nested = "nested_absmax" in pieces or "nested_quant_map" in pieces
        need = {"quant_type", "blocksize", "dtype", "shape"} | ({"nested_blocksize", "nested_dtype", "nested_offset"} if nested else set())
        if not need <= qs.keys():
            raise NF4FormatError(f"{where}: quant_state JSON lacks {sorted(need - qs.keys())}; the file is corrupted")
        if qs["quant_type"] != "nf4":
            raise NF4FormatError(f"{where}: quant_type {qs['quant_type']!r}; only bitsandbytes NF4 is supported")
        if nested and not {"nested_absmax", "nested_quant_map"} <= pieces.keys():
            gone = {"nested_absmax", "nested_quant_map"} - pieces.keys()
            raise NF4FormatError(f"{where}: missing {', '.join('weight.' + m for m in sorted(gone))}")
        want = (self.out_features, self.in_features)
        if tuple(qs["shape"]) != want:
            raise NF4FormatError(f"{where}: stored weight shape {tuple(qs['shape'])} but the model expects {want}")
        if qs["dtype"] not in ("bfloat16", "float16", "float32"):
            raise NF4FormatError(f"{where}: quant_state dtype {qs['dtype']!r}; expected bfloat16/float16/float32")
        shapes = packed_shapes(*qs["shape"], blocksize=int(qs["blocksize"]))
        if not nested:  # single-level stats: float32 absmax, no nested pieces
            shapes = {"": shapes[""], "absmax": shapes["absmax"], "quant_map": (16,)}
        for comp, tensor in [("", packed), *pieces.items()]:
            if comp == QUANT_STATE_KEY:
                continue
            label = "weight" + (f".{comp}" if comp else "")
            want_dtype = torch.float32 if (comp == "absmax" and not nested) else NF4_COMPONENT_DTYPES.get(comp)
            if want_dtype is None:
                raise NF4FormatError(f"{where}: unexpected piece weight.{comp}")
            if tensor.dtype != want_dtype:
                raise NF4FormatError(f"{where}: {label} has dtype {tensor.dtype}, expected {want_dtype}")
            if tuple(tensor.shape) != shapes[comp]:
                raise NF4FormatError(f"{where}: {label} has shape {tuple(tensor.shape)}, expected {shapes[comp]}")
        stats = {k: v for k, v in pieces.items()}
        stats[QUANT_STATE_KEY] = pieces[QUANT_STATE_KEY].cpu()  # bnb parses it on the host
        param = Params4bit.from_prequantized(packed, stats, device=packed.device, module=self)
        self._set_weight(param)

    def load_float_weight(self, weight: torch.Tensor) -> None:
        """Quantize a float [out, in] weight on its own device (bf16 first, like the reference's bf16 load)."""
        want = (self.out_features, self.in_features)
        if tuple(weight.shape) != want:
            raise NF4FormatError(f"float weight of shape {tuple(weight.shape)} for a linear of shape {want}")
        packed, state = quantize_nf4(weight)
        self._set_weight(
            Params4bit(
                packed,
                requires_grad=False,
                quant_state=state,
                blocksize=NF4_BLOCKSIZE,
                compress_statistics=True,
                quant_type="nf4",
                quant_storage=torch.uint8,
                module=self,
                bnb_quantized=True,
            )
        )

    def dequantized_weight(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The [out, in] weight in `dtype`, dequantized by bitsandbytes directly into that dtype.

        That is the weight bnb's own matmul uses for inputs of that dtype (one rounding from the fp32
        `code[nibble] * absmax` product), so forward and this agree.
        """
        if not self.is_quantized:
            raise RuntimeError("NF4Linear has no weight yet: load it first")
        state = self.weight.quant_state
        return dequantize_nf4(self.weight.data, state, dtype or self.compute_dtype or state.dtype)

    # ---- compute ----------------------------------------------------------------------------------------
    def set_compute(self, mode: str, min_rows: Optional[int] = None, fast_accum: Optional[bool] = None,
                    ops: Optional[dict] = None) -> None:
        """mode: "bf16" (the compute dtype, exact), "fp8", "int8" or "fp16acc". ops: compiled quantizers or None."""
        if mode not in COMPUTE_MODES:
            raise ValueError(f"compute mode {mode!r}: choose one of {COMPUTE_MODES}")
        self.compute_mode = mode
        if min_rows is not None:
            self.lowp_min_rows = int(min_rows)
        if fast_accum is not None:
            self.fp8_fast_accum = bool(fast_accum)
        self._lowp_ops = ops
        self._held = None
        self._kept = None

    # ---- the prepared weight kept for good (the memory plan's resident weights) --------------------------------
    def _token_key(self) -> Optional[tuple]:
        """(kind, dtype) the token-wise GEMMs prepare (None: no compute dtype set, so it follows the input)."""
        dtype = self.compute_dtype
        if dtype is None:
            return None
        mode = token_gemm_mode(self.compute_mode, self.out_features, self.in_features,
                               dtype in (torch.bfloat16, torch.float16))
        return _key(mode, dtype)

    def _source(self) -> tuple:
        """What a prepared weight is made from: the stored codes' address and the LoRA hook (compared by identity)."""
        return (self.weight.data.data_ptr(), self.weight.device, self.lora)

    def keep_weight(self) -> int:
        """Prepare the weight the token-wise GEMMs use now (the same tensor `_prepared` makes, so the same output bits)
        and keep it until drop_kept_weight(), set_compute, a new or moved weight, or another LoRA hook; returns its
        bytes (0: nothing to keep). Other GEMMs (few rows, another dtype) prepare theirs per call as before."""
        key = self._token_key()
        if key is None or not self.is_quantized:
            self._kept = None
            return 0
        if self._kept_for(key) is None:
            self._kept = None  # the old one goes before the new one is made
            with torch.no_grad():
                self._kept = (key, self._make(*key), self._source())
        return sum(t.numel() * t.element_size() for t in self.kept_tensors())

    def drop_kept_weight(self) -> None:
        self._kept = None

    def kept_tensors(self) -> list:
        """The kept prepared weight's tensors (empty when none is kept): the CUDA graphs' fingerprint reads them."""
        if self._kept is None:
            return []
        prepared = self._kept[1]
        return list(prepared) if isinstance(prepared, tuple) else [prepared]

    def _kept_for(self, key: tuple):
        kept = self._kept
        if kept is None or kept[0] != key:
            return None
        made_from, now = kept[2], self._source()
        if made_from[:2] != now[:2] or made_from[2] is not now[2]:
            self._kept = None  # the weight or the hook changed without a word (explicit drops cover the known ways)
            return None
        return kept[1]

    def hold_weight(self) -> None:
        """Keep the prepared (dequantized / FP8 / INT8) weight until release_weight()."""
        self._held = {}

    def release_weight(self) -> None:
        self._held = None

    def _prepared(self, kind: str, dtype: torch.dtype):
        key = (kind, dtype)
        if self._kept is not None:
            kept = self._kept_for(key)
            if kept is not None:
                return kept
        return self._held_or(key, lambda: self._make(kind, dtype))

    def _held_or(self, key: tuple, make: Callable[[], object]):
        """What `make` returns, kept under `key` while a hold is on (hold_weight): made once per held phase."""
        if self._held is not None and key in self._held:
            return self._held[key]
        value = make()
        if self._held is not None:
            self._held[key] = value
        return value

    def _make(self, kind: str, dtype: torch.dtype):
        lora = self.lora
        patched = lora is not None and lora.patches_weight
        ops = self._lowp_ops or {}  # the weight quantizers apply_speed picked (one fused kernel where it can)
        # NF4 codes straight to FP8 / INT8 rows in one pass where the kernel runs (quant/nf4_rows.py) ...
        fused = ops.get("nf4_" + kind) if kind in ("fp8", "int8") and not patched else None
        prepared = fused(self.weight.data, self.weight.quant_state, dtype) if fused is not None else None
        if prepared is None:
            # ... else step 1, dequantize: every path starts from this weight, with a LoRA's weight patches
            # applied (in fp32); step 2, quantize it for the low-precision GEMM.
            if patched:
                w = lora.patch_weight(self.dequantized_weight(torch.float32)).to(dtype)
            else:
                w = self.dequantized_weight(dtype)
            prepared = (ops.get("fp8_weight", fp8.quantize_weight)(w) if kind == "fp8"
                        else ops.get("int8_weight", int8.quantize_weight)(w) if kind == "int8" else w)
        return prepared

    def _bias_in(self, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """The bias in the GEMM's dtype; a bias kept in the load dtype (an fp16 model, WanDiT.set_compute_dtype) is
        cast once per held phase, like the weight."""
        bias = self.bias
        if bias is None or bias.dtype == dtype:
            return bias
        return self._held_or(("bias", dtype), lambda: bias.to(dtype))

    def _mode_for(self, x: torch.Tensor, dtype: torch.dtype) -> str:
        rows = x.numel() // max(1, x.shape[-1])
        if rows < max(self.lowp_min_rows, 17):  # _int_mm needs more than 16 rows (cuBLASLt)
            return "bf16"
        return token_gemm_mode(self.compute_mode, self.out_features, self.in_features,
                               dtype in (torch.bfloat16, torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_in = x
        dtype = self.compute_dtype or x.dtype
        inp_dtype = x.dtype
        x = x if x.dtype == dtype else x.to(dtype)
        bias = self._bias_in(dtype)
        # Step 2, one GEMM.
        mode = self._mode_for(x, dtype)
        ops = self._lowp_ops or {}
        if mode == "fp8":
            w8, scale = self._prepared(*_key(mode, dtype))
            y = fp8.linear(x, w8, scale, bias, dtype, quantize=ops.get("fp8", fp8.quantize_rows),
                           fast_accum=self.fp8_fast_accum)
        elif mode == "int8":
            w8, scale = self._prepared(*_key(mode, dtype))
            y = int8.linear(x, w8, scale, bias, dtype, quantize=ops.get("int8", int8.quantize_rows),
                            rescale_fn=ops.get("int8_rescale", int8.rescale))
        elif mode == "fp16acc":
            y = fp16acc.linear(x, self._prepared(*_key(mode, dtype)), bias, dtype)
        else:
            y = F.linear(x, self._prepared(*_key(mode, dtype)), bias)
        if self.lora is not None:  # the low-rank terms and bias difference of a LoRA, added to the output
            y = self.lora.add_terms(x_in, y)
        return y if y.dtype == inp_dtype else y.to(inp_dtype)

    def forward_gelu(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """tanh-GELU(self(x)) with the GELU in the GEMM's epilogue (cuBLASLt: applied to the float32 accumulator
        plus bias, one rounding to bf16 instead of two, no separate pass over the [tokens, 13824] output), or None
        where that does not apply: a CPU, FP8/INT8/fp16acc compute, no bias, or a LoRA that adds terms to the output
        (they go before the GELU)."""
        dtype = self.compute_dtype or x.dtype
        lora = self.lora
        if (not x.is_cuda or self.bias is None or dtype not in (torch.bfloat16, torch.float16)
                or self._mode_for(x, dtype) != "bf16" or (lora is not None and (lora.up is not None
                                                                                or lora.bias is not None))):
            return None
        inp_dtype = x.dtype
        x2 = (x if x.dtype == dtype else x.to(dtype)).reshape(-1, self.in_features)
        y = torch._addmm_activation(self._bias_in(dtype), x2, self._prepared("float", dtype).t(), use_gelu=True)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if y.dtype == inp_dtype else y.to(inp_dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, nf4, "
                f"compute_dtype={self.compute_dtype}, compute={self.compute_mode}")


def _key(mode: str, dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """(kind, dtype) of the prepared weight a GEMM mode multiplies: FP8 / INT8 rows, or a float weight (fp16 for
    fp16acc's fp16-accumulating GEMMs, else the compute dtype)."""
    if mode in ("fp8", "int8"):
        return mode, dtype
    return "float", torch.float16 if mode == "fp16acc" else dtype


def dequantize_nf4(packed: torch.Tensor, state: bnbf.QuantState, dtype: torch.dtype) -> torch.Tensor:
    """bitsandbytes' dequantize of an NF4 weight straight into `dtype` (one rounding from the fp32 product)."""
    if dtype != state.dtype:
        state = copy.copy(state)
        state.dtype = dtype
    return bnbf.dequantize_4bit(packed, state)


def quantize_nf4(weight: torch.Tensor) -> tuple[torch.Tensor, bnbf.QuantState]:
    """bnb NF4 quantization of a float weight on its device, from its bf16 value (spec §1.2 recipe)."""
    return bnbf.quantize_4bit(
        weight.detach().to(torch.bfloat16).contiguous(),
        blocksize=NF4_BLOCKSIZE,
        compress_statistics=True,
        quant_type="nf4",
    )


def serialize_nf4(prefix: str, packed: torch.Tensor, state: bnbf.QuantState) -> dict[str, torch.Tensor]:
    """Stored pieces of one linear (keys "<prefix>.weight[.component]") via bnb's packed serialization."""
    out = {f"{prefix}.weight": packed}
    for k, v in state.as_dict(packed=True).items():
        out[f"{prefix}.weight.{k}"] = v
    return out


def replace_linears_with_nf4(model: nn.Module, num_layers: int, compute_dtype: torch.dtype) -> list[str]:
    """Swap the 569-style set of linears of a meta-device DiT for empty NF4Linear shells; returns their names."""
    return swap_quantized_linears(model, num_layers, lambda old: NF4Linear(
        old.in_features, old.out_features, bias=old.bias is not None, compute_dtype=compute_dtype))

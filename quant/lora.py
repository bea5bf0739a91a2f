"""LoRA on the DiT's linears without a float copy of the expert: applied on the fly, or merged once into NF4.

One hook per linear, the module attribute `lora` (a `LinearLora`), read in three places:
- `NF4Linear.forward` (and `StoredLowpLinear.forward`, stored FP8 / INT8 weights): the low-rank terms are added to the output of
  the quantized GEMM, `y = x W_nf4^T + b + sum_i s_i (x A_i^T) B_i^T` (A = down [r, in], B = up [out, r],
  s = strength * alpha / r); weight patches (any other adapter kind) patch the dequantized weight between
  "dequantize" and "GEMM" (FP8: the patched weight is quantized to FP8 again for the GEMM);
- `wan.dit.blocks.linear_fp32` (time embedding, head): the merged float32 weight `W + sum s_i B_i A_i`;
- plain `nn.Linear` (bf16 weight mode): the same terms through a forward hook (`attach`).

The low-rank terms of several LoRAs on one linear are fused into one pair of GEMMs (`[A_1; A_2]`, `[s_1 B_1, s_2 B_2]`),
so stacking LoRAs costs one extra pair of thin GEMMs per linear, not one per LoRA. A strength of 0 adds nothing
(the term is dropped, so the output is bit-identical to no LoRA).

On-the-fly vs merged: the on-the-fly output is the NF4 base plus the *exact* low-rank term; "merge" re-quantizes
`W + dW` to NF4 (FP8 weights: to FP8 per output channel) once (no per-step cost, but the LoRA's contribution is
rounded too, and removing the LoRA means reloading the expert).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lowp_linear import StoredLowpLinear
from .nf4 import NF4Linear

QUANTIZED = (NF4Linear, StoredLowpLinear)  # linears that read `lora` in their own forward (no hook)

WeightPatch = Callable[[torch.Tensor], torch.Tensor]  # float32 weight -> patched float32 weight (same shape)


@dataclass(frozen=True)
class LowRank:
    """One LoRA on one linear: `dW = scale * up @ down`, up [out, rank], down [rank, in]."""

    up: torch.Tensor
    down: torch.Tensor
    scale: float

    def __post_init__(self):
        if self.up.dim() != 2 or self.down.dim() != 2 or self.up.shape[1] != self.down.shape[0]:
            raise ValueError(f"LoRA up {tuple(self.up.shape)} and down {tuple(self.down.shape)} do not form a "
                             f"low-rank pair ([out, r] and [r, in])")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.up.shape[0], self.down.shape[1])

    @property
    def rank(self) -> int:
        return self.down.shape[0]


def lora_scale(strength: float, alpha: Optional[float], rank: int) -> float:
    """Kohya/PEFT convention: the stored alpha divides by the rank; no alpha means a scale of 1."""
    return float(strength) * (float(alpha) / rank if alpha is not None else 1.0)


class LinearLora:
    """Everything attached to one linear: fused low-rank terms and/or patches of the dequantized weight.

    `to(device, dtype)` puts the low-rank factors where the linear computes (bf16 on GPUs); weight patches run in
    float32 on the weight's device.
    """

    def __init__(self, low_rank: Sequence[LowRank] = (), weight_patches: Sequence[WeightPatch] = (),
                 bias: Optional[torch.Tensor] = None):
        terms = [t for t in low_rank if t.scale != 0.0]
        shapes = {t.shape for t in terms}
        if len(shapes) > 1:
            raise ValueError(f"LoRA terms of different shapes on one linear: {sorted(shapes)}")
        self.terms = terms
        self.weight_patches = list(weight_patches)
        self.bias = None if bias is None else bias.float()  # [out] added to the output (a bias difference)
        self.down: Optional[torch.Tensor] = None  # [sum r, in]
        self.up: Optional[torch.Tensor] = None  # [out, sum r], scales folded in
        if terms:
            self.down = torch.cat([t.down.float() for t in terms], dim=0)
            self.up = torch.cat([t.up.float() * t.scale for t in terms], dim=1)

    @property
    def empty(self) -> bool:
        return self.up is None and not self.weight_patches and self.bias is None

    @property
    def patches_weight(self) -> bool:
        return bool(self.weight_patches)

    @property
    def rank(self) -> int:
        return 0 if self.down is None else self.down.shape[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.up, self.down, self.bias) if t is not None)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "LinearLora":
        if self.up is not None:
            self.up = self.up.to(device=device, dtype=dtype)
            self.down = self.down.to(device=device, dtype=dtype)
        if self.bias is not None:
            self.bias = self.bias.to(device=device)  # float32: added once per output element
        return self

    def add_terms(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out + x A^T B^T (all terms at once, in the dtype of the factors) + the bias difference."""
        if self.up is not None:
            h = F.linear(x.to(self.down.dtype), self.down)
            out = out + F.linear(h, self.up).to(out.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def linear_fp32(self, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """The whole linear in float32 (the DiT's fp32 regions): patched weight, then the low-rank terms."""
        out = F.linear(x.float(), self.patch_weight(w.float()), bias)
        if self.up is not None:
            out = out + F.linear(F.linear(x.float(), self.down.float()), self.up.float())
        if self.bias is not None:
            out = out + self.bias.float()
        return out

    def patch_weight(self, w: torch.Tensor) -> torch.Tensor:
        """Apply the weight patches in order to a float32 weight (not the low-rank terms); `w` is not modified."""
        if self.weight_patches:
            w = w.clone()  # patches may work in place (ComfyUI's calculate_weight does)
        for patch in self.weight_patches:
            w = patch(w)
        return w

    def merged_weight(self, w: torch.Tensor) -> torch.Tensor:
        """The float32 weight with every patch and low-rank term merged in (fp32 paths, merge-and-requantize)."""
        w = self.patch_weight(w.float())
        if self.up is not None:
            w = w + self.up.float() @ self.down.float().to(w.device)
        return w

    def merged_bias(self, b: Optional[torch.Tensor], out_features: int) -> Optional[torch.Tensor]:
        if self.bias is None:
            return b
        base = b.float() if b is not None else torch.zeros(out_features, device=self.bias.device)
        return base + self.bias.to(base.device)


def _plain_linear_hook(module: nn.Linear, inputs, output):
    lora: LinearLora = module.lora
    x = inputs[0]
    if lora.patches_weight:
        w = lora.patch_weight(module.weight.float()).to(x.dtype)
        output = F.linear(x, w, None if module.bias is None else module.bias.to(x.dtype))
    return lora.add_terms(x, output)


def attach(module: nn.Module, lora: LinearLora) -> None:
    """Hang `lora` on one linear (NF4Linear / the stored FP8 / INT8 linears read it in forward; a plain nn.Linear gets a forward hook)."""
    detach(module)
    if not isinstance(module, (*QUANTIZED, nn.Linear)):
        raise TypeError(f"LoRA can only be attached to a linear layer, not {type(module).__name__}")
    module.lora = lora
    if not isinstance(module, QUANTIZED):
        module._lora_hook = module.register_forward_hook(_plain_linear_hook)


def detach(module: nn.Module) -> None:
    handle = module.__dict__.pop("_lora_hook", None)
    if handle is not None:
        handle.remove()
    module.__dict__.pop("lora", None)
    _drop_kept(module)


def _drop_kept(module: nn.Module) -> None:
    """A prepared weight kept for good (NF4Linear.keep_weight) was made under the old hook's weight patches."""
    drop = getattr(module, "drop_kept_weight", None)
    if drop is not None:
        drop()


def merge(module: nn.Module, lora: LinearLora) -> None:
    """Merge a LoRA into the linear's weight for good: NF4 / FP8 are re-quantized from `W + dW` (bf16 first, like
    every quantized weight of the pack), a plain weight is replaced in its own dtype."""
    if isinstance(module, QUANTIZED):
        module.load_float_weight(lora.merged_weight(module.dequantized_weight(torch.float32)))
    elif isinstance(module, nn.Linear):
        w = module.weight
        module._parameters["weight"] = nn.Parameter(lora.merged_weight(w.data).to(w.dtype), requires_grad=False)
    else:
        raise TypeError(f"LoRA can only be merged into a linear layer, not {type(module).__name__}")
    if lora.bias is not None:
        dtype = module.bias.dtype if module.bias is not None else torch.float32
        module.bias = nn.Parameter(lora.merged_bias(module.bias, module.out_features).to(dtype), requires_grad=False)


class AppliedLora:
    """What `apply_lora` changed on a model, so `remove()` can undo it (hooks dropped, plain tensors restored)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.hooked: list[str] = []
        self.merged: list[str] = []
        self.originals: dict[str, torch.Tensor] = {}  # param key -> its data before patching
        self.nbytes = 0

    def remove(self) -> None:
        for name in self.hooked:
            detach(self.model.get_submodule(name))
        for key, value in self.originals.items():
            mod_name, _, pname = key.rpartition(".")
            mod = self.model.get_submodule(mod_name) if mod_name else self.model
            mod._parameters[pname].data = value
        self.hooked, self.originals, self.nbytes = [], {}, 0
        # merged weights cannot be taken out again: the caller reloads the expert (`needs_reload`)

    @property
    def needs_reload(self) -> bool:
        return bool(self.merged)


def apply_lora(
    model: nn.Module,
    linears: Mapping[str, LinearLora],
    params: Optional[Mapping[str, WeightPatch]] = None,
    merge_linears: bool = False,
    dtype: Optional[torch.dtype] = None,
    device: Optional[torch.device] = None,
) -> AppliedLora:
    """Put LoRAs on a loaded model.

    linears: module name (e.g. "blocks.0.self_attn.q") -> LinearLora; their factors move to the linear's device in
    `dtype` (default: the model's compute dtype) — or to `device` when given (block swap: a streamed block's
    weights sit in host memory but it computes on the GPU). params: parameter key (e.g. "blocks.0.norm3.weight",
    "head.head.bias") -> patch of that plain tensor, applied once now (the parameter keeps its identity, only its
    data changes, so pinned/parked copies stay valid; the original data is kept for `remove`).
    merge_linears: merge the linears' LoRAs into their weights instead of hooking them.
    """
    applied = AppliedLora(model)
    compute = dtype or getattr(model, "compute_dtype", None)
    try:
        for name, lora in linears.items():
            if lora.empty:
                continue
            mod = model.get_submodule(name)
            if merge_linears:
                merge(mod, lora.to(mod.weight.device))
                applied.merged.append(name)
                continue
            attach(mod, lora.to(device or mod.weight.device, compute or torch.float32))
            applied.hooked.append(name)
            applied.nbytes += lora.nbytes()
        for key, patch in (params or {}).items():
            mod_name, _, pname = key.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            old = mod._parameters.get(pname)
            if old is None or isinstance(mod, QUANTIZED) and pname in ("weight", "weight_scale"):
                raise KeyError(f"{key} is not a plain parameter of this model")
            new = patch(old.data.to(torch.float32, copy=True)).to(old.dtype)
            if tuple(new.shape) != tuple(old.shape):
                raise ValueError(f"patch of {key} changed its shape {tuple(old.shape)} -> {tuple(new.shape)}")
            applied.originals[key] = old.data
            old.data = new
    except BaseException:
        applied.remove()
        raise
    return applied


"""LoRA files -> the DiT weights they change: key formats, alpha/rank, shape checks, a report of what matched.

Only `.safetensors` is read (a `.pt`/`.ckpt`/`.bin` LoRA is a pickle and is refused). Key formats seen for Wan
LoRAs, all mapped to the released key names of the DiT (`blocks.0.self_attn.q`, ...):

    diffusion_model.blocks.0.self_attn.q.lora_A.weight / .lora_B.weight      ComfyUI (also lora_down/lora_up, .alpha)
    transformer.blocks.0.attn1.to_q.lora_A.weight                           diffusers / PEFT (diffusers module names)
    lora_unet_blocks_0_self_attn_q.lora_down.weight, ...alpha               kohya / musubi-tuner (dots as underscores)
    diffusion_model.blocks.0.norm3.diff, diffusion_model.head.head.diff_b    full differences of plain tensors

Scaling follows kohya/PEFT: `dW = strength * (alpha / rank) * up @ down` (no alpha: `strength * up @ down`).
A LoRA whose shapes do not fit is refused naming the first key and both shapes; one whose keys match nothing is
refused; a partial match is reported (how many modules matched, which did not), never silently ignored.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Union

import torch

from ..quant.lora import LinearLora, LowRank, WeightPatch, lora_scale
from ..wan.dit.model import DiTConfig, WanDiT

PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".pkl")
PREFIXES = ("model.diffusion_model.", "diffusion_model.", "base_model.model.", "transformer.", "unet.")
UNDERSCORE_PREFIXES = ("lora_unet__", "lora_unet_", "lora_transformer_", "lycoris_")
UP_SUFFIXES = (".lora_up.weight", ".lora_B.weight", ".lora.up.weight", ".lora_B.default.weight", "_lora.up.weight",
               ".lora_linear_layer.up.weight")
DOWN_SUFFIXES = (".lora_down.weight", ".lora_A.weight", ".lora.down.weight", ".lora_A.default.weight",
                 "_lora.down.weight", ".lora_linear_layer.down.weight")
# Adapter kinds this parser does not turn into low-rank terms; ComfyUI's own LoRA loader handles them.
UNSUPPORTED = {".dora_scale": "DoRA", ".hada_w1_a": "LoHa", ".hada_w1_b": "LoHa", ".lokr_w1": "LoKr",
               ".lokr_w1_a": "LoKr", ".lora_mid.weight": "LoCon (mid)", ".oft_blocks": "OFT", ".oft_R.weight": "OFT",
               ".w_norm": "norm diff", ".set_weight": "set", ".reshape_weight": "reshape"}

# diffusers WanTransformer3DModel module names -> released (and this DiT's) module names; first match wins.
_DIFFUSERS_RULES: tuple[tuple[str, str], ...] = (
    (r"condition_embedder\.text_embedder\.linear_1", "text_embedding.0"),
    (r"condition_embedder\.text_embedder\.linear_2", "text_embedding.2"),
    (r"condition_embedder\.time_embedder\.linear_1", "time_embedding.0"),
    (r"condition_embedder\.time_embedder\.linear_2", "time_embedding.2"),
    (r"condition_embedder\.time_proj", "time_projection.1"),
    (r"blocks\.(\d+)\.attn1\.to_([qkv])", r"blocks.\1.self_attn.\2"),
    (r"blocks\.(\d+)\.attn1\.to_out\.0", r"blocks.\1.self_attn.o"),
    (r"blocks\.(\d+)\.attn1\.(norm_[qk])", r"blocks.\1.self_attn.\2"),
    (r"blocks\.(\d+)\.attn2\.to_([qkv])", r"blocks.\1.cross_attn.\2"),
    (r"blocks\.(\d+)\.attn2\.to_out\.0", r"blocks.\1.cross_attn.o"),
    (r"blocks\.(\d+)\.attn2\.(norm_[qk])", r"blocks.\1.cross_attn.\2"),
    (r"blocks\.(\d+)\.norm2", r"blocks.\1.norm3"),  # diffusers' affine norm before cross-attention
    (r"blocks\.(\d+)\.ffn\.net\.0\.proj", r"blocks.\1.ffn.0"),
    (r"blocks\.(\d+)\.ffn\.net\.2", r"blocks.\1.ffn.2"),
    (r"proj_out", "head.head"),
)


class LoraFileError(ValueError):
    """A LoRA file that cannot be used: not safetensors, unreadable, for another model, or an unknown format."""


@dataclass
class LoraWeight:
    """What a LoRA does to one DiT tensor: a low-rank pair (up, down, alpha) or a full difference."""

    target: str  # released key, e.g. "blocks.0.self_attn.q.weight" or "head.head.bias"
    file_key: str  # the module's name in the file (for messages)
    up: Optional[torch.Tensor] = None  # [out, r] (or [out, r, 1, ...] for a conv)
    down: Optional[torch.Tensor] = None  # [r, in] (or [r, in, k...])
    alpha: Optional[float] = None
    diff: Optional[torch.Tensor] = None

    @property
    def low_rank(self) -> bool:
        return self.up is not None

    @property
    def rank(self) -> int:
        return self.down.shape[0] if self.down is not None else 0


@dataclass
class LoraSet:
    """A parsed LoRA file: the weights it changes, and a report of how its keys matched."""

    source: str
    weights: dict[str, LoraWeight]  # target key -> what changes
    formats: list[str]
    modules: int  # LoRA modules in the file
    unmatched: list[str] = field(default_factory=list)  # file module names that name no DiT tensor

    @property
    def matched(self) -> int:
        return self.modules - len(self.unmatched)

    def report(self) -> str:
        fmt = "/".join(self.formats) or "unknown"
        ranks = sorted({w.rank for w in self.weights.values() if w.low_rank})
        rank_txt = f", rank {ranks[0]}" if len(ranks) == 1 else (f", ranks {ranks[0]}-{ranks[-1]}" if ranks else "")
        text = f"{self.source}: {self.matched} of {self.modules} LoRA modules matched the DiT ({fmt} keys{rank_txt})"
        if self.unmatched:
            shown = ", ".join(self.unmatched[:5]) + (" ..." if len(self.unmatched) > 5 else "")
            text += f"; {len(self.unmatched)} did not match and are ignored: {shown}"
        return text


# ---- reading -------------------------------------------------------------------------------------------------
def read_lora_file(path: Union[str, Path]) -> dict[str, torch.Tensor]:
    """All tensors of a `.safetensors` LoRA on the CPU. Pickle-based files are refused, never unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise LoraFileError(f"{p.name}: {p.suffix} LoRA files are Python pickles and are not loaded (they can run "
                            f"code); use the .safetensors version of this LoRA")
    if p.suffix.lower() != ".safetensors":
        raise LoraFileError(f"{p.name}: not a .safetensors file; LoRAs are read from .safetensors only")
    if not p.is_file():
        raise LoraFileError(f"LoRA file not found: {p}")
    try:
        return load_file(str(p), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise LoraFileError(f"{p.name}: not a readable safetensors file ({e})") from None


# ---- key names -----------------------------------------------------------------------------------------------
def dit_weight_shapes(cfg: DiTConfig) -> dict[str, tuple[int, ...]]:
    """Released key -> shape of every tensor of a DiT with this config (float shapes; NF4 storage aside)."""
    return {k: tuple(p.shape) for k, p in WanDiT(cfg, device="meta").named_parameters()}


def _diffusers_to_released(name: str) -> Optional[str]:
    for pattern, template in _DIFFUSERS_RULES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, template, name)
    return None


class KeyResolver:
    """File module names (any supported format) -> released module names of a DiT with these tensors."""

    def __init__(self, shapes: Mapping[str, Sequence[int]]):
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self.modules = {k.rpartition(".")[0] for k in self.shapes if k.endswith((".weight", ".bias"))}
        self.modules |= {k for k in self.shapes if not k.endswith((".weight", ".bias"))}  # e.g. blocks.0.modulation
        self.underscored = {m.replace(".", "_"): m for m in self.modules}

    def resolve(self, raw: str) -> tuple[Optional[str], str]:
        """(released module name or None, format label)."""
        for prefix in UNDERSCORE_PREFIXES:
            if raw.startswith(prefix):
                name = raw[len(prefix):]
                hit = self.underscored.get(name)
                if hit is None:  # kohya-style names of diffusers modules
                    hit = self._from_underscored_diffusers(name)
                return hit, "kohya"
        label = "plain"
        name = raw
        for prefix in PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                label = "diffusers" if prefix == "transformer." else ("peft" if prefix == "base_model.model." else "ComfyUI")
                break
        if name in self.modules:
            return name, label
        alt = _diffusers_to_released(name)
        if alt is not None and alt in self.modules:
            return alt, "diffusers"
        return None, label

    def _from_underscored_diffusers(self, name: str) -> Optional[str]:
        m = re.fullmatch(r"blocks_(\d+)_(.+)", name)
        if m:
            rest = m.group(2)
            for dotted in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                           "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2", "norm2"):
                if rest == dotted.replace(".", "_"):
                    alt = _diffusers_to_released(f"blocks.{m.group(1)}.{dotted}")
                    return alt if alt in self.modules else None
            return None
        for dotted in ("condition_embedder.text_embedder.linear_1", "condition_embedder.text_embedder.linear_2",
                       "condition_embedder.time_embedder.linear_1", "condition_embedder.time_embedder.linear_2",
                       "condition_embedder.time_proj", "proj_out"):
            if name == dotted.replace(".", "_"):
                return _diffusers_to_released(dotted)
        return None


def _split_key(key: str) -> tuple[Optional[str], Optional[str]]:
    """(module, part) with part one of up/down/alpha/diff/diff_b, or (None, None) for an unknown key."""
    for suffix in UP_SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], "up"
    for suffix in DOWN_SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], "down"
    for suffix, part in ((".alpha", "alpha"), (".diff_b", "diff_b"), (".diff", "diff")):
        if key.endswith(suffix):
            return key[: -len(suffix)], part
    return None, None


def _unsupported_kind(key: str) -> Optional[str]:
    for marker, kind in UNSUPPORTED.items():
        if key.endswith(marker) or marker + "." in key:
            return kind
    return None


# ---- parsing -------------------------------------------------------------------------------------------------
def parse_lora(sd: Mapping[str, torch.Tensor], shapes: Mapping[str, Sequence[int]], source: str = "LoRA") -> LoraSet:
    """Match a LoRA state dict against a DiT's tensor shapes (`dit_weight_shapes`)."""
    resolver = KeyResolver(shapes)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    unknown: list[str] = []
    for key in sd:
        kind = _unsupported_kind(key)
        if kind is not None:
            raise LoraFileError(f"{source}: {key} is a {kind} adapter, which LingBot's LoRA loader does not apply; "
                                f"in ComfyUI load this file with the native LoraLoaderModelOnly instead")
        module, part = _split_key(key)
        if module is None:
            unknown.append(key)
            continue
        groups.setdefault(module, {})[part] = sd[key]
    if not groups:
        first = next(iter(sd), None)
        raise LoraFileError(f"{source}: no LoRA weights found (no lora_up/lora_down, lora_A/lora_B or diff keys"
                            + (f"; first key {first!r})" if first else "; the file is empty)"))

    weights: dict[str, LoraWeight] = {}
    unmatched: list[str] = []
    formats: list[str] = []
    for raw, parts in groups.items():
        module, label = resolver.resolve(raw)
        if label not in formats:
            formats.append(label)
        if module is None:
            unmatched.append(raw)
            continue
        if ("up" in parts) != ("down" in parts):
            have, miss = ("up", "down") if "up" in parts else ("down", "up")
            raise LoraFileError(f"{source}: {raw} has a LoRA {have} weight but no {miss} weight; the file is incomplete")
        if "up" in parts:
            _add(weights, _low_rank(raw, module, parts, resolver.shapes, source))
        for part, pname in (("diff", "weight"), ("diff_b", "bias")):
            if part in parts:
                _add(weights, _difference(raw, module, pname, parts[part], resolver.shapes, source))
    if not weights:
        raise LoraFileError(
            f"{source}: none of its {len(groups)} LoRA modules match the LingBot-World DiT (first: {next(iter(groups))!r}); "
            f"is it a LoRA for another model? LingBot-World takes Wan 2.1/2.2 14B LoRAs")
    for w in weights.values():
        _check_finite(w, source)
    return LoraSet(source, weights, formats, len(groups), unmatched + unknown)


def _check_finite(w: LoraWeight, source: str) -> None:
    """A NaN or infinite value would turn every frame black; named here, before any model loads."""
    for name, t in (("up", w.up), ("down", w.down), ("diff", w.diff)):
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise LoraFileError(f"{source}: {w.file_key} ({name}) holds {bad} NaN or infinite value(s); the file is "
                                "damaged: download it again")
    if w.alpha is not None and not math.isfinite(w.alpha):
        raise LoraFileError(f"{source}: {w.file_key} has alpha {w.alpha}; the file is damaged: download it again")


def _add(weights: dict[str, LoraWeight], w: LoraWeight) -> None:
    if w.target in weights:
        raise LoraFileError(f"two entries of the LoRA change {w.target} ({weights[w.target].file_key} and {w.file_key})")
    weights[w.target] = w


def _low_rank(raw: str, module: str, parts: dict, shapes: Mapping[str, tuple], source: str) -> LoraWeight:
    target = f"{module}.weight"
    want = shapes.get(target)
    up, down = parts["up"], parts["down"]
    if want is None:
        raise LoraFileError(f"{source}: {raw} is a low-rank LoRA but {module} has no weight matrix")
    rank = down.shape[0] if down.dim() >= 2 else -1
    ok = (up.dim() >= 2 and down.dim() >= 2 and up.shape[1] == rank and up.shape[0] == want[0]
          and math.prod(up.shape[2:]) == 1 and math.prod(down.shape[1:]) == math.prod(want[1:]))
    if not ok:
        raise LoraFileError(
            f"{source}: {raw} does not fit this model: LoRA up {tuple(up.shape)} x down {tuple(down.shape)} vs "
            f"{target} {tuple(want)}. This LoRA was made for another model (LingBot-World takes LoRAs of the "
            f"Wan 2.1/2.2 14B DiT)")
    alpha = parts.get("alpha")
    alpha = float(alpha.float().reshape(-1)[0]) if alpha is not None else None
    return LoraWeight(target, raw, up=up, down=down, alpha=alpha)


def _difference(raw: str, module: str, pname: str, diff: torch.Tensor, shapes: Mapping[str, tuple],
                source: str) -> LoraWeight:
    target = f"{module}.{pname}" if f"{module}.{pname}" in shapes else module  # e.g. blocks.0.modulation
    want = shapes.get(target)
    if want is None:
        raise LoraFileError(f"{source}: {raw} carries a {pname} difference but {module} has no {pname}")
    if tuple(diff.shape) != tuple(want):
        raise LoraFileError(f"{source}: {raw}.{'diff_b' if pname == 'bias' else 'diff'} has shape {tuple(diff.shape)} "
                            f"but {target} is {tuple(want)}; this LoRA was made for another model")
    return LoraWeight(target, raw, diff=diff)


def load_lora(path: Union[str, Path], shapes: Mapping[str, Sequence[int]]) -> LoraSet:
    """Read and match one LoRA file (see `parse_lora`)."""
    return parse_lora(read_lora_file(path), shapes, Path(path).name)


# ---- to the model's hooks (CLI / no ComfyUI) ---------------------------------------------------------------------
def _plain_patch(w: LoraWeight, strength: float) -> WeightPatch:
    if w.low_rank:
        scale = lora_scale(strength, w.alpha, w.rank)
        up, down = w.up, w.down

        def patch(t: torch.Tensor) -> torch.Tensor:
            return t + scale * (up.flatten(1).float().to(t.device) @ down.flatten(1).float().to(t.device)).reshape(t.shape)
    else:
        diff = w.diff

        def patch(t: torch.Tensor) -> torch.Tensor:
            return t + strength * diff.float().to(t.device)
    return patch


def lora_hooks(loras: Iterable[tuple[LoraSet, float]], linear_names: Iterable[str],
               ) -> tuple[dict[str, LinearLora], dict[str, WeightPatch]]:
    """Several LoRAs with their strengths -> per-linear hooks and patches of plain tensors (`quant.lora.apply_lora`).

    Low-rank weights of the linears become fused low-rank terms, bias differences of the linears an output term
    of the same hook, full differences of a linear's weight weight patches; every other tensor (norms, modulation,
    the patch conv) gets a plain patch.
    """
    linears = set(linear_names)
    terms: dict[str, list[LowRank]] = {}
    weight_patches: dict[str, list[WeightPatch]] = {}
    biases: dict[str, torch.Tensor] = {}
    plain: dict[str, list[WeightPatch]] = {}
    for lora, strength in loras:
        if strength == 0:
            continue
        for target, w in lora.weights.items():
            module, _, pname = target.rpartition(".")
            if pname == "weight" and module in linears:
                if w.low_rank and w.up.dim() == 2 and w.down.dim() == 2:
                    terms.setdefault(module, []).append(LowRank(w.up, w.down, lora_scale(strength, w.alpha, w.rank)))
                else:
                    weight_patches.setdefault(module, []).append(_plain_patch(w, strength))
            elif pname == "bias" and module in linears and not w.low_rank:
                biases[module] = biases.get(module, 0) + strength * w.diff.float()  # an output term of the hook
            else:
                plain.setdefault(target, []).append(_plain_patch(w, strength))
    hooks = {m: LinearLora(terms.get(m, ()), weight_patches.get(m, ()), biases.get(m))
             for m in set(terms) | set(weight_patches) | set(biases)}
    return hooks, {k: _chain(v) for k, v in plain.items()}


def _chain(patches: Sequence[WeightPatch]) -> WeightPatch:
    if len(patches) == 1:
        return patches[0]

    def run(t: torch.Tensor) -> torch.Tensor:
        for p in patches:
            t = p(t)
        return t
    return run


"""Which kind of DiT expert is on disk, decided from keys and metadata (not file names), and its config.

Kinds:
- "nf4_community":   `*_bnb_nf4/` folder: model.safetensors (bnb packed NF4) + config.json (+ quantization_meta.json)
- "nf4_pt":          the older `model.pt` variant (read with torch.load(weights_only=True, mmap=True) only)
- "official_sharded": a sharded float folder (fp32/bf16), any of the releases' layouts:
                     v1: `diffusion_pytorch_model*.safetensors` [+ `diffusion_pytorch_model.safetensors.index.json`];
                     v2: `model-0000k-of-0000N.safetensors` + `model.safetensors.index.json` (the 14B's
                     `transformers/` with config.json, the 1.3B's flat folder without one), or those shards alone.
                     A v2 download root is read through its `transformers/` subfolder.
- "single_file_nf4" / "single_file_plain": one .safetensors file (ComfyUI's diffusion_models folder)
- "fp8" / "single_file_fp8", "int8" / "single_file_int8": stored FP8 or INT8 weights (quant/lowp_format.py) from
                     `lingbot-world convert-fp8` / `convert-int8`, a folder (model.safetensors + config.json +
                     quantization_meta.json) or one .safetensors file

The config (config.json, safetensors metadata or tensor shapes; the control width from the weights) and
the errors are expert_config.py's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

from ..wan.control.control_kind import MODEL_NAMES
from ..wan.dit.model import DiTConfig
from ..quant.lowp_format import FORMATS, LowpFormatError, stored_kind
from ..quant.nf4_format import QUANT_STATE_KEY
from .expert_config import ExpertLoadError, ExpertNotFoundError, _resolve_config, describe_foreign
from .expert_config import infer_config  # noqa: F401  (importers of expert_format's config inference)
from .safetensors_stream import SafetensorsHeader, read_header
from .shard_layout import (OFFICIAL_INDEX, OFFICIAL_SINGLE, SHARD_INDEX, V2_DIT_SUBFOLDER, IncompleteShards,
                           is_sharded_folder, shard_index, shard_set)

# stored low-precision kinds: folder kind (the weights mode's name) and single-file kind -> weights mode
LOWP_KINDS = {**{k: k for k in FORMATS}, **{f"single_file_{k}": k for k in FORMATS}}
KINDS = ("nf4_community", "nf4_pt", "official_sharded", "single_file_nf4", "single_file_plain", *LOWP_KINDS)
KEY_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.")


@dataclass(frozen=True)
class ExpertFormat:
    kind: str
    path: Path
    files: tuple[Path, ...]
    config: DiTConfig
    config_source: str
    quant_meta: Optional[dict] = None
    key_prefix: str = ""
    headers: Mapping[Path, SafetensorsHeader] = field(default_factory=dict, repr=False, compare=False)

    @property
    def quantized(self) -> bool:
        return self.kind in ("nf4_community", "nf4_pt", "single_file_nf4") or self.kind in LOWP_KINDS

    @property
    def weights(self) -> str:
        """How the linears are stored: "nf4", "fp8", "int8" or "float"."""
        return LOWP_KINDS.get(self.kind) or ("nf4" if self.quantized else "float")

    @property
    def file_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "files": [str(p) for p in self.files],
            "config": self.config.to_json(),
            "config_source": self.config_source,
            "key_prefix": self.key_prefix,
            "file_bytes": self.file_bytes,
        }


# ---- what is this? ----------------------------------------------------------------------------------------
def _strip_prefix(keys: Sequence[str]) -> str:
    if "patch_embedding.weight" in keys:
        return ""
    for p in KEY_PREFIXES:
        if p + "patch_embedding.weight" in keys:
            return p
    return ""


def is_nf4_keyset(keys) -> bool:
    return any(k.endswith(".weight." + QUANT_STATE_KEY) for k in keys)


def check_control_pair(high: ExpertFormat, low: ExpertFormat) -> str:
    """The control kind ('camera' or 'act') both experts share; refuses a Cam expert paired with an Act one."""
    a, b = high.config.control_kind, low.config.control_kind
    if a != b:
        raise ExpertLoadError(
            f"the high-noise expert {high.path} is {MODEL_NAMES[a]} but the low-noise expert {low.path} is "
            f"{MODEL_NAMES[b]}; take both experts from the same download"
        )
    return a


# ---- pickles ------------------------------------------------------------------------------------------------
def load_pt_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A torch pickle of plain tensors, memory-mapped; anything needing code execution is refused."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        raise ExpertLoadError(f"{path}: not a readable torch zip checkpoint ({e}); re-save it with torch.save") from None
    except Exception as e:  # weights_only refusals are pickle.UnpicklingError (no pickle import needed here)
        if type(e).__name__ != "UnpicklingError":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExpertLoadError(
            f"{path}: refused. Loading it would need code execution (it pickles Python objects beyond plain "
            f"tensors: {first}). Only weights_only=True loads are allowed; use the model.safetensors release "
            f"of these weights or re-save the state dict as plain tensors."
        ) from None
    if isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), dict):
        obj = next(iter(obj.values()))  # {"state_dict": {...}} wrappers
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ExpertLoadError(f"{path}: expected a dict of tensors (a state dict), got {type(obj).__name__}")
    return obj


# ---- detection ----------------------------------------------------------------------------------------------
def _check_dit_keys(keys: Sequence[str], where: str) -> str:
    prefix = _strip_prefix(keys)
    if prefix + "patch_embedding.weight" not in keys or not any(
        k.startswith(prefix + "patch_embedding_wancamctrl.") for k in keys
    ):
        raise ExpertLoadError(f"{where} does not hold a LingBot-World DiT expert: {describe_foreign(list(keys))}")
    return prefix


def _unprefixed(shapes: Mapping[str, Sequence[int]], prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)} if prefix else dict(shapes)


def _single_safetensors(path: Path, folder_cfg: Optional[Path], community: bool) -> ExpertFormat:
    header = read_header(path)
    prefix = _check_dit_keys(list(header.entries), str(path))
    shapes = _unprefixed(header.shapes(), prefix)
    nf4 = is_nf4_keyset(header.entries)
    cfg, src = _resolve_config(folder_cfg, header, shapes, str(path))
    meta = None
    lowp = stored_kind({k: e.dtype for k, e in header.entries.items()})
    if lowp is not None:
        if nf4:
            raise ExpertLoadError(f"{path}: holds both NF4 and {lowp.upper()} linears; a converter run was mixed "
                                  "up, convert the expert again")
        try:
            meta = FORMATS[lowp].parse_metadata(header.metadata, str(path))
        except LowpFormatError as e:
            raise ExpertLoadError(str(e)) from None
        kind = lowp if community else f"single_file_{lowp}"
    elif community and nf4:
        qm = path.parent / "quantization_meta.json"
        if qm.is_file():
            try:
                meta = json.loads(qm.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ExpertLoadError(f"{qm}: not valid JSON ({e})") from None
        kind = "nf4_community"
    else:
        kind = "single_file_nf4" if nf4 else "single_file_plain"
    return ExpertFormat(kind, path, (path,), cfg, src, meta, prefix, {path: header})


def _shards(folder: Path) -> tuple[Path, ...]:
    try:
        return shard_set(folder)
    except IncompleteShards as e:
        raise ExpertNotFoundError(str(e)) from None


def _official(folder: Path) -> ExpertFormat:
    index = shard_index(folder)
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ExpertLoadError(f"{index}: not a valid shard index ({e}); download it again") from None
        names = sorted(set(weight_map.values()))
        files = tuple(folder / n for n in names)
        for p in files:
            if not p.is_file():
                raise ExpertNotFoundError(f"{p}: shard listed in {index.name} is missing; finish the download")
    else:
        weight_map = None
        files = (folder / OFFICIAL_SINGLE,) if (folder / OFFICIAL_SINGLE).is_file() else _shards(folder)
    headers = {p: read_header(p) for p in files}
    shapes: dict[str, tuple] = {}
    for p, h in headers.items():
        for k, e in h.entries.items():
            if k in shapes:
                raise ExpertLoadError(f"{p}: key {k!r} appears in two shards")
            shapes[k] = e.shape
    if weight_map is not None:
        for k, shard in weight_map.items():
            if k not in headers[folder / shard].entries:
                raise ExpertLoadError(f"{folder / shard}: key {k!r} listed in {index.name} is not in this shard; the download is incomplete")
    prefix = _check_dit_keys(list(shapes), str(folder))
    shapes = _unprefixed(shapes, prefix)
    cfg, src = _resolve_config(folder / "config.json", None, shapes, str(folder))
    return ExpertFormat("official_sharded", folder, files, cfg, src, None, prefix, headers)


def _pt(path: Path, folder_cfg: Optional[Path]) -> ExpertFormat:
    sd = load_pt_state_dict(path)
    prefix = _check_dit_keys(list(sd), str(path))
    shapes = _unprefixed({k: tuple(v.shape) for k, v in sd.items()}, prefix)
    cfg, src = _resolve_config(folder_cfg, None, shapes, str(path))
    return ExpertFormat("nf4_pt", path, (path,), cfg, src, None, prefix)


def detect_format(path: Union[str, Path]) -> ExpertFormat:
    """Find out what kind of expert `path` (folder or file) holds; raises with a clear message if none."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ExpertNotFoundError(f"expert path not found: {path}")
    if path.is_file():
        if path.suffix == ".safetensors":
            return _single_safetensors(path, None, community=False)
        if path.suffix in (".pt", ".pth", ".bin", ".ckpt"):
            return _pt(path, path.parent / "config.json" if path.name == "model.pt" else None)
        raise ExpertLoadError(f"{path}: unsupported file type {path.suffix!r}; expected .safetensors or model.pt")

    cfg_file = path / "config.json"
    if (path / "model.safetensors").is_file():
        return _single_safetensors(path / "model.safetensors", cfg_file, community=True)
    if is_sharded_folder(path):
        return _official(path)
    if (path / "model.pt").is_file():
        return _pt(path / "model.pt", cfg_file)
    experts = sorted(p.name for p in path.iterdir() if p.is_dir() and "noise_model" in p.name)
    if experts:
        raise ExpertLoadError(f"{path} holds several experts ({', '.join(experts)}); pass one of these folders")
    _shards(path)  # an incomplete model-0000k-of-0000N set is an unfinished download: this names it
    sub = path / V2_DIT_SUBFOLDER
    if sub.is_dir() and not any(path.glob("*.safetensors")):
        return detect_format(sub)  # a v2 download root: its one DiT is in transformers/
    singles = sorted(path.glob("*.safetensors"))
    if len(singles) == 1:
        return _single_safetensors(singles[0], cfg_file, community=False)
    found = sorted(p.name for p in path.iterdir())
    hint = ""
    low = " ".join(found).lower()
    if "vae" in low:
        hint = " It looks like a VAE folder."
    elif "t5" in low or "umt5" in low:
        hint = " It looks like a T5 text-encoder folder."
    raise ExpertNotFoundError(
        f"no DiT expert in {path}: expected model.safetensors (+config.json), {OFFICIAL_INDEX} or {SHARD_INDEX} "
        f"with its shards, model-0000k-of-0000N.safetensors shards, a {V2_DIT_SUBFOLDER}/ folder, or model.pt; "
        f"found {found[:8] or 'nothing'}.{hint}"
    )


# ---- Fast (causal) vs base ------------------------------------------------------------------------------------
MODEL_KINDS = ("base", "fast")


def model_kind(fmt: ExpertFormat) -> Optional[str]:
    """"fast" or "base" from the expert's config; None when it cannot be told.

    The Fast model has exactly the base expert's tensors (names and shapes), so the weights alone cannot tell them
    apart: the config does (class name `WanModelFast`, or its causal init arguments `local_attn_size` / `sink_size`,
    in config.json or in the safetensors metadata our writers add). A config inferred from shapes says nothing.
    """
    if fmt.config_source == "inferred from shapes":
        return None
    return "fast" if fmt.config.causal else "base"


def check_model_kind(fmt: ExpertFormat, want: str) -> Optional[str]:
    """Refuse a base expert given as the Fast model and the reverse; returns a note when the kind is unknown."""
    if want not in MODEL_KINDS:
        raise ValueError(f"model kind {want!r}: choose one of {MODEL_KINDS}")
    kind = model_kind(fmt)
    if kind is None:
        return (f"{fmt.path}: no config says whether this is the Fast or a base expert (their tensors are identical); "
                f"using it as the {want} model as asked. Put its config.json beside it to have this checked.")
    if kind == want:
        return None
    if want == "fast":
        raise ExpertLoadError(
            f"{fmt.path} is a base (high/low-noise) expert ({fmt.config_source} has _class_name WanModel), not the "
            "Fast model: the Fast model is the folder lingbot_world_fast/ (robbyant/lingbot-world-fast), or its NF4 "
            "copy from `lingbot-world convert-expert`. Use --model base for the two experts.")
    raise ExpertLoadError(
        f"{fmt.path} is the Fast (causal) model ({fmt.config_source} says WanModelFast), not a high/low-noise expert: "
        "run it with --model fast (LingBot Fast Sampler in ComfyUI), or pick the high_noise_model / low_noise_model "
        "folders for the base model.")


def assume_model_kind(fmt: ExpertFormat, kind: str) -> ExpertFormat:
    """`fmt` with its config marked as the `kind` ("fast" | "base") model when nothing on disk says which it is (a
    config inferred from shapes: the v2 1.3B's folder has no config.json), so that a converter writes that kind into
    the config.json of its output. A config read from disk is returned unchanged (check_model_kind checks those)."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind {kind!r}: choose one of {MODEL_KINDS}")
    if model_kind(fmt) is not None:
        return fmt
    return replace(fmt, config=replace(fmt.config, causal=kind == "fast"),
                   config_source=f"inferred from shapes, {kind} as given")

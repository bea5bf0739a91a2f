"""Which files a causal world loads: the model's DiT (its registry entry's folders), and the umT5 encoder, tokenizer
and VAE it shares with every LingBot-World download.

`WorldFiles.find(source)` reads a door's `ModelSource` (a checkpoint folder, the demo, or explicit files) for the
model it names (or any causal model, recognised from its weights); `check()` reads the DiT's headers, tells which
registry model it is (world/detect.py) and checks every tensor, before anything is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from ..loaders.checkpoint_dir import shared_files
from ..loaders.demo_checkpoint import demo_vae_config
from ..loaders.expert_format import ExpertFormat, check_model_kind, detect_format
from ..loaders.expert_loader import check_expert_keys
from ..quant.lowp_kinds import LOWP_WEIGHTS
from . import models as registry
from .detect import describe_folder, identify
from .models import ModelEntry
from .settings import ModelSource


@dataclass(frozen=True)
class WorldFiles:
    root: Path
    dit: Path  # the DiT: a folder or a file
    t5: Path
    vae: Path
    tokenizer: Optional[Path]
    wanted: Optional[str] = None  # the registry name the user gave (None: any causal model, told from its weights)

    @classmethod
    def find(cls, source: ModelSource, weights: str = "nf4") -> "WorldFiles":
        """The files `source` names (for weights "fp8" / "int8": the stored copy of the DiT)."""
        wanted = source.model
        if source.demo:
            from .demos import build_demo

            entry = registry.model(wanted or "v1-fast")
            files = find_in_folder(build_demo(entry, source.demo_dir, weights), entry.name, weights)
        elif source.ckpt_dir is not None:
            files = find_in_folder(Path(source.ckpt_dir).expanduser(), wanted, weights, source.dit,
                                   source.assets_dir)
        else:
            missing = [flag for flag, value in (("--fast-model", source.dit), ("--t5", source.t5), ("--vae", source.vae))
                       if value is None]
            if missing:
                raise FileNotFoundError(f"give --ckpt-dir (or --demo), or {' '.join(missing)}")
            files = cls(Path("."), Path(source.dit), Path(source.t5), Path(source.vae),
                        None if source.tokenizer is None else Path(source.tokenizer), wanted)
        given = {name: getattr(source, name) for name in ("dit", "t5", "vae", "tokenizer")
                 if getattr(source, name) is not None}
        return replace(files, wanted=wanted, **{k: Path(v) for k, v in given.items()})

    @classmethod
    def demo(cls, demo_dir: Optional[Path] = None, weights: str = "nf4", model: str = "fast") -> "WorldFiles":
        """The tiny random-weight demo of a causal model (world/demos.py; built on first use)."""
        return cls.find(ModelSource(model=model, demo=True, demo_dir=demo_dir), weights)

    def vae_config(self):
        """The demo's tiny VAE config, None for a real checkpoint (the Wan 2.1 VAE) or no VAE named here."""
        return None if self.vae is None else demo_vae_config(self.vae.parent)

    def check(self, weights: str = "nf4") -> tuple[ExpertFormat, ModelEntry, list[str]]:
        """(the DiT's format from its headers, its registry entry, notes). Every tensor is checked; a base expert
        given as a causal model, or another model than the one asked for, is refused. Nothing is read yet."""
        fmt = detect_format(self.dit)
        notes = [n for n in (check_model_kind(fmt, "fast"),) if n]
        entry, note = identify(fmt, self.wanted)
        if note:
            notes.append(note)
        if not entry.causal:
            raise ValueError(f"{self.dit} holds {entry.title}, not a causal model")
        check_expert_keys(fmt, weights)
        return fmt, entry, notes


def _entries_for(wanted: Optional[str]) -> list[ModelEntry]:
    if wanted:
        return [registry.model(wanted)]
    return [e for e in registry.entries() if e.causal]


def _dit_dirs(entry: ModelEntry, weights: str) -> tuple[str, ...]:
    """The DiT folders to look for, best first: for fp8 / int8 weights that stored copy, then the official folder
    (quantized while loading; never the NF4 copy); for nf4 the NF4 copy first."""
    if weights in LOWP_WEIGHTS:
        return (entry.files.stored_dir(weights), *entry.files.official)
    return entry.files.dit_dirs


def _holds_dit(folder: Path) -> bool:
    """A folder with a release's DiT shards in it (not merely a T5 or VAE .safetensors of ComfyUI's naming)."""
    return folder.is_dir() and any(any(folder.glob(p)) for p in ("model.safetensors.index.json", "model-*.safetensors",
                                                               "diffusion_pytorch_model*.safetensors"))


def find_in_folder(root: Path, wanted: Optional[str], weights: str = "nf4", dit: Optional[Path] = None,
                   assets: Optional[Path] = None) -> WorldFiles:
    """A causal model's files in a download folder (the DiT folder itself may be given as `root`)."""
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder {root} does not exist")
    entries = _entries_for(wanted)
    found = dit
    if found is None:
        for entry in entries:
            for d in _dit_dirs(entry, weights):
                if d and (root / d).is_dir():
                    found = root / d
                    break
                if not d and _holds_dit(root):
                    found = root
                    break
            if found is not None:
                break
    if found is None and any(root.name == d for e in entries for d in _dit_dirs(e, weights) if d):
        found, root = root, root.parent  # --ckpt-dir named the DiT's own folder
    if found is None:
        raise FileNotFoundError(_missing_dit(root, entries, weights))
    t5, vae, tok = shared_files(root, assets, found_in=found)
    return WorldFiles(root, found, t5, vae, tok, wanted)


def _missing_dit(root: Path, entries: list[ModelEntry], weights: str) -> str:
    looked = ", ".join(dict.fromkeys(f"{d}/" for e in entries for d in _dit_dirs(e, weights) if d))
    what = entries[0].title if len(entries) == 1 else "causal model"
    has = describe_folder(root)
    msg = f"{root}: no {what} folder (looked for {looked}); it holds {has}."
    if weights in LOWP_WEIGHTS and len(entries) == 1:
        e = entries[0]
        msg += (f" Make the {weights.upper()} copy with `lingbot-world convert-{weights} "
                f"{root / e.files.official_dir} {root / e.files.stored_dir(weights)}`, or use --weights nf4.")
    elif len(entries) == 1:
        e = entries[0]
        msg += f" Download {e.files.hub_repo} into {root}" + (f" ({e.files.hub_note})" if e.files.hub_note else "") + "."
    return msg


def heads_without_building(source: ModelSource, weights: str = "nf4") -> Optional[int]:
    """The attention heads of the model `source` names, where they are known without building or loading anything
    (a demo's configuration, a checkpoint's config.json or headers); None otherwise, or when a file is missing or
    damaged (the pre-flight reports that, in its words). source.model: a causal model of the registry, or a base
    model (None: Cam or Act, told from the experts)."""
    try:
        entry = registry.model(source.model) if source.model else None
        causal = entry is not None and entry.causal
        if source.demo and causal:
            from .demos import demo_config

            return demo_config(entry).num_heads
        if source.demo:
            from ..loaders.demo_checkpoint import demo_configs

            return demo_configs(entry.control if entry is not None else "camera")[0].num_heads
        if source.ckpt_dir is None and source.high is None:
            return None
        from ..memory.placement import read_expert_config

        if causal:
            return read_expert_config(find_in_folder(Path(source.ckpt_dir), source.model, weights).dit).num_heads
        if source.high is not None:
            return read_expert_config(source.high).num_heads
        from ..loaders.checkpoint_dir import find_checkpoint_files

        return read_expert_config(find_checkpoint_files(source.ckpt_dir).high).num_heads
    except Exception:  # noqa: BLE001 - a missing or damaged file is the pre-flight's to report, in its words
        return None

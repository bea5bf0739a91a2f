"""Which files a World session loads: the Fast model and the base package's T5, VAE and tokenizer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..loaders.checkpoint_dir import FastCheckpointFiles, _shared_files, find_fast_checkpoint_files
from ..loaders.demo_checkpoint import build_demo_fast_checkpoint, demo_vae_config
from ..loaders.expert_format import ExpertFormat, check_model_kind, detect_format
from ..loaders.expert_loader import check_expert_keys


@dataclass(frozen=True)
class FastFiles:
    root: Path
    fast: Path
    t5: Path
    vae: Path
    tokenizer: Optional[Path]

    @classmethod
    def find(cls, ckpt_dir, fast_model: Optional[Path] = None, weights: str = "nf4") -> "FastFiles":
        """The files of a release folder (the NF4 copy of the Fast model first; with weights "fp8" / "int8" that
        stored copy, else the official folder); `fast_model` overrides it."""
        root = Path(ckpt_dir).expanduser()
        if fast_model is not None:
            t5, vae, tok = _shared_files(root)
            return cls(root, Path(fast_model), t5, vae, tok)
        return cls.of(find_fast_checkpoint_files(root, weights))

    @classmethod
    def demo(cls, demo_dir: Optional[Path] = None, weights: str = "nf4") -> "FastFiles":
        """The tiny random-weight demo checkpoint (built on first use; weights "fp8" / "int8": its Fast model converted
        to FP8 / INT8 too, once)."""
        return cls.of(build_demo_fast_checkpoint(demo_dir, weights=weights))

    @classmethod
    def of(cls, files: FastCheckpointFiles) -> "FastFiles":
        return cls(Path(files.root), Path(files.fast), Path(files.t5), Path(files.vae),
                   None if files.tokenizer is None else Path(files.tokenizer))

    def vae_config(self):
        """The demo's tiny VAE config, None for a real checkpoint (the Wan 2.1 VAE)."""
        return demo_vae_config(self.root)

    def check(self, weights: str = "nf4") -> tuple[ExpertFormat, Optional[str]]:
        """The Fast model's format from its headers (every tensor checked), and a note when it looks like another
        model kind. Raises before anything is read."""
        fmt = detect_format(self.fast)
        note = check_model_kind(fmt, "fast")
        check_expert_keys(fmt, weights)
        return fmt, note

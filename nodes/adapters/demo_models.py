"""The tiny CPU demo's model entries, listed in the loaders before they exist and built on first use.

A new install has nothing in models/lingbot_world/, so the demo templates name entries of two demo folders there
(`lingbot-demo`: Cam experts, the Fast model, text encoder, tokenizer, VAE; `lingbot-demo-act`: the Act experts and
the same small files). The loaders list these names even before they exist, and the first node that needs one builds
its folder (`loaders.demo_checkpoint`, a few seconds on a CPU, random weights) into the first lingbot_world folder:
no pip, no CLI. No ComfyUI imports: the caller passes the folders.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)

DEMO_FOLDERS = {"lingbot-demo": "camera", "lingbot-demo-act": "act"}
EXPERTS = ("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4")
FAST = "lingbot_world_fast_bnb_nf4"
TEXT_ENCODER = "models_t5_umt5-xxl-enc-bf16.pth"
VAE = "Wan2.1_VAE.pth"
_lock = threading.Lock()


def demo_entries(kind: str) -> list[str]:
    """Names (relative to a lingbot_world folder) of one kind: "experts", "fast", "text_encoder" or "vae"."""
    out = []
    for folder, control in DEMO_FOLDERS.items():
        if kind == "experts":
            out += [f"{folder}/{e}" for e in EXPERTS]
        elif kind == "fast" and control == "camera":
            out.append(f"{folder}/{FAST}")
        elif kind == "text_encoder":
            out.append(f"{folder}/{TEXT_ENCODER}")
        elif kind == "vae":
            out.append(f"{folder}/{VAE}")
    return out


def is_demo_entry(name: str) -> bool:
    parts = Path(name).parts
    return len(parts) == 2 and parts[0] in DEMO_FOLDERS and parts[1] in (*EXPERTS, FAST, TEXT_ENCODER, VAE)


def ensure_demo(name: str, roots: Sequence[str]) -> Optional[Path]:
    """Build the demo folder `name` belongs to (once) in the first of `roots` and return the entry's path; None when
    `name` is not a demo entry or there is no folder to build in."""
    if not is_demo_entry(name) or not roots:
        return None
    from ...loaders.demo_checkpoint import build_demo_checkpoint
    from ...world.files import WorldFiles

    folder, entry = Path(name).parts
    root = Path(roots[0]) / folder
    with _lock:  # two loaders of one prompt may ask at once: one build
        if not (root / entry).exists():
            log.info("LingBot-World: building the tiny demo checkpoint (random weights) in %s", root)
            if entry == FAST:
                WorldFiles.demo(root)
            else:
                build_demo_checkpoint(root, control=DEMO_FOLDERS[folder])
    return root / entry

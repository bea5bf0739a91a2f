"""Typed settings of a player, made by its door (the CLI or the ComfyUI node)."""
from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

DEFAULT_PORT = 8189
LOCAL_HOST = "127.0.0.1"


def new_token() -> str:
    """A fresh per-run secret for the page's URL (other local users can neither drive nor watch)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class RenderSource:
    """How a `lingbot-world generate` child finds the same model and inputs again ("render this path")."""

    checkpoint_args: tuple[str, ...]  # ("--ckpt-dir", DIR) or ("--demo", ["--demo-dir", DIR])
    seed: int
    size: str  # the played size (the Fast render at 720p uses FAST_RENDER_SIZE unless a demo)
    window: Optional[int]
    sink: int
    device: str = "auto"
    demo: bool = False
    noise: str = "auto"
    python: str = field(default_factory=lambda: sys.executable)
    fast_weights: str = "nf4"  # the Fast render's --weights (the base Cam render has its own experts)
    model: str = "fast"  # the played causal model's name for the Fast render's --model
    # the played speed plan as flags (--compile/--compute/--attention): `auto` may decide otherwise for a short batch
    # video (compile off below 20 chunks), and the render must run the kernels the played chunks ran to equal them
    fast_speed_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlayerOptions:
    out_dir: Path  # saves, uploads and renders go here, nowhere else
    token: str = field(default_factory=new_token)
    render: Optional[RenderSource] = None  # None: "render this path" only prints the action string
    image: Optional[Path] = None  # the start image named by the door (the page may pick/upload another)
    prompt: str = ""
    title: str = "LingBot-World player"
    restart: Optional[Callable] = None  # begin(session): the door's fixed start (no image/prompt picking)
    timings_out: Optional[Path] = None  # the run's latency record (player/timings.py) as JSON, written at the end

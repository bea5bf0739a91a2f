"""`lingbot-world play`'s flags, read once right after parsing into a typed, frozen request (issue 25: the argparse
namespace stops at the parser; cli/play.py and everything below take the request)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..player.options import DEFAULT_PORT, LOCAL_HOST
from ..speed.options import DEFAULTS as SPEED_DEFAULTS
from .request_base import FlagRequest


@dataclass(frozen=True)
class PlayRequest(FlagRequest):
    """Every `play` flag under its argparse dest name."""

    # inputs
    model: str = "fast"
    ckpt_dir: Optional[Path] = None
    assets_dir: Optional[Path] = None
    demo: bool = False
    demo_dir: Optional[Path] = None
    image: Optional[Path] = None
    prompt: Optional[str] = None
    # generation
    seed: int = 42
    size: Optional[str] = None  # None: 480*832, or the demo's size
    window: Optional[int] = None  # None: the model's play window (v1 Fast 21, v2 18); 0: the whole video
    sink: Optional[int] = None
    weights: str = "nf4"
    kv_cache: str = "auto"
    device: str = "auto"
    noise: str = "auto"
    t5_device: str = "auto"
    cache_dir: Optional[Path] = None
    tiny_vae: Optional[Path] = None  # --tiny-vae: play with a tiny decoder (the render uses the VAE)
    no_preview: bool = False  # --no-preview: no chunk previews (made only with a tiny decoder)
    # speed
    speed: Optional[str] = None
    compile: str = SPEED_DEFAULTS["compile"]
    compute: str = SPEED_DEFAULTS["compute"]
    attention: str = SPEED_DEFAULTS["attention"]
    chunk_steps: Optional[int] = None  # --chunk-steps: the Fast model's calls per chunk (None: the preset's)
    speed_explicit: frozenset = frozenset()  # the speed flags given on the command line (over a --speed preset)
    # server
    port: int = DEFAULT_PORT
    host: str = LOCAL_HOST
    no_browser: bool = False
    out_dir: Path = Path("lingbot_play")
    timings: Optional[Path] = None

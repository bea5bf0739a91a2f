"""What a door asks of a World session, as typed values: the doors parse flags, nodes and requests into these."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..wan.control.camera import DEFAULT_POSE_PRECISION


@dataclass(frozen=True)
class TextSettings:
    """The umT5 child process: its device, the prompt cache, a time limit."""

    device: str = "auto"
    cache_dir: Optional[Path] = None
    use_cache: bool = True
    timeout: Optional[float] = None


@dataclass(frozen=True)
class WorldSettings:
    """A World session's choices. size: the pixel budget ("480*832", "720p"); the aspect comes from the image."""

    size: str = "480*832"
    seed: int = 42
    noise: str = "cpu"  # "cpu" | "cuda" generator
    rule: str = "continuable"  # a played video never looks ahead
    window: Optional[int] = None  # latent frames kept in the cache (None: the whole video)
    sink: int = 0
    max_attention: Optional[int] = None
    precision: str = DEFAULT_POSE_PRECISION
    weights: str = "nf4"
    kv_cache: str = "auto"  # "auto" | "gpu" | "host"
    kv_layers_on_gpu: Optional[int] = None
    vae_tiled: bool = False
    tiny_vae: Optional[Path] = None  # a tiny decoder (taew2_1 / lighttaew2_1) for every decode instead of the VAE
    loras: tuple = ()  # ((path, strength), ...)
    text: TextSettings = field(default_factory=TextSettings)
    speed: object = None  # a speed.options plan (None: the exact defaults)

"""What a door asks of a world, as typed values: the doors parse flags, node inputs and requests into these, and
nothing below them sees an argparse namespace or a ComfyUI object."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..wan.control.camera import DEFAULT_POSE_PRECISION


@dataclass(frozen=True)
class ModelSource:
    """Which model and where its files are: the demo, a checkpoint folder, or explicit files.

    model: a registry name or alias (world/models.py), None: any causal model, told from its weights. assets: a
    download holding the umT5 encoder, tokenizer and VAE when the model's own lacks them (the v2 1.3B)."""

    model: Optional[str] = None
    ckpt_dir: Optional[Path] = None
    demo: bool = False
    demo_dir: Optional[Path] = None
    dit: Optional[Path] = None  # the DiT itself (a folder or a file), over the checkpoint's
    t5: Optional[Path] = None
    vae: Optional[Path] = None
    tokenizer: Optional[Path] = None
    assets_dir: Optional[Path] = None


@dataclass(frozen=True)
class TextSettings:
    """The umT5 child process: its device, the prompt cache, a time limit, and whether it may run beside the other
    start-up steps (world/text_stage.py)."""

    device: str = "auto"
    cache_dir: Optional[Path] = None
    use_cache: bool = True
    timeout: Optional[float] = None
    overlap: bool = True


MODEL_DEFAULT = -1  # window / sink: the model's own default (its registry entry's)


@dataclass(frozen=True)
class WorldSettings:
    """A causal world's choices. size: the pixel budget ("480*832", "720p"); the aspect comes from the image.

    window / sink: latent frames the K/V cache keeps and never evicts; MODEL_DEFAULT takes the model's (v1 Fast: the
    whole video; v2: 18 + 6; played: the model's play window, v1 Fast 21 + 3), None (window) the whole video.
    play: a video played live (endless: the model's play window by default)."""

    size: str = "480*832"
    seed: int = 42
    noise: str = "cpu"  # "cpu" | "cuda" generator
    rule: str = "continuable"  # a played video never looks ahead
    window: Optional[int] = MODEL_DEFAULT
    sink: int = MODEL_DEFAULT
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
    stream_decode: str = "auto"  # "auto" | "on" | "off": each chunk decoded beside the model
    play: bool = False

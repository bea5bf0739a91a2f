"""What a door asks of a world, as typed values: the doors parse flags, node inputs and requests into these, and
nothing below them sees an argparse namespace or a ComfyUI object."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

# The values a door may offer for a setting (a flag's choices, a widget's combo), from the layer that owns each.
from ..memory.camera_cache import CAMERA_CACHE_CHOICES  # BaseSettings.camera_cache
from ..memory.fast_planner import CACHE_PLACEMENTS  # WorldSettings.kv_cache
from ..quant.lowp_kinds import LOWP_WEIGHTS  # the stored low-precision weights among `weights`
from ..wan.control.camera import DEFAULT_POSE_PRECISION, POSE_PRECISIONS  # precision
from ..wan.sampling.fast_state import FAST_MODES  # WorldSettings.rule
from ..wan.sampling.sampler import CFG_MODES  # BaseSettings.cfg_mode

__all__ = ["BaseSettings", "CACHE_PLACEMENTS", "CAMERA_CACHE_CHOICES", "CFG_MODES", "DEFAULT_POSE_PRECISION",
           "ExpertLora", "FAST_MODES", "LOWP_WEIGHTS", "MODEL_DEFAULT", "ModelSource", "POSE_PRECISIONS", "Steering",
           "TextSettings", "VideoRequest", "WorldSettings"]


@dataclass(frozen=True)
class ModelSource:
    """Which model and where its files are: the demo, a checkpoint folder, or explicit files.

    model: a registry name or alias (world/models.py), None: any causal model, told from its weights (a base world:
    Cam or Act, told from the experts' weights; a continuation: the model its state names). assets: a download
    holding the umT5 encoder, tokenizer and VAE when the model's own lacks them (the v2 1.3B). high / low: a base
    model's experts, over the checkpoint's."""

    model: Optional[str] = None
    ckpt_dir: Optional[Path] = None
    demo: bool = False
    demo_dir: Optional[Path] = None
    dit: Optional[Path] = None  # the DiT itself (a folder or a file), over the checkpoint's
    t5: Optional[Path] = None
    vae: Optional[Path] = None
    tokenizer: Optional[Path] = None
    assets_dir: Optional[Path] = None
    high: Optional[Path] = None
    low: Optional[Path] = None


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


@dataclass(frozen=True)
class Steering:
    """What steers a video: keys (`actions`: an action string, a `.txt` file of one, or key files), a camera path
    (`camera`: a trajectory folder, or a preset such as dolly_in at `camera_speed` times its speed; every frame's
    intrinsics followed with `per_frame_intrinsics`), or neither. frames: the frames asked for (None: as long as the
    keys, else the model's default). world/controls.py reads it."""

    actions: Optional[str] = None
    camera: Optional[str] = None
    camera_speed: float = 1.0
    per_frame_intrinsics: bool = False
    frames: Optional[int] = None


@dataclass(frozen=True)
class VideoRequest:
    """One video (or a causal video's next part) asked for in one go, the CLI's way: the start image and the prompt,
    what steers it, where it computes (a torch.device) and how a torchrun launch's ranks share it (`parallel`:
    parallel/layout.py's modes); for a causal model also the speed flags the world plans for the part's length
    (speed/plans.SpeedFlags), where its state is saved after it, and the saved state it continues."""

    image: Optional[Path] = None
    prompt: Optional[str] = None
    steering: Steering = field(default_factory=Steering)
    device: object = None
    parallel: str = "auto"
    speed: object = None
    save_to: Optional[Path] = None
    continue_from: Optional[Path] = None


class ExpertLora(NamedTuple):
    """A LoRA on a base model's experts: the file, its strength, which experts ("high", "low") take it, and where it
    was given (the flag or input, and the value as written) for the messages and the ranks' comparison."""

    path: Path
    strength: float
    experts: tuple
    flag: str
    spec: str


@dataclass(frozen=True)
class BaseSettings:
    """A base (two-expert) world's choices: flow-UniPC (or DPM++) over the high- and low-noise experts with
    classifier-free guidance. size: the pixel budget, the aspect from the image. steps: None takes the model kind's
    (Cam 70, Act 20). guide_scale: one value for both experts, or (low, high). seed: negative = random. noise: "cpu"
    | "cuda" generator. memory_mode / blocks_on_gpu: where the experts live (memory/placement.py); camera_cache: the
    camera layers' cache (memory/camera_cache.py)."""

    size: str = "480*832"
    steps: Optional[int] = None
    shift: float = 10.0
    boundary: float = 0.947
    guide_scale: tuple = (5.0,)
    seed: int = 42
    noise: str = "cpu"
    solver: str = "unipc"
    cfg_mode: str = "auto"
    weights: str = "nf4"  # "nf4" | "bf16"
    memory_mode: str = "auto"
    blocks_on_gpu: Optional[int] = None
    camera_cache: str = "auto"
    vae_tiled: bool = False
    precision: str = DEFAULT_POSE_PRECISION
    negative_prompt: Optional[str] = None  # None: the model's own
    loras: tuple = ()  # ExpertLora items
    text: TextSettings = field(default_factory=TextSettings)
    speed: object = None  # a speed.options plan (None: the exact defaults)

    @property
    def guidance(self) -> bool:
        """Whether the run guides at all (a guide scale of 1 for both experts has no unconditional pass)."""
        return not (self.guide_scale[0] == 1.0 and self.guide_scale[-1] == 1.0)

"""`lingbot-world generate`'s flags, read once right after parsing into one typed, frozen request.

The architecture rule (issue 25): the argparse namespace stops at the parser. `GenerateRequest.from_args` is the
only reader of `generate`'s namespace; everything below takes the request or the typed pieces it hands out
(text-encoder, speed, parallel and LoRA flags). A changed value (the demo's defaults, a rank's device) is a new
request (`dataclasses.replace`), never a mutation, so what a check saw is what the run uses.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..parallel.group import DEFAULT_TIMEOUT_S
from ..speed.options import DEFAULTS as SPEED_DEFAULTS
from ..wan.control.camera import DEFAULT_POSE_PRECISION
from .lora_run import LoraFlags
from .parallel_flags import ParallelFlags
from .request_base import FlagRequest

if TYPE_CHECKING:
    from ..world.settings import TextSettings

DEMO_SIZE = "64*112"
DEMO_FRAMES = 17
DEMO_CAMERA = "dolly_in+pan_right"
DEMO_OUT = Path("lingbot_demo.mp4")


@dataclass(frozen=True)
class GenerateRequest(FlagRequest):
    """Every `generate` flag under its argparse dest name (the flag tables of cli/flag_checks.py look them up by
    that name); lists become tuples so the request cannot change under a check."""

    # inputs
    ckpt_dir: Optional[Path] = None
    demo: Optional[str] = None  # None, "camera" or "act"
    demo_dir: Optional[Path] = None
    image: Optional[Path] = None
    camera: Optional[str] = None
    camera_speed: float = 1.0
    per_frame_intrinsics: bool = False
    prompt: Optional[str] = None
    negative_prompt: Optional[str] = None
    high: Optional[Path] = None
    low: Optional[Path] = None
    t5: Optional[Path] = None
    tokenizer: Optional[Path] = None
    vae: Optional[Path] = None
    # generation
    size: str = "480*832"
    frames: Optional[int] = None
    steps: Optional[int] = None
    shift: float = 10.0
    boundary: float = 0.947
    guide_scale: tuple = (5.0,)
    seed: int = 42
    noise: str = "auto"
    solver: str = "unipc"
    cfg_mode: str = "auto"
    # device and memory
    device: str = "auto"
    weights: str = "nf4"
    memory_mode: str = "auto"
    blocks_on_gpu: Optional[int] = None
    t5_device: str = "auto"
    t5_timeout: Optional[float] = None
    no_text_cache: bool = False
    cache_dir: Optional[Path] = None
    vae_tiled: bool = False
    camera_cache: str = "auto"
    overlap: str = "auto"
    # speed
    speed: Optional[str] = None
    compile: str = SPEED_DEFAULTS["compile"]
    compute: str = SPEED_DEFAULTS["compute"]
    attention: str = SPEED_DEFAULTS["attention"]
    chunk_steps: Optional[int] = None  # --chunk-steps: the Fast model's calls per chunk (None: the preset's)
    speed_explicit: frozenset = frozenset()  # the speed flags given on the command line (over a --speed preset)
    given_flags: frozenset = frozenset()  # flags given on the command line though equal to their default (Given)
    # several GPUs
    parallel: str = "auto"
    parallel_timeout: float = DEFAULT_TIMEOUT_S
    # LoRA
    lora: tuple = ()
    lora_high: tuple = ()
    lora_low: tuple = ()
    # output
    out: Optional[Path] = None
    fps: int = 16
    quiet: bool = False
    # keys and actions
    actions: Optional[str] = None
    trajectory_picture: Optional[str] = None
    camera_precision: str = DEFAULT_POSE_PRECISION
    # the Fast model
    model: str = "base"
    fast_model: Optional[Path] = None
    assets_dir: Optional[Path] = None
    kv_cache: str = "auto"
    kv_layers_on_gpu: Optional[int] = None
    max_attention: Optional[int] = None
    window: Optional[int] = None
    sink: Optional[int] = None
    rule: str = "reference"
    save_state: Optional[Path] = None
    continue_from: Optional[Path] = None
    whole_video: Optional[Path] = None
    stream_decode: str = "auto"
    tiny_vae: Optional[Path] = None  # --tiny-vae: a tiny decoder for every decode of the Fast model's frames

    # ---- typed pieces for the shared helpers ------------------------------------------------------------------
    @property
    def text(self) -> "TextSettings":
        from ..world.settings import TextSettings  # the text stage's modules load with the run, not with the parser

        return TextSettings(device=self.t5_device, cache_dir=self.cache_dir, use_cache=not self.no_text_cache,
                         timeout=self.t5_timeout, overlap=self.overlap != "off")

    @property
    def parallel_flags(self) -> ParallelFlags:
        return ParallelFlags(self.parallel, self.parallel_timeout)

    @property
    def loras(self) -> LoraFlags:
        return LoraFlags(self.lora, self.lora_high, self.lora_low)

    # ---- new requests ------------------------------------------------------------------------------------------
    def with_demo_defaults(self) -> "GenerateRequest":
        """--demo: every input not given takes the demo's (image, prompt, camera or keys, size, frames, CPU, out)."""
        from ..loaders.action_files import action_text_file, looks_like_path
        from ..loaders.demo_checkpoint import DEMO_IMAGE, DEMO_PROMPT

        actions, camera = self.actions, self.camera
        if self.demo == "act":  # the release's Act example input (action.npy + poses.npy)
            actions = actions or (None if camera else str(DEMO_IMAGE.parent / "examples" / "05"))
        elif not actions:
            camera = camera or DEMO_CAMERA
        frames = self.frames
        if frames is None and not (actions and (not looks_like_path(actions) or action_text_file(actions))):
            frames = DEMO_FRAMES  # an action string sets its own length
        return replace(self, image=self.image or DEMO_IMAGE, prompt=self.prompt or DEMO_PROMPT, actions=actions,
                       camera=camera, size=DEMO_SIZE if self.size == "480*832" else self.size, frames=frames,
                       device="cpu" if self.device == "auto" else self.device,
                       out=DEMO_OUT if self.out is None else self.out)

    def on_rank(self, session) -> "GenerateRequest":
        """This rank's request under torchrun: its own device; the other ranks than 0 print nothing but warnings."""
        if not session.parallel:
            return self
        return replace(self, device=str(session.device), quiet=self.quiet or not session.is_main)

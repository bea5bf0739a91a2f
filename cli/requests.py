"""The typed requests of the commands: each command's flags, read once right after parsing into one frozen request.

The architecture rule (issue 25): the argparse namespace stops at the parser. `FlagRequest.from_args` is the only
reader of a command's namespace; everything below takes the request, and the command's door (cli/generate_*.py,
cli/play.py, cli/compare.py) translates it into the world's typed settings (world/settings.py) at its edge. A changed
value (the demo's defaults, a rank's device) is a new request (`dataclasses.replace`), never a mutation, so what a
check saw is what the run uses. The flag groups that several commands share (the speed flags) are here too.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..player.options import DEFAULT_PORT, LOCAL_HOST
from ..world.launch import DEFAULT_TIMEOUT_S
from ..world.settings import DEFAULT_POSE_PRECISION
from ..world.speed import (ATTENTION_CHOICES, CHUNK_STEP_CHOICES, COMPILE_CHOICES, COMPUTE_CHOICES, PRESET_NAMES,
                           DEFAULTS as SPEED_DEFAULTS, SpeedFlags)

if TYPE_CHECKING:
    from ..world.settings import TextSettings

DEFAULT_CHUNKS = 10  # compare: chunks each preset makes
GIVEN = "given_flags"  # the namespace attribute naming the flags (dest names) given on the command line
DEMO_SIZE = "64*112"
DEMO_FRAMES = 17
DEMO_CAMERA = "dolly_in+pan_right"
DEMO_OUT = Path("lingbot_demo.mp4")
BASE = "base"  # --model's default: the two v1 base experts (Cam or Act, told from their weights)


class Given(argparse.Action):
    """Stores the value and records that the flag was given, even when it equals the default (a continuation refuses
    a flag it takes from its state whatever its value)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, set(getattr(namespace, GIVEN, None) or ()) | {self.dest})


EXPLICIT = "speed_explicit"  # the namespace attribute naming the speed flags the user gave (cli/requests.py)


class _Explicit(argparse.Action):
    """Stores the value and records that the flag was given (so it wins over a --speed preset)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, EXPLICIT, None) or ())
        given.add(self.dest)
        setattr(namespace, EXPLICIT, given)


def add_speed_args(parser) -> None:
    g = parser.add_argument_group("speed")
    g.add_argument("--speed", choices=PRESET_NAMES, default=None,
                   help="speed preset: exact (eager, bf16, exact attention, float32 VAE decode: the reference "
                        "numerics), auto (the fastest exact path for the card: compiled per-token work, bf16, exact "
                        "attention, the VAE decode in fp16 on a GPU, frames within one bf16 rounding), fast (FP8 "
                        "GEMMs on RTX 40xx/Hopper+, INT8 on RTX 30xx, exact attention, the Fast model's K/V cache in "
                        "FP8; approximate), draft (fast + 3 steps per chunk, the context pass folded into the last "
                        "step and a 15-frame K/V window for the Fast model; for previews and "
                        "real-time play). --compile/--compute/--attention/--chunk-steps given explicitly override the "
                        "preset; a continuation without --speed runs the preset its video was made with")
    g.add_argument("--chunk-steps", type=int, choices=CHUNK_STEP_CHOICES, default=None,
                   help="Fast model: denoising calls per 12-frame chunk: 4 (the release's), 3 (the draft preset's) "
                        "or 2 (about a quarter faster than 3 with draft, rougher; for play on slower "
                        "cards); default: the --speed preset's, or on a continuation the continued video's")
    g.add_argument("--compile", choices=COMPILE_CHOICES, default=SPEED_DEFAULTS["compile"], action=_Explicit,
                   help="torch.compile the DiT's per-token work: blocks, off, graphs (compiled only into the CUDA "
                        "graphs that replay a narrow model's blocks once its window rolls), or auto (blocks on a CUDA "
                        "GPU with Triton, graphs for the v2 1.3B; same results to bf16 rounding; the first run "
                        "compiles, later runs use the cache in ~/.cache/lingbot-world/inductor)")
    g.add_argument("--compute", choices=COMPUTE_CHOICES, default=SPEED_DEFAULTS["compute"], action=_Explicit,
                   help="GEMM precision of the NF4 linears: bf16 (exact, default), fp8 (RTX 40xx/Ada, Hopper+), "
                        "int8 (Ampere+), fp16acc (fp16 with fp16 accumulation: 2x on GeForce cards; the DiT then "
                        "computes in fp16, max 65504, its residual stream staying float32), or auto (fp8 "
                        "where the card has it, else int8 on Ampere, else bf16); all but bf16 change the output "
                        "slightly")
    g.add_argument("--attention", choices=ATTENTION_CHOICES, default=SPEED_DEFAULTS["attention"], action=_Explicit,
                   help="attention kernel: auto (torch SDPA with the fastest exact kernel for the GPU: cuDNN on "
                        "Hopper, FlashAttention-2 on Ampere/Ada; with --compute fp8 on Hopper+ it picks fp8), sdpa "
                        "(the same, always exact), sage (SageAttention, approximate), flash (flash-attn package), "
                        "fp8 (cuDNN FP8 attention for the video self-attention: Hopper and newer with the "
                        "nvidia-cudnn-frontend package; ~1.6x faster attention, approximate), cudnn (exact bf16 "
                        "attention through nvidia-cudnn-frontend with cuDNN's fastest plan for each shape, timed on "
                        "the first call)")


class FlagRequest:
    """Base of a frozen dataclass holding every flag of one command under its argparse dest name."""

    @classmethod
    def from_args(cls, args):
        """The one place the command's namespace is read (a flag the parser lacks keeps its default)."""
        source = {"speed_explicit": EXPLICIT}
        return cls(**{f.name: _frozen(getattr(args, source.get(f.name, f.name), f.default)) for f in fields(cls)})


@dataclass(frozen=True)
class SpeedRequest(FlagRequest):
    """The flags of a command that takes the speed group (add_speed_args) and --weights, and the speed flags they
    make."""

    weights: str = "nf4"
    speed: Optional[str] = None
    compile: str = SPEED_DEFAULTS["compile"]
    compute: str = SPEED_DEFAULTS["compute"]
    attention: str = SPEED_DEFAULTS["attention"]
    chunk_steps: Optional[int] = None  # --chunk-steps: the Fast model's calls per chunk (None: the preset's)
    speed_explicit: frozenset = frozenset()  # the speed flags given on the command line (over a --speed preset)

    @property
    def speed_flags(self) -> SpeedFlags:
        """The effective speed flags: the --speed preset with the explicit flags over it, for these weights."""
        return SpeedFlags.given(self.speed, {"compile": self.compile, "compute": self.compute,
                                             "attention": self.attention}, self.speed_explicit, self.weights,
                                self.chunk_steps)


def _frozen(value):
    """Lists (nargs, append) as tuples, sets (the explicit speed flags) as frozensets."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, set):
        return frozenset(value)
    return value


def model_choices() -> tuple[str, ...]:
    """--model's names: base, then every causal model of the registry and its short aliases."""
    from ..world.models import causal_models

    names = [BASE]
    for e in causal_models():
        names += [e.name, *e.aliases]
    return tuple(names)


@dataclass(frozen=True)
class GenerateRequest(SpeedRequest):
    """Every `generate` flag under its argparse dest name (the flag tables of cli/checks.py look them up by that
    name; the speed flags and --weights are SpeedRequest's); lists become tuples so the request cannot change under a
    check."""

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
    memory_mode: str = "auto"
    blocks_on_gpu: Optional[int] = None
    t5_device: str = "auto"
    t5_timeout: Optional[float] = None
    no_text_cache: bool = False
    cache_dir: Optional[Path] = None
    vae_tiled: bool = False
    camera_cache: str = "auto"
    overlap: str = "auto"
    # flags given on the command line though equal to their default (Given)
    given_flags: frozenset = frozenset()
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

    # ---- new requests ------------------------------------------------------------------------------------------
    def with_demo_defaults(self) -> "GenerateRequest":
        """--demo: every input not given takes the demo's (image, prompt, camera or keys, size, frames, CPU, out)."""
        from ..world.controls import sets_its_length
        from ..world.demos import act_example, demo_inputs

        DEMO_IMAGE, DEMO_PROMPT = demo_inputs()
        actions, camera = self.actions, self.camera
        if self.demo == "act":  # the release's Act example input (action.npy + poses.npy)
            actions = actions or (None if camera else str(act_example()))
        elif not actions:
            camera = camera or DEMO_CAMERA
        frames = self.frames
        if frames is None and not sets_its_length(actions):
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


@dataclass(frozen=True)
class PlayRequest(SpeedRequest):
    """Every `play` flag under its argparse dest name (the speed flags and --weights are SpeedRequest's)."""

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
    kv_cache: str = "auto"
    device: str = "auto"
    noise: str = "auto"
    t5_device: str = "auto"
    cache_dir: Optional[Path] = None
    tiny_vae: Optional[Path] = None  # --tiny-vae: play with a tiny decoder (the render uses the VAE)
    no_preview: bool = False  # --no-preview: no chunk previews (made only with a tiny decoder)
    # server
    port: int = DEFAULT_PORT
    host: str = LOCAL_HOST
    no_browser: bool = False
    out_dir: Path = Path("lingbot_play")
    timings: Optional[Path] = None


@dataclass(frozen=True)
class CompareRequest(FlagRequest):
    """Every `compare` flag under its argparse dest name (FlagRequest.from_args reads them)."""

    # inputs
    model: str = "fast"
    ckpt_dir: Optional[Path] = None
    assets_dir: Optional[Path] = None
    demo: bool = False
    demo_dir: Optional[Path] = None
    image: Optional[Path] = None
    prompt: Optional[str] = None
    actions: Optional[str] = None
    # the comparison
    preset: tuple = ()  # the --preset specs, in order (empty: DEFAULT_PRESETS)
    chunks: int = DEFAULT_CHUNKS
    kv_drift: str = "on"
    tiny_vae: Optional[Path] = None
    # generation
    seed: int = 42
    size: Optional[str] = None
    weights: str = "nf4"
    kv_cache: str = "auto"
    device: str = "auto"
    noise: str = "auto"
    t5_device: str = "auto"
    cache_dir: Optional[Path] = None
    # outputs
    out_dir: Path = Path("lingbot_compare")
    quiet: bool = False

"""`generate`'s speed flags (--speed, --compile, --compute, --attention): parsed into SpeedOptions and checked
against the device before anything loads (speed/options.py and speed/presets.py do the work).

--speed names a preset (exact / fast / draft / auto); a flag given explicitly wins over the preset's value for it.
Without --speed the three flags alone decide, as before (their defaults are the `auto` preset's options).
--chunk-steps (Fast model) replaces the preset's denoising calls per chunk (draft: 3, the others: 4).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import NamedTuple, Optional

import torch

from ..speed.options import (
    ATTENTION_CHOICES,
    COMPILE_CHOICES,
    COMPUTE_CHOICES,
    DEFAULTS,
    SpeedOptions,
    SpeedPlan,
    resolve_speed,
)
from ..speed.levers import ChunkLevers
from ..speed.presets import CHUNK_STEP_CHOICES, PRESET_NAMES, PRESETS, attach_preset, preset_options

EXPLICIT = "speed_explicit"  # the namespace attribute naming the speed flags the user gave (cli/*_request.py)


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
                   help="speed preset: exact (eager, bf16, exact attention: the reference numerics), auto (the "
                        "fastest exact path for the card: compiled per-token work, bf16, exact attention), fast (FP8 "
                        "GEMMs on RTX 40xx/Hopper+, INT8 on RTX 30xx, exact attention, the Fast model's K/V cache in "
                        "FP8; approximate), draft (fast + 3 steps per chunk, the context pass folded into the last "
                        "step, a 15-frame K/V window and a bf16 VAE decode for the Fast model; for previews and "
                        "real-time play). --compile/--compute/--attention/--chunk-steps given explicitly override the "
                        "preset; a continuation without --speed runs the preset its video was made with")
    g.add_argument("--chunk-steps", type=int, choices=CHUNK_STEP_CHOICES, default=None,
                   help="Fast model: denoising calls per 12-frame chunk: 4 (the release's), 3 (the draft preset's) "
                        "or 2 (about a quarter faster than 3 with draft, rougher; for play on slower "
                        "cards); default: the --speed preset's, or on a continuation the continued video's")
    g.add_argument("--compile", choices=COMPILE_CHOICES, default=DEFAULTS["compile"], action=_Explicit,
                   help="torch.compile the DiT's per-token work: blocks, off, or auto (blocks on a CUDA GPU with "
                        "Triton; same results to bf16 rounding; the first run compiles, later runs use the cache in "
                        "~/.cache/lingbot-world/inductor)")
    g.add_argument("--compute", choices=COMPUTE_CHOICES, default=DEFAULTS["compute"], action=_Explicit,
                   help="GEMM precision of the NF4 linears: bf16 (exact, default), fp8 (RTX 40xx/Ada, Hopper+), "
                        "int8 (Ampere+), fp16acc (fp16 with fp16 accumulation: 2x on GeForce cards), or auto (fp8 "
                        "where the card has it, else int8 on Ampere, else bf16); all but bf16 change the output "
                        "slightly")
    g.add_argument("--attention", choices=ATTENTION_CHOICES, default=DEFAULTS["attention"], action=_Explicit,
                   help="attention kernel: auto (torch SDPA with the fastest exact kernel for the GPU: cuDNN on "
                        "Hopper, FlashAttention-2 on Ampere/Ada; with --compute fp8 on Hopper+ it picks fp8), sdpa "
                        "(the same, always exact), sage (SageAttention, approximate), flash (flash-attn package), "
                        "fp8 (cuDNN FP8 attention for the video self-attention: Hopper and newer with the "
                        "nvidia-cudnn-frontend package; ~1.6x faster attention, approximate), cudnn (exact bf16 "
                        "attention through nvidia-cudnn-frontend with cuDNN's fastest plan for each shape, timed on "
                        "the first call)")


def speed_plan(flags: "SpeedFlags", device: torch.device) -> SpeedPlan:
    """Resolve the flags for `device`. An explicit choice the machine cannot run raises SpeedOptionError (a
    ValueError: the CLI prints its one line as a bad-input error) before anything loads. Silent: the plan is
    logged by `log_speed_plan` once every other check has passed, so a bad input stays a one-line error.
    With --speed the preset's options apply (explicit flags over them) and the plan records the preset."""
    plan = resolve_speed(SpeedOptions(flags.compile, flags.compute, flags.attention), device, weights=flags.weights)
    return attach_preset(plan, flags.speed, flags.chunk_steps)


def log_speed_plan(plan: SpeedPlan, log: logging.Logger) -> None:
    for note in plan.notes:
        log.info("speed: %s", note)
    log.info("speed: %s", plan.summary())


def report_compile(plan: SpeedPlan, log: logging.Logger) -> None:
    """After sampling: how long compiling took (the warm-up a cached second run mostly skips)."""
    if plan.compile == "blocks":
        from ..speed.compile import STATS

        log.info("speed: %s", STATS.summary())


# A cached compile warm-up costs ~3.3 s (18.5 s the first time), and the compiled Fast chunk saves ~0.2 s of ~2.6
# (H100, 480p, BENCHMARKS "Fast model"): worth it from about 18 chunks. Below, `auto` runs the Fast model eagerly.
FAST_COMPILE_MIN_CHUNKS = 20


def fast_speed_plan(flags: "SpeedFlags", device: torch.device, chunks: int, before_compiler_check=None) -> SpeedPlan:
    """`speed_plan` + `fast_compile_policy` for a Fast video of `chunks` chunks, with --compile auto decided from the
    length first: a short video never asks whether the compiler can run, since that check imports torch._dynamo
    (seconds). Any other compile choice calls before_compiler_check() first (the CLI waits there for its
    background imports, which import torch._dynamo too: cli/heavy_imports.py)."""
    device = torch.device(device)
    if flags.compile == "auto" and chunks < FAST_COMPILE_MIN_CHUNKS and device.type == "cuda":
        plan = speed_plan(dataclasses.replace(flags, compile="off"), device)
        plan.notes.insert(0, _short_video_note(chunks))
        return plan
    if before_compiler_check is not None and (flags.compile == "blocks" or
                                              (flags.compile == "auto" and device.type == "cuda")):
        before_compiler_check()
    return fast_compile_policy(speed_plan(flags, device), flags, chunks)


@dataclasses.dataclass(frozen=True)
class SpeedFlags:
    """The effective --compile/--compute/--attention (a --speed preset folded in) and the weights they run on."""

    compile: str = DEFAULTS["compile"]
    compute: str = DEFAULTS["compute"]
    attention: str = DEFAULTS["attention"]
    weights: str = "nf4"
    speed: Optional[str] = None  # the preset's name, recorded on the plan
    chunk_steps: Optional[int] = None  # --chunk-steps over the preset's (None: the preset's, or 4)

    @classmethod
    def given(cls, speed: Optional[str], values: dict, explicit=(), weights: str = "nf4",
              chunk_steps: Optional[int] = None) -> "SpeedFlags":
        """From the flags' values: the --speed preset's options with the flags given explicitly (`explicit`) over
        them; without --speed the three values as they are."""
        if speed is not None:
            values = dataclasses.asdict(preset_options(speed, {k: values[k] for k in explicit}))
        return cls(values["compile"], values["compute"], values["attention"], weights, speed, chunk_steps)


def _short_video_note(chunks: int) -> str:
    return (f"compile auto: off for a Fast video of {chunks} chunks (building or loading the kernels takes longer "
            f"than they save below {FAST_COMPILE_MIN_CHUNKS} chunks, ~{4 * FAST_COMPILE_MIN_CHUNKS * 3} frames); "
            "--compile blocks forces it")


class FollowedSpeed(NamedTuple):
    speed: Optional[str]  # the continuation's --speed
    chunk_steps: Optional[int]  # and --chunk-steps
    note: Optional[str]  # what was followed, or how the choice differs from the video's; None: nothing to say
    differs: bool  # the choice differs from what the video was made with (the note is a warning)


def follow_started_speed(speed: Optional[str], chunk_steps: Optional[int], started_speed: str,
                         started_steps: int) -> FollowedSpeed:
    """A continuation's --speed and --chunk-steps: those given, else the preset and steps per chunk the video was
    made with (what its state records; "" / 0: not recorded), so the whole video is what one run of all its keys
    makes. The steps follow only with the preset: another --speed brings its own. A choice that differs from the
    video's runs as given, with a warning."""
    if not started_steps:
        return FollowedSpeed(speed, chunk_steps, None, False)  # a state from before these were recorded
    followed = []
    if speed is None and started_speed:
        speed = started_speed
        followed.append(f"--speed {started_speed}")
    preset_steps = PRESETS[speed].levers.steps if speed else ChunkLevers().steps
    if chunk_steps is None and (speed or "") == started_speed and started_steps != preset_steps:
        chunk_steps = started_steps
        followed.append(f"--chunk-steps {started_steps}")
    steps = chunk_steps or preset_steps
    if ((speed or ""), steps) != (started_speed, started_steps):
        made = " ".join(([f"--speed {started_speed}"] if started_speed else ["no --speed"])
                        + [f"--chunk-steps {started_steps}"])
        runs = " ".join(([f"--speed {speed}"] if speed else ["no --speed"]) + [f"--chunk-steps {steps}"])
        return FollowedSpeed(speed, chunk_steps, f"the continued video was made with {made}; this part runs {runs}, "
                             "so the whole video will not be what one run of all its keys makes", True)
    if followed:
        return FollowedSpeed(speed, chunk_steps, f"{' '.join(followed)}, as the continued video was made (the whole "
                             "video is then what one run of all its keys makes; give --speed / --chunk-steps to "
                             "choose otherwise)", False)
    return FollowedSpeed(speed, chunk_steps, None, False)


def follow_started_compile(plan: SpeedPlan, available: SpeedPlan, flags: SpeedFlags, started: str) -> SpeedPlan:
    """--compile auto on a continuation: the kernels the video was started with (its state records them), so the
    new part rounds as one run of the whole video would, whatever this part's length; `available` is the plan
    before the length policy (compile "blocks" there: the compiler runs here)."""
    if flags.compile != "auto" or started == plan.compile or started not in ("blocks", "off"):
        return plan
    if started == "blocks" and available.compile != "blocks":
        return plan  # the compiler does not run here: the exact path it gives instead is said by the plan
    notes = [n for n in plan.notes if not n.startswith("compile auto:")]
    notes.insert(0, f"compile auto: {started}, as the continued video was made (the same kernels keep the "
                    "continuation equal to one run of all its keys)")
    return dataclasses.replace(plan, compile=started, notes=notes)


def fast_compile_policy(plan: SpeedPlan, flags: SpeedFlags, chunks: int) -> SpeedPlan:
    """--compile auto for the Fast model: off for a video shorter than FAST_COMPILE_MIN_CHUNKS chunks (said why)."""
    if flags.compile != "auto" or plan.compile != "blocks" or chunks >= FAST_COMPILE_MIN_CHUNKS:
        return plan
    notes = [n for n in plan.notes if not n.startswith("compile auto:")]
    notes.insert(0, _short_video_note(chunks))
    return dataclasses.replace(plan, compile="off", notes=notes)

"""A run's speed plan from its speed flags: the preset folded in, checked against the device before anything loads
(speed/options.py and speed/presets.py do the work), and the policies a causal video adds on top.

`SpeedFlags` are the effective --compile / --compute / --attention: a --speed preset (exact / fast / draft / auto) with
the flags given explicitly over its values; without a preset the three flags alone decide (their defaults are the
`auto` preset's options). --chunk-steps (causal models) replaces the preset's denoising calls per chunk (draft: 3,
the others: 4). A causal video compiles only when it is long enough to pay for it (`fast_speed_plan`), and a
continuation follows the preset, steps and kernels its video was made with (`follow_started_speed`,
`follow_started_compile`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple, Optional

import torch

from .levers import ChunkLevers
from .options import DEFAULTS, SpeedOptions, SpeedPlan, resolve_speed
from .presets import PRESETS, attach_preset, preset_options


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
    if plan.compile in ("blocks", "graphs"):
        from .compile import STATS

        log.info("speed: %s", STATS.summary())


# A cached compile warm-up costs ~3.3 s (18.5 s the first time), and the compiled Fast chunk saves ~0.2 s of ~2.6
# (H100, 480p, BENCHMARKS "Fast model"): worth it from about 18 chunks. Below, `auto` runs the Fast model eagerly.
FAST_COMPILE_MIN_CHUNKS = 20


def fast_speed_plan(flags: "SpeedFlags", device: torch.device, chunks: int, before_compiler_check=None) -> SpeedPlan:
    """`speed_plan` + `fast_compile_policy` for a Fast video of `chunks` chunks, with --compile auto decided from the
    length first: a short video never asks whether the compiler can run, since that check imports torch._dynamo
    (seconds). Any other compile choice calls before_compiler_check() first (the CLI waits there for its
    background imports, which import torch._dynamo too: world/heavy_imports.py)."""
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
    explicit: tuple = ()  # the flags given explicitly (over a preset's values)

    @classmethod
    def given(cls, speed: Optional[str], values: dict, explicit=(), weights: str = "nf4",
              chunk_steps: Optional[int] = None) -> "SpeedFlags":
        """From the flags' values: the --speed preset's options with the flags given explicitly (`explicit`) over
        them; without --speed the three values as they are."""
        if speed is not None:
            values = dataclasses.asdict(preset_options(speed, {k: values[k] for k in explicit}))
        return cls(values["compile"], values["compute"], values["attention"], weights, speed, chunk_steps,
                   tuple(sorted(explicit)))

    def with_preset(self, speed: Optional[str], chunk_steps: Optional[int]) -> "SpeedFlags":
        """These flags under the preset `speed` and the steps per chunk `chunk_steps` (what a continuation follows,
        `follow_started_speed`): the same preset keeps its values; a preset where none was named folds its options
        in under the flags given explicitly, as `given` does."""
        if speed == self.speed:
            return dataclasses.replace(self, chunk_steps=chunk_steps)
        if self.speed is not None:
            raise ValueError(f"speed flags of the preset {self.speed!r} cannot take the preset {speed!r}")
        return SpeedFlags.given(speed, {"compile": self.compile, "compute": self.compute, "attention": self.attention},
                                self.explicit, self.weights, chunk_steps)


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
    if flags.compile != "auto" or started == plan.compile or started not in ("blocks", "off", "graphs"):
        return plan
    if started in ("blocks", "graphs") and available.compile != "blocks":
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

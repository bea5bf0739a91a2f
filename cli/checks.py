"""The pre-flight checks of the commands' flags: every check that needs no model file, run before any file is read
or anything starts; each problem is one UsageError line naming the flag, the value and what to use (exit code 2).

- NUMBERS: each numeric flag's range; a value out of range, NaN or infinite is one line naming the flag, the value
  and the range (a huge --seed, --fps 0, a negative timeout, --frames beyond the longest video).
- Text flags that may not be empty: `--actions ""` (an unset shell variable) would otherwise mean "no keys".
- The action string itself, parsed here so its message names --actions; LoRA strengths (`parse_spec`).
- Flags that do not apply to the chosen model or to a continuation, refused rather than silently ignored
  (`--save-state` without `--model fast` used to make a fresh base video and say nothing).
- The machine: the device and noise source asked for exist here (`resolve_device`, `noise_source`).
`check_base_flags(request)` / `check_causal_flags(request)` run them for `generate` (on the typed request,
cli/requests.py: the tables name each flag by its dest, the request's field); `play` and `compare` take the pieces
they need. What needs the model's files is checked by the world's assembly, the outputs by cli/outputs.py.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from ..world.sizes import MAX_FRAMES, MAX_LATENT_FRAMES, check_frames, max_area_for
from .errors import UsageError

if TYPE_CHECKING:
    from .requests import GenerateRequest

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")
STRENGTH_MAX = 100.0  # |strength| of a LoRA beyond this swamps the weights (and overflows bf16 towards inf)

SEED_MAX = 2**64 - 1  # torch generators take any unsigned 64-bit seed (the CUDA Philox seed is uint64)
FPS_MAX = 240
TIMEOUT_MAX_S = 30 * 24 * 3600.0  # 30 days: beyond it a timeout means "none" (and overflows datetime.timedelta)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Number:
    """A numeric flag's valid range (None: unbounded on that side); `hint` says what the values mean."""

    flag: str
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False  # low itself is not allowed
    hint: str = ""
    negative_means_random: bool = False  # --seed -1

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def bad(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if self.negative_means_random and value < 0:
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return True
        return self.high is not None and value > self.high

    def range_text(self) -> str:
        low = None if self.low is None else _number(self.low)
        high = None if self.high is None else _number(self.high)
        if low is not None and high is not None:
            text = f"more than {low} and at most {high}" if self.low_open else f"{low} .. {high}"
        elif low is not None:
            text = f"more than {low}" if self.low_open else f"{low} or more"
        else:
            text = f"at most {high}"
        return f"use {text}" + (f" ({self.hint})" if self.hint else "")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


NUMBERS = (
    Number("--seed", 0, SEED_MAX, hint="2**64-1, or a negative number for a random seed", negative_means_random=True),
    Number("--frames", 1, MAX_FRAMES, hint="4n+1; the longest video a run makes is 1 h 44 min at 16 fps"),
    Number("--fps", 1, FPS_MAX, hint="frames per second of the file; the model makes 16 fps video"),
    Number("--steps", 1, 10_000, hint="the reference uses 70, the Act model 20"),
    Number("--shift", 0, 1000, low_open=True, hint="the reference uses 10"),
    Number("--boundary", 0, 1, hint="the high-noise expert runs while t >= boundary*1000"),
    Number("--guide-scale", 0, 100, hint="1 = no guidance; the reference uses 5"),
    Number("--camera-speed", 0, 100, low_open=True, hint="a multiplier of the presets' speed"),
    Number("--blocks-on-gpu", 0, 1000),
    Number("--t5-timeout", 0, TIMEOUT_MAX_S, low_open=True, hint="seconds; leave the flag out for no limit"),
    Number("--parallel-timeout", 0, TIMEOUT_MAX_S, low_open=True, hint="seconds"),
    Number("--kv-layers-on-gpu", 0, 1000),
    Number("--max-attention", 1, INT32_MAX, hint="tokens; 1560 tokens = one latent frame at 480x832"),
    Number("--window", 0, MAX_LATENT_FRAMES, hint="latent frames; 0: the whole video"),
    Number("--sink", 0, MAX_LATENT_FRAMES, hint="latent frames"),
)

# Flags of the Fast model only, with their defaults: any other value without --model fast is refused.
FAST_ONLY = (("--continue-from", None), ("--save-state", None), ("--whole-video", None), ("--fast-model", None),
             ("--kv-cache", "auto"), ("--kv-layers-on-gpu", None), ("--max-attention", None), ("--window", None),
             ("--sink", None), ("--rule", "reference"), ("--stream-decode", "auto"), ("--chunk-steps", None),
             ("--tiny-vae", None), ("--assets-dir", None))
# Flags of the base model only: the Fast model runs 4 distilled steps per chunk without guidance.
BASE_ONLY = (("--steps", None), ("--guide-scale", (5.0,)), ("--boundary", 0.947), ("--solver", "unipc"),
             ("--cfg-mode", "auto"), ("--memory-mode", "auto"), ("--negative-prompt", None), ("--camera-cache", "auto"),
             ("--blocks-on-gpu", None), ("--high", None), ("--low", None))
LORA_FLAGS = (("--lora", ()), ("--lora-high", ()), ("--lora-low", ()))  # the request's tuples
EXPERT_LORA_FLAGS = LORA_FLAGS[1:]  # one expert of the base model's two
# What a continuation takes from the state it continues.
FROM_THE_STATE = (("--image", None), ("--size", "480*832"), ("--seed", 42), ("--noise", "auto"),
                  ("--rule", "reference"))


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _given(request: "GenerateRequest", table) -> list[str]:
    """The flags of `table` given on the command line: whose value differs from their default, or (flags that record
    it, requests.Given) given at all."""
    given = getattr(request, "given_flags", frozenset())
    return [flag for flag, default in table if getattr(request, _dest(flag)) != default or _dest(flag) in given]


def check_numbers(request: "GenerateRequest", numbers=NUMBERS) -> None:
    for rule in numbers:
        value = getattr(request, rule.dest)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and rule.bad(v):
                raise UsageError(f"{rule.flag} {v!r}: {rule.range_text()}")


def check_text_flags(request: "GenerateRequest") -> None:
    """--actions / --camera given as an empty (or blank) string, and the action string's grammar."""
    from ..world.controls import check_actions

    for flag in ("--actions", "--camera"):
        value = getattr(request, _dest(flag))
        if value is not None and not str(value).strip():
            raise UsageError(f"{flag} {value!r} is empty (an unset shell variable?); give keys such as 'w-8,a-4' or "
                             "a path" if flag == "--actions" else f"{flag} {value!r} is empty (an unset shell "
                             "variable?); give a trajectory folder or a preset such as dolly_in, or leave it out")
    actions = request.actions
    if actions:
        try:
            check_actions(actions)  # a .txt file's string is read and checked here too
        except (ValueError, OSError) as e:
            raise UsageError(f"--actions: {e}") from None


def check_lora_specs(request: "GenerateRequest") -> None:
    for flag, _ in LORA_FLAGS:
        for spec in getattr(request, _dest(flag)):
            parse_spec(spec, flag)


def parse_spec(spec: str, flag: str = "--lora") -> tuple[Path, float]:
    """FILE or FILE:STRENGTH -> (path, strength). An existing file whose name holds ':' is taken whole; a strength
    that is not a finite number in -100..100 is a UsageError naming the flag (nan would make every frame black)."""
    path, sep, strength = spec.rpartition(":")
    if not sep or not path or strength.startswith(("/", "\\")) or Path(spec).expanduser().is_file():
        return Path(spec), 1.0
    try:
        value = float(strength)
    except ValueError:
        raise UsageError(f"{flag} {spec}: strength {strength!r} is not a number; write FILE:STRENGTH, e.g. "
                         f"{path}:0.8") from None
    if not math.isfinite(value) or abs(value) > STRENGTH_MAX:
        raise UsageError(f"{flag} {spec}: strength {strength} must be a finite number from -{STRENGTH_MAX:g} to "
                         f"{STRENGTH_MAX:g} (1 = the LoRA as trained)")
    return Path(path), value


def check_model_flags(request: "GenerateRequest") -> None:
    """Flags that do not apply to the chosen model (or to a continuation) are refused with one line."""
    if request.model == "base":
        given = _given(request, FAST_ONLY)
        if given:
            raise UsageError(f"{given[0]} is a flag of the Fast model: add --model fast, or leave {given[0]} out")
        from ..world.base import BASE_WEIGHTS

        if request.weights not in BASE_WEIGHTS:
            raise UsageError(f"--weights {request.weights} is for the Fast model (add --model fast); the base "
                             "experts run with --weights nf4 or bf16")
        return
    given = _given(request, BASE_ONLY)
    if given:
        hint = "; --chunk-steps 2|3|4 sets its steps per chunk" if given[0] == "--steps" else ""
        raise UsageError(f"--model {request.model} does not take {given[0]} (a causal model runs its distilled steps "
                         f"per chunk without guidance); leave {given[0]} out{hint}")
    given = _given(request, EXPERT_LORA_FLAGS)
    if given:
        raise UsageError(f"{given[0]}: the Fast model is one model; use --lora FILE[:STRENGTH]")
    if request.tiny_vae is not None and request.stream_decode == "off":
        raise UsageError("--tiny-vae decodes each chunk as it is made (it needs about 1 GB beside the model); leave "
                         "--stream-decode off out")
    continuing = request.continue_from is not None
    if not continuing and request.whole_video is not None:
        raise UsageError("--whole-video writes the whole video of a continuation: it needs --continue-from")
    if continuing:
        given = _given(request, FROM_THE_STATE)
        if given:
            raise UsageError(f"{given[0]}: a continuation takes the image, size, seed, noise and rule from the state "
                             f"it continues; leave {given[0]} out")
    if request.camera and request.actions:
        raise UsageError("give either --camera (a trajectory) or --actions (keys), not both")


def check_generate_flags(request: "GenerateRequest") -> None:
    """Every check of `generate`'s flags that reads no model file (the model's flags, numbers, text, LoRA strengths,
    the cache folder)."""
    check_model_flags(request)
    check_numbers(request)
    check_text_flags(request)
    check_lora_specs(request)
    check_cache_dir(request.cache_dir)


def check_cache_dir(path: Optional[Path], flag: str = "--cache-dir") -> None:
    """--cache-dir names a folder, or a place one can be made: never a file (the prompt cache would be lost after
    minutes of encoding)."""
    if path is None:
        return
    p = Path(path).expanduser()
    there = next((q for q in (p, *p.parents) if q.exists()), None)
    if there is not None and not there.is_dir():
        what = "is a file" if there == p else f"is inside {there}, which is a file"
        raise UsageError(f"{flag} {path} {what}; give a folder for the prompt-embedding cache (made if missing)")


# ---- `generate` --------------------------------------------------------------------------------------------------
def check_base_flags(request: "GenerateRequest") -> None:
    """The base models' flags: values that are wrong whatever the machine (no I/O)."""
    check_generate_flags(request)
    if len(request.guide_scale) > 2:
        raise UsageError(f"--guide-scale takes one value or two (LOW HIGH), got {len(request.guide_scale)}")
    try:
        if request.frames is not None:  # None: 81, or as long as --actions
            check_frames(request.frames)
        max_area_for(request.size)
    except ValueError as e:
        flag = "--frames" if "frame" in str(e) else "--size"
        raise UsageError(f"{flag}: {e}") from None
    if request.image is None or request.prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    if request.demo and request.ckpt_dir is not None:
        raise UsageError("--demo and --ckpt-dir exclude each other: the demo uses its own tiny checkpoint")


def check_causal_flags(request: "GenerateRequest") -> None:
    """The causal models' flags, first thing (before the demo defaults, the parallel session or any import of the
    model's modules): what does not apply to them or to a continuation, every number's range, the action string,
    LoRA strengths, the size and frame count."""
    check_generate_flags(request)
    try:
        if request.frames is not None:
            check_frames(request.frames)
    except ValueError as e:
        raise UsageError(f"--frames: {e}") from None
    if request.continue_from is None:
        check_size(request.size, quote=False)


def warn_base_only_flags(request: "GenerateRequest", log) -> None:
    """The base model's own flags are refused before this (BASE_ONLY); --shift applies to a causal model but warns."""
    if request.shift != 10.0:
        log.warning("--shift %.3g: the Fast model was distilled at shift 10; other values change its timesteps",
                    request.shift)


# ---- every command -----------------------------------------------------------------------------------------------
def check_size(size: str, quote: bool = True) -> None:
    """--size names a pixel budget ("480*832", "720p")."""
    try:
        max_area_for(size)
    except ValueError as e:
        raise UsageError(f"--size {size!r}: {e}" if quote else f"--size: {e}") from None


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    """auto | cpu | cuda | cuda:N -> a device that exists here (UsageError otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = _DEVICE.fullmatch(name.strip().lower())
    if m is None:
        raise UsageError(f"{flag} {name!r}: use auto, cpu, cuda or cuda:N")
    if m.group(1) == "cpu":
        if m.group(2) is not None:
            raise UsageError(f"{flag} {name!r}: the CPU has no index; use cpu")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"{flag} {name}: no CUDA GPU is available here; use {flag} cpu")
    index = int(m.group(2)) if m.group(2) is not None else None
    if index is not None and index >= torch.cuda.device_count():
        raise UsageError(f"{flag} {name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 .. "
                         f"cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index) if index is not None else torch.device("cuda")


def noise_source(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "cuda" if device.type == "cuda" else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--noise cuda needs a CUDA GPU (it reproduces the reference's GPU noise); use --noise cpu")
    return choice


def check_t5_device(choice: str) -> None:
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--t5-device cuda: no CUDA GPU is available here; use --t5-device cpu or auto")

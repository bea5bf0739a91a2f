"""Every `generate` flag's constraints in one place, checked before any file is read or anything starts.

- NUMBERS: each numeric flag's range; a value out of range, NaN or infinite is one line naming the flag, the value
  and the range (a huge --seed, --fps 0, a negative timeout, --frames beyond the longest video).
- Text flags that may not be empty: `--actions ""` (an unset shell variable) would otherwise mean "no keys".
- The action string itself, parsed here so its message names --actions; LoRA strengths (cli/lora_run.parse_spec).
- Flags that do not apply to the chosen model or to a continuation, refused rather than silently ignored
  (`--save-state` without `--model fast` used to make a fresh base video and say nothing).
`check_generate_flags(request)` runs them all (on the typed request, cli/generate_request.py: the tables name
each flag by its dest, the request's field); the base path calls it from cli/preflight.py, the Fast path from its
request (cli/fast_request.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..wan.sizes import MAX_FRAMES, VAE_TEMPORAL_STRIDE
from .errors import UsageError

if TYPE_CHECKING:
    from .generate_request import GenerateRequest

SEED_MAX = 2**64 - 1  # torch generators take any unsigned 64-bit seed (the CUDA Philox seed is uint64)
FPS_MAX = 240
TIMEOUT_MAX_S = 30 * 24 * 3600.0  # 30 days: beyond it a timeout means "none" (and overflows datetime.timedelta)
INT32_MAX = 2**31 - 1
MAX_LATENT_FRAMES = (MAX_FRAMES - 1) // VAE_TEMPORAL_STRIDE + 1


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
    it, request_base.Given) given at all."""
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
    from ..loaders.action_files import action_string_of
    from ..wan.control.actions import parse_action_string

    for flag in ("--actions", "--camera"):
        value = getattr(request, _dest(flag))
        if value is not None and not str(value).strip():
            raise UsageError(f"{flag} {value!r} is empty (an unset shell variable?); give keys such as 'w-8,a-4' or "
                             "a path" if flag == "--actions" else f"{flag} {value!r} is empty (an unset shell "
                             "variable?); give a trajectory folder or a preset such as dolly_in, or leave it out")
    actions = request.actions
    if actions:
        try:
            text = action_string_of(actions)  # a .txt file's string is read and checked here too
            if text is not None:
                parse_action_string(text)
        except (ValueError, OSError) as e:
            raise UsageError(f"--actions: {e}") from None


def check_lora_specs(request: "GenerateRequest") -> None:
    from .lora_run import parse_spec

    for flag, _ in LORA_FLAGS:
        for spec in getattr(request, _dest(flag)):
            parse_spec(spec, flag)


def check_model_flags(request: "GenerateRequest") -> None:
    """Flags that do not apply to the chosen model (or to a continuation) are refused with one line."""
    if request.model == "base":
        given = _given(request, FAST_ONLY)
        if given:
            raise UsageError(f"{given[0]} is a flag of the Fast model: add --model fast, or leave {given[0]} out")
        if request.weights in LOWP_WEIGHTS:
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

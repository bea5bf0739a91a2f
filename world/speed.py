"""A run's speed as a door asks for it: the door reads its flags or widgets into `SpeedFlags` (a preset folded in,
the choices given explicitly over it) and gets the plan for its device here; the world's objects plan a causal
part's speed themselves (world/first_part.py, world/continuation.py). speed/options.py, speed/presets.py and
speed/plans.py do the work; this module is what the doors may see of it.
"""
from __future__ import annotations

import torch

from ..speed.options import (ATTENTION_CHOICES, COMPILE_CHOICES, COMPUTE_CHOICES, DEFAULTS, SpeedOptionError,
                             SpeedOptions, SpeedPlan, apply_speed)
from ..speed.plans import FAST_COMPILE_MIN_CHUNKS, SpeedFlags, fast_speed_plan, log_speed_plan, speed_plan
from ..speed.presets import CHUNK_STEP_CHOICES, PRESET_NAMES, PRESETS, preset_options

__all__ = ["ATTENTION_CHOICES", "CHUNK_STEP_CHOICES", "COMPILE_CHOICES", "COMPUTE_CHOICES", "DEFAULTS", "PRESETS",
           "PRESET_NAMES", "SpeedFlags", "SpeedOptionError", "SpeedOptions", "SpeedPlan", "apply_speed",
           "log_speed_plan", "played_speed_plan", "preset_options", "speed_plan"]


def played_speed_plan(flags: SpeedFlags, device: torch.device) -> SpeedPlan:
    """The plan of a causal video played live, or made as it is played (compare): a long video, so `--compile
    auto` compiles wherever the compiler runs."""
    return fast_speed_plan(flags, device, FAST_COMPILE_MIN_CHUNKS)

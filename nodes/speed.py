"""LingBot Speed Options: a speed preset, or compile, GEMM precision and attention kernel for the experts, checked
against the GPU when the node runs (before any expert loads) and applied by the Expert Loader's experts on every
load. The preset's chunk levers (draft) travel on the plan to the Fast model's chunk loop."""
from __future__ import annotations

import logging

from ..world.speed import (ATTENTION_CHOICES, CHUNK_STEP_CHOICES, COMPILE_CHOICES, COMPUTE_CHOICES, DEFAULTS,
                           PRESET_NAMES, PRESETS, SpeedFlags, SpeedOptionError, SpeedOptions, SpeedPlan,
                           preset_options, speed_plan)
from .adapters.payloads import CATEGORY, SPEED
from .adapters.progress import show_on_node

log = logging.getLogger(__name__)

CUSTOM = "custom"  # the speed widget's value that leaves the three widgets in charge
SPEED_CHOICES = (CUSTOM,) + PRESET_NAMES
# a widget's value that keeps the preset's choice (chunk_steps: draft 3, else 4; compile / compute / attention: the
# preset's, or with speed custom the defaults). Any other value is kept over the preset's, as a CLI flag is.
FROM_PRESET = "from preset"
CHUNK_STEP_WIDGET = (FROM_PRESET,) + tuple(str(n) for n in CHUNK_STEP_CHOICES)
FLAG_WIDGETS = {"compile": (FROM_PRESET,) + tuple(COMPILE_CHOICES), "compute": (FROM_PRESET,) + tuple(COMPUTE_CHOICES),
                "attention": (FROM_PRESET,) + tuple(ATTENTION_CHOICES)}
# What a workflow saved before `from preset` holds with a preset chosen (the widgets' old defaults, which the preset
# replaced): read as `from preset`, so those workflows run as they did.
SAVED_BEFORE = {name: DEFAULTS[name] for name in FLAG_WIDGETS}


def plan_speed(options: SpeedOptions, weights: str = "nf4", preset: str | None = None,
               chunk_steps: int | None = None) -> SpeedPlan:
    """Resolve options for ComfyUI's torch device (a preset's chunk levers, and chunk_steps over its step count,
    recorded on the plan); an explicit choice the GPU cannot run raises one line."""
    import comfy.model_management as mm

    try:
        flags = SpeedFlags(options.compile, options.compute, options.attention, weights, preset, chunk_steps)
        plan = speed_plan(flags, mm.get_torch_device())
    except SpeedOptionError as e:
        raise ValueError(f"LingBot Speed Options: {e}") from None
    for note in plan.notes:
        log.info("LingBot-World speed: %s", note)
    log.info("LingBot-World speed: %s", plan.summary())
    return plan


class LingBotSpeedOptions:
    """Speed settings for LingBot Expert Loader (without this node: compile auto, compute bf16, attention auto)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "compile": (list(FLAG_WIDGETS["compile"]), {"default": FROM_PRESET, "tooltip": (
                    "torch.compile of the DiT's per-token work (norms, modulation, RoPE, gated residuals). auto: on "
                    "when the GPU has Triton (for the v2 1.3B: graphs, compiled only into the CUDA graphs that "
                    "replay its blocks once its window rolls). The first run compiles (about a minute, shown in the "
                    "log); later runs load the kernels from ~/.cache/lingbot-world/inductor. Same results to bf16 "
                    f"rounding. from preset: the speed preset's (custom: {DEFAULTS['compile']}).")}),
                "compute": (list(FLAG_WIDGETS["compute"]), {"default": FROM_PRESET, "tooltip": (
                    "Precision of the big matrix multiplies. bf16: exact (the reference's). fp8: RTX 40xx / Ada, "
                    "Hopper and newer, faster, slightly different output. int8: Ampere (RTX 30xx) and newer, "
                    "faster, slightly different output. fp16acc: fp16 multiplies with fp16 accumulation, 2x on RTX "
                    "cards; the model then computes in fp16 (max 65504; its residual stream stays float32), slightly "
                    "different output. auto: the fastest the card has. from preset: the speed preset's (custom: "
                    f"{DEFAULTS['compute']}). For the v2 1.3B played in real time on an RTX 40xx: speed draft, "
                    "chunk_steps 2, compute fp16acc, attention sage.")}),
                "attention": (list(FLAG_WIDGETS["attention"]), {"default": FROM_PRESET, "tooltip": (
                    "auto / sdpa: torch's attention with the fastest exact kernel for the GPU (cuDNN on H100, "
                    "FlashAttention-2 on RTX cards). sage: SageAttention (installed separately; approximate, faster "
                    "on RTX 30xx/40xx; checked against sdpa on the first call). flash: the flash-attn package. fp8: "
                    "cuDNN FP8 attention for the video tokens (H100 and newer, pip install nvidia-cudnn-frontend; "
                    "approximate, ~1.6x faster attention); auto picks it when compute is fp8 on such a GPU. cudnn: "
                    "exact, through the same package, with cuDNN's fastest plan for each shape. from preset: the "
                    f"speed preset's (custom: {DEFAULTS['attention']}).")}),
            },
            "optional": {
                "speed": (list(SPEED_CHOICES), {"default": CUSTOM, "tooltip": (
                    "A speed preset; the three settings above left at 'from preset' take its choices, one set to "
                    "anything else is kept over it (as a CLI flag over --speed; all three at auto / bf16 / auto, "
                    "as workflows saved before 'from preset' hold them, take the preset's). "
                    + " ".join(f"{name}: {PRESETS[name].summary}." for name in PRESET_NAMES)
                    + " The draft levers apply to the Fast model's chunks.")}),
                "chunk_steps": (list(CHUNK_STEP_WIDGET), {"default": FROM_PRESET, "tooltip": (
                    "Fast model only: denoising calls per 12-frame chunk. from preset: 3 with draft, else 4 (the "
                    "release's). 2: about a quarter faster than draft's 3 on an H100, rougher; for play on "
                    "slower cards.")}),
            },
        }

    RETURN_TYPES = (SPEED,)
    RETURN_NAMES = ("speed",)
    OUTPUT_TOOLTIPS = ("Speed settings; connect to LingBot Expert Loader's speed input",)
    FUNCTION = "choose"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Chooses torch.compile, FP8/INT8 matrix multiplies and the attention kernel for the LingBot-World "
                   "experts; refuses a choice this GPU cannot run before anything loads.")

    def choose(self, compile: str = FROM_PRESET, compute: str = FROM_PRESET, attention: str = FROM_PRESET,
               speed: str = CUSTOM, chunk_steps: str = FROM_PRESET):
        if str(chunk_steps) not in CHUNK_STEP_WIDGET:
            raise ValueError(f"LingBot Speed Options: chunk_steps={chunk_steps!r}; choose one of "
                             f"{', '.join(CHUNK_STEP_WIDGET)}")
        widgets = {"compile": compile, "compute": compute, "attention": attention}
        for name, value in widgets.items():
            if value not in FLAG_WIDGETS[name]:
                raise ValueError(f"LingBot Speed Options: {name}={value!r}; choose one of "
                                 f"{', '.join(FLAG_WIDGETS[name])}")
        given = {name: value for name, value in widgets.items() if value != FROM_PRESET}
        if speed != CUSTOM and widgets == SAVED_BEFORE:
            given = {}
        steps = None if str(chunk_steps) == FROM_PRESET else int(chunk_steps)
        if speed == CUSTOM:
            plan = plan_speed(SpeedOptions(**{**DEFAULTS, **given}), chunk_steps=steps)
        elif speed in PRESETS:
            plan = plan_speed(preset_options(speed, given), preset=speed, chunk_steps=steps)
        else:
            raise ValueError(f"LingBot Speed Options: speed={speed!r} is not a preset; choose one of "
                             f"{', '.join(SPEED_CHOICES)}")
        show_on_node("\n".join([plan.summary()] + list(plan.notes)))  # what auto picked on this GPU, and why
        return (plan,)

"""The experts: LingBot Expert Loader (the two DiT experts, lazy: loaded by the sampler phase by phase) and LingBot
Experts From Models (two LingBot MODELs, with their LoRAs, as the experts of the reference-exact LingBot Sampler)."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..world.detect import check_control_pair, check_model_kind, detect_format
from .adapters import comfy_paths, host_memory, model_check, model_fetch
from .adapters.comfy_paths import _expert_combo
from .adapters.expert_weights import ExpertWeights, compute_dtype_for
from .adapters.payloads import CATEGORY, EXPERTS, MEMORY_MODES, SPEED, WEIGHT_MODES, ExpertPair
from .adapters.ui_hints import short_labels, show_if
from .model import lingbot_patcher

log = logging.getLogger(__name__)

MAX_BLOCKS = 40


def check_expert_pair(high: Path, low: Path, fmt_high, fmt_low) -> None:
    """Refuse pairs that cannot work together; the message says which choice to change."""
    if high.resolve() == low.resolve():
        raise ValueError(f"high- and low-noise expert are the same ({high}); pick the low_noise_model for the second")
    a, b = fmt_high.config, fmt_low.config
    for field in ("dim", "num_layers", "in_dim", "out_dim", "text_dim", "text_len", "patch_size"):
        if getattr(a, field) != getattr(b, field):
            raise ValueError(
                f"the two experts do not belong together: {field} is {getattr(a, field)} in {high} but "
                f"{getattr(b, field)} in {low}"
            )
    check_control_pair(fmt_high, fmt_low)  # a Cam expert with an Act one
    note = model_check.swapped_experts_note(high, low)
    if note:
        log.warning("LingBot-World: %s", note)
        from .adapters.progress import show_on_node

        show_on_node(note)  # on the loader, where the choice is made


class LingBotExpertLoader:
    """Pick the high- and low-noise experts. Nothing is loaded here: the sampler loads each expert right
    before its phase through ComfyUI's model management."""

    @classmethod
    def INPUT_TYPES(cls):
        experts = comfy_paths.list_experts()
        high_names, high_opts = _expert_combo(experts, "high")
        low_names, low_opts = _expert_combo(experts, "low")
        return {
            "required": {
                "high_noise_expert": (high_names, {**high_opts, **short_labels(), "tooltip": (
                    "High-noise expert (first steps, t >= boundary): the release's folder (e.g. "
                    "lingbot-world-base-cam/high_noise_model, read through its NF4 copy, made beside it on the first "
                    "load), an NF4 folder (config.json + model.safetensors), or a single .safetensors file, from "
                    "models/lingbot_world or models/diffusion_models. Not installed: turn on download.")}),
                "low_noise_expert": (low_names, {**low_opts, **short_labels(), "tooltip": (
                    "Low-noise expert (remaining steps), same kinds of files as the high-noise one.")}),
                "weights": (list(WEIGHT_MODES), {"default": "nf4", "tooltip": (
                    "nf4: 4-bit weights on the GPU (about 9.6 GB per expert; float files are quantized while "
                    "loading). bf16: plain bf16 weights (37 GB per expert; for large GPUs and comparisons).")}),
                "memory_mode": (list(MEMORY_MODES), {"default": "auto", "tooltip": (
                    "auto: keep both experts on the GPU when they fit, else release the high-noise one before the "
                    "low-noise one loads. resident: keep both loaded between runs. swap: one expert on the GPU at a "
                    "time, the other dropped (re-read from disk). swap_pinned: like swap but the released expert "
                    "waits in pinned RAM (fast switch, about 10 GB of RAM). block_swap: stream DiT blocks from RAM "
                    "(12-16 GB GPUs).")}),
                "blocks_on_gpu": ("INT", {"default": -1, "min": -1, "max": MAX_BLOCKS, "step": 1,
                                          **show_if(memory_mode=["block_swap"]), "tooltip": (
                    "block_swap only: how many of the 40 DiT blocks stay on the GPU (the rest stream from pinned "
                    "RAM during each step); -1 = as many as fit, planned from free VRAM.")}),
            },
            "optional": {
                "speed": (SPEED, {"tooltip": (
                    "From LingBot Speed Options (torch.compile, FP8/INT8 matrix multiplies, attention kernel). "
                    "Unconnected: compile auto, compute bf16, attention auto.")}),
                "download": model_fetch.DOWNLOAD,
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, high_noise_expert=None, low_noise_expert=None, download=None):
        return model_check.expert_pair(high_noise_expert, low_noise_expert, download)

    RETURN_TYPES = (EXPERTS,)
    RETURN_NAMES = ("experts",)
    OUTPUT_TOOLTIPS = ("The two experts, loaded on demand by LingBot Sampler",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Selects the two LingBot-World DiT experts (NF4 or bf16) and how they share GPU memory."

    def load(self, high_noise_expert: str, low_noise_expert: str, weights: str = "nf4", memory_mode: str = "auto",
             blocks_on_gpu: int = -1, speed=None, download: bool = False):
        import comfy.model_management as mm

        from ..world.speed import SpeedOptions
        from .adapters.patchers import ExpertContainer, ExpertPatcher
        from .speed import plan_speed

        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        if not -1 <= int(blocks_on_gpu) <= MAX_BLOCKS:
            raise ValueError(f"blocks_on_gpu must be between -1 (plan it) and {MAX_BLOCKS}, got {blocks_on_gpu}")
        device = mm.get_torch_device()
        reads = [model_fetch.read_folder(name, widget, weights, bool(download), device) for name, widget in
                 ((high_noise_expert, "high_noise_expert"), (low_noise_expert, "low_noise_expert"))]
        high, low = reads[0].path, reads[1].path
        if any(r.said.startswith(("made", "read the")) for r in reads):
            from .adapters.progress import show_on_node

            show_on_node(f"high-noise: {reads[0].said}; low-noise: {reads[1].said}")
        fmt_high, fmt_low = detect_format(high), detect_format(low)  # header checks only: wrong files fail here
        for fmt in (fmt_high, fmt_low):
            note = check_model_kind(fmt, "base")  # the Fast model belongs in LingBot Fast Model Loader
            if note:
                log.warning("LingBot-World: %s", note)
        check_expert_pair(high, low, fmt_high, fmt_low)
        if memory_mode == "block_swap" and int(blocks_on_gpu) > fmt_high.config.num_layers:
            raise ValueError(f"blocks_on_gpu={blocks_on_gpu} but these experts have {fmt_high.config.num_layers} blocks")

        if speed is None:
            speed = plan_speed(SpeedOptions(), weights)
        elif speed.compute != "bf16" and weights != "nf4":
            raise ValueError(f"LingBot Speed Options asks for compute={speed.compute}, which works with NF4 weights; "
                             f"set weights to nf4 or compute to bf16")
        patchers = {}
        for name, fmt in (("high", fmt_high), ("low", fmt_low)):
            w = ExpertWeights(name, fmt, weights, keep_in_ram=memory_mode == "swap_pinned", speed=speed)
            host_memory.track(w)  # dropped with ComfyUI's node cache: give its host copies back to the OS
            patchers[name] = ExpertPatcher(ExpertContainer(w, compute_dtype_for(device, weights)), device,
                                           torch.device("cpu"), size=w.device_bytes(device))
        log.info("LingBot-World experts: high=%s (%s), low=%s (%s), weights=%s, memory_mode=%s",
                 high, fmt_high.kind, low, fmt_low.kind, weights, memory_mode)
        return (ExpertPair(patchers["high"], patchers["low"], {"high": fmt_high, "low": fmt_low}, weights,
                           memory_mode, int(blocks_on_gpu), speed),)


class LingBotExpertsFromModels:
    """Two LingBot MODELs (with their LoRAs) -> the LINGBOT_EXPERTS that LingBot Sampler takes."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "high_noise_model": ("MODEL", {"tooltip": "The high-noise expert (LingBot NF4 Model Loader, LoRAs)"}),
                "low_noise_model": ("MODEL", {"tooltip": "The low-noise expert"}),
                "memory_mode": (list(MEMORY_MODES), {"default": "auto", "tooltip": (
                    "As in LingBot Expert Loader: auto, resident (both stay loaded), swap (one at a time), "
                    "swap_pinned (the other waits in pinned RAM), block_swap (blocks streamed from RAM).")}),
                "blocks_on_gpu": ("INT", {"default": -1, "min": -1, "max": MAX_BLOCKS, "step": 1,
                                          **show_if(memory_mode=["block_swap"]), "tooltip": (
                    "block_swap only: DiT blocks kept on the GPU; -1 = as many as fit.")}),
            }
        }

    RETURN_TYPES = (EXPERTS,)
    RETURN_NAMES = ("experts",)
    OUTPUT_TOOLTIPS = ("The two experts for LingBot Sampler (their LoRAs included; ModelSamplingSD3 and other "
                       "sampling patches do not apply there: LingBot Sampler has its own shift and schedule)",)
    FUNCTION = "build"
    CATEGORY = CATEGORY
    DESCRIPTION = "Hands two LingBot-World MODELs (e.g. with LoRAs) to the reference-exact LingBot Sampler."

    def build(self, high_noise_model, low_noise_model, memory_mode: str = "auto", blocks_on_gpu: int = -1):
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        high = lingbot_patcher(high_noise_model, "high_noise_model")
        low = lingbot_patcher(low_noise_model, "low_noise_model")
        fh, fl = high.weights.fmt, low.weights.fmt
        check_expert_pair(fh.path, fl.path, fh, fl)
        if high.weights.mode != low.weights.mode:
            raise ValueError(f"the two experts are loaded with different weights ({high.weights.mode} / "
                             f"{low.weights.mode}); choose the same in both LingBot NF4 Model Loaders")
        if memory_mode == "block_swap" and int(blocks_on_gpu) > fh.config.num_layers:
            raise ValueError(f"blocks_on_gpu={blocks_on_gpu} but these experts have {fh.config.num_layers} blocks")
        if memory_mode == "swap_pinned":
            high.weights.keep_in_ram = low.weights.keep_in_ram = True
        return (ExpertPair(high, low, {"high": fh, "low": fl}, high.weights.mode, memory_mode, int(blocks_on_gpu)),)

"""Loader nodes: the two DiT experts (lazy: loaded by the sampler phase by phase) and the Wan VAE."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..loaders.expert_format import check_control_pair, check_model_kind, detect_format
from ..loaders.vae_files import load_vae
from ..loaders.vae_shapes import vae_config_for_file
from .adapters import comfy_paths, demo_models, host_memory, model_check
from .adapters.expert_weights import ExpertWeights, compute_dtype_for
from .adapters.payloads import CATEGORY, EXPERTS, MEMORY_MODES, SPEED, VAE, WEIGHT_MODES, ExpertPair, VAEHandle
from .adapters.ui_hints import short_labels, show_if

log = logging.getLogger(__name__)

MAX_BLOCKS = 40


def _combo(names: list[str], *hints: str, avoid: tuple = ()) -> tuple:
    from ..loaders.model_folders import pick_default

    opts: dict = {}
    installed = [n for n in names if not demo_models.is_demo_entry(n)]  # a real install first, the demo last
    default = pick_default(installed, *hints, avoid=avoid) or pick_default(names, *hints, avoid=tuple(avoid) + ("act",))
    if default is not None:
        opts["default"] = default
    return names, opts


def _expert_combo(names: list[str], *hints: str) -> tuple:
    """An expert combo whose default is a Cam expert when Act experts are installed too (a folder with the word
    'act', like the release's lingbot-world-base-act): a new graph starts from the camera workflows, and an Act
    expert refuses a camera input. An Act-only install still gets its Act experts."""
    return _combo(names, *hints, avoid=("act",))


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
                    "High-noise expert (first steps, t >= boundary): a folder with config.json + model.safetensors "
                    "(e.g. high_noise_model_bnb_nf4), the official sharded folder, or a single .safetensors file, "
                    "from models/lingbot_world or models/diffusion_models.")}),
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
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, high_noise_expert=None, low_noise_expert=None):
        return model_check.expert_pair(high_noise_expert, low_noise_expert)

    RETURN_TYPES = (EXPERTS,)
    RETURN_NAMES = ("experts",)
    OUTPUT_TOOLTIPS = ("The two experts, loaded on demand by LingBot Sampler",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Selects the two LingBot-World DiT experts (NF4 or bf16) and how they share GPU memory."

    def load(self, high_noise_expert: str, low_noise_expert: str, weights: str = "nf4", memory_mode: str = "auto",
             blocks_on_gpu: int = -1, speed=None):
        import comfy.model_management as mm

        from ..speed.options import SpeedOptions
        from .adapters.patchers import ExpertContainer, ExpertPatcher
        from .speed import plan_speed

        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        if not -1 <= int(blocks_on_gpu) <= MAX_BLOCKS:
            raise ValueError(f"blocks_on_gpu must be between -1 (plan it) and {MAX_BLOCKS}, got {blocks_on_gpu}")
        high = comfy_paths.resolve_expert(high_noise_expert, "high-noise expert")
        low = comfy_paths.resolve_expert(low_noise_expert, "low-noise expert")
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
        device = mm.get_torch_device()
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


class LingBotVAELoader:
    """The Wan2.1 VAE (release `Wan2.1_VAE.pth` or ComfyUI's `wan_2.1_vae.safetensors`), kept in float32."""

    @classmethod
    def INPUT_TYPES(cls):
        vaes = comfy_paths.list_vaes()
        names, opts = _combo(vaes, "wan")
        return {
            "required": {
                "vae_name": (names, {**opts, **short_labels(), "tooltip": (
                    "Wan 2.1 VAE: wan_2.1_vae.safetensors (Comfy-Org/Wan_2.1_ComfyUI_repackaged) in models/vae, or "
                    "the release's Wan2.1_VAE.pth in models/lingbot_world.")}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, vae_name=None):
        return model_check.vae(vae_name)

    RETURN_TYPES = (VAE,)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("The Wan2.1 VAE, moved to the GPU by ComfyUI when an encode/decode needs it",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Loads the Wan2.1 video VAE used by LingBot-World (float32, exact reference maths)."

    def load(self, vae_name: str):
        import comfy.model_management as mm
        import comfy.model_patcher

        from .adapters.patchers import VAEContainer

        path = comfy_paths.resolve_vae(vae_name)
        cfg = vae_config_for_file(path)
        vae = load_vae(path, device=mm.vae_offload_device(), config=cfg)
        host_memory.track(vae)
        patcher = comfy.model_patcher.ModelPatcher(VAEContainer(vae), mm.vae_device(), mm.vae_offload_device())
        return (VAEHandle(patcher, path),)

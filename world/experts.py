"""A base world's two experts: where they live (memory/expert_plan.py's plan, memory/placement.py's provider), the
LoRAs put on each right after it loads, the camera layers' cache the memory plan leaves room for, and each rank's
share of the tokens.

The LoRA files are read and matched against the experts' config before anything expensive runs (a LoRA for another
model, or a pickle, stops there with one line naming where it was given). They go on each expert right after it
loads (`quant.lora.apply_lora`: low-rank terms next to the NF4 linears), whatever the memory mode.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

if TYPE_CHECKING:
    from ..loaders.lora_files import LoraSet

# The LoRA modules are imported when a LoRA is given: they import bitsandbytes (seconds), which a causal run imports
# on a background thread (world/heavy_imports.py) and the CLI's parser must not import first.

log = logging.getLogger(__name__)


def read_expert_loras(loras: Sequence, config) -> dict[str, list[tuple["LoraSet", float]]]:
    """{"high": [(lora, strength), ...], "low": [...]} of the ExpertLora items (world/settings.py), in their order;
    a bad file is a LoraFileError naming where it was given."""
    out: dict[str, list] = {"high": [], "low": []}
    if not loras:
        return out
    from ..loaders.lora_files import LoraFileError, dit_weight_shapes, load_lora

    shapes = dit_weight_shapes(config)
    cache: dict[Path, "LoraSet"] = {}
    for lora in loras:
        path = Path(lora.path)
        if path not in cache:
            try:
                cache[path] = load_lora(path, shapes)
            except LoraFileError as e:
                raise LoraFileError(f"{lora.flag} {lora.spec}: {e}") from None
            log.info("LoRA %s", cache[path].report())
        for name in lora.experts:
            out[name].append((cache[path], lora.strength))
    return out


def lora_loader(loras: dict[str, list], paths: dict[str, Path], base: Optional[Callable] = None) -> Optional[Callable]:
    """A `make_provider(loader=...)` that loads an expert, then puts its LoRAs on it; None without LoRAs."""
    if not any(loras.values()):
        return None
    from ..loaders.lora_files import lora_hooks
    from ..memory.placement import _default_loader
    from ..quant.lora import apply_lora
    from ..quant.nf4_format import nf4_linear_names

    base = base or _default_loader
    by_path = {str(Path(p)): name for name, p in paths.items()}

    def load(path, device, mode, compute_dtype, host=None):
        model = base(path, device=device, mode=mode, compute_dtype=compute_dtype, host=host)
        chosen = loras.get(by_path.get(str(Path(path)), ""), [])
        if chosen:
            hooks, plain = lora_hooks(chosen, nf4_linear_names(model.cfg.num_layers))
            applied = apply_lora(model, hooks, plain, dtype=compute_dtype, device=device)
            log.info("%d LoRA(s) on %s: %d linears, %d other tensors", len(chosen), path, len(applied.hooked),
                     len(plain))
        return model

    return load


def expert_provider(settings, files, device: torch.device, video: tuple[int, int, int], with_camera: bool,
                    session, cfg_mode: str, loader: Optional[Callable], log: logging.Logger):
    """The ExpertProvider of the run (memory/placement.make_provider): the memory mode's plan for `video` (frames,
    height, width), each expert prepared with the speed plan and this rank's share of the tokens when it is placed."""
    from ..memory.placement import make_provider
    from ..parallel.ranks import attach
    from ..speed.options import apply_speed

    speed = settings.speed

    def prepare_model(model):
        if speed is not None:
            apply_speed(model, speed)
        attach(session, model)  # this rank's share of the tokens (Ulysses)

    return make_provider(
        settings.memory_mode, files.high, files.low, device, weights=settings.weights,
        blocks_on_gpu=settings.blocks_on_gpu, video=video, cfg_mode=cfg_mode, camera=with_camera, log=log,
        loader=loader, prepare=prepare_model, seq_parallel=session.sp_degree,
    )


def camera_cache(settings, config, device: torch.device, video: tuple[int, int, int], with_camera: bool, steps: int,
                 cfg_mode: str, plan, session, log: logging.Logger):
    """The camera FiLM cache the memory plan leaves room for (memory/camera_cache.py), logged in one line."""
    from ..memory.camera_cache import camera_cache_for_run
    from ..quant.nf4_format import default_compute_dtype

    cdt = torch.bfloat16 if settings.weights == "bf16" else default_compute_dtype(device)
    return camera_cache_for_run(
        settings.camera_cache, video, config, plan, camera=with_camera, steps=steps, cfg_mode=cfg_mode, device=device,
        compute_bytes=torch.empty(0, dtype=cdt).element_size(), seq_parallel=session.sp_degree,
        log=lambda line: log.info("camera cache: %s", line))

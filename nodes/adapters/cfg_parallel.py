"""The LingBot Sampler's `cfg_parallel` option: CFG's two passes on two local GPUs inside ComfyUI's one process.

ComfyUI's model management owns one device (`get_torch_device()`): the experts load there through the usual
ExpertPatcher / load_models_gpu path and run the conditional pass. The second GPU gets its own copy of the current
expert, placed by the pack's memory planner for that GPU's free VRAM (memory/placement.py: resident, swap or block
swap, the same modes as the CLI) and driven from a worker thread (parallel/local_cfg.py); it runs the unconditional
pass at the same time. ComfyUI does not know about that copy, so it lives only for the sampler run: it is loaded
when the run starts (and at the expert switch), and freed when the run ends, is cancelled or fails. Cost: the
second GPU holds one expert (9.6 GB in NF4; both experts, 19.2 GB, when its plan is resident) plus one pass's
activations; nothing stays on it between runs. LoRAs on the experts (ComfyUI patches, e.g. LoraLoaderModelOnly on
a LingBot MODEL) are put on the second copy too (`quant.lora`, merged or on the fly as on the main copy), so both
passes see the same model. No ComfyUI imports at module level: the node passes its model management in.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ...parallel.local_cfg import TwoDeviceCFG

log = logging.getLogger(__name__)

CHOICES = ("off", "auto") + tuple(f"cuda:{i}" for i in range(8))


def second_device(choice: str, main_device) -> Optional[torch.device]:
    """The GPU for the unconditional pass, or None for "off". One line when the choice cannot work."""
    if choice not in CHOICES:
        raise ValueError(f"cfg_parallel must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "off":
        return None
    main = torch.device(main_device)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if main.type != "cuda" or count < 2:
        raise ValueError(f"cfg_parallel {choice}: needs two CUDA GPUs visible to ComfyUI, this one sees {count} (runs on "
                         f"{main}); note that ComfyUI's --cuda-device hides the other GPUs. Set cfg_parallel to off")
    main_index = main.index if main.index is not None else torch.cuda.current_device()
    if choice == "auto":
        others = [i for i in range(count) if i != main_index]
        free = {i: torch.cuda.mem_get_info(i)[0] for i in others}
        return torch.device("cuda", max(others, key=lambda i: free[i]))
    dev = torch.device(choice)
    if dev.index >= count:
        raise ValueError(f"cfg_parallel {choice}: ComfyUI sees {count} GPUs, cuda:0 .. cuda:{count - 1}")
    if dev.index == main_index:
        raise ValueError(f"cfg_parallel {choice} is ComfyUI's own device (the conditional pass runs there); choose "
                         "another GPU")
    return dev


def two_device_provider(main_provider, experts, device: torch.device, video: tuple[int, int, int], camera: bool
                        ) -> TwoDeviceCFG:
    """Wrap the sampler's ComfyUI provider: the second GPU's copy of each expert is placed by the pack's planner."""
    from ...memory.placement import make_provider
    from ...world.speed import apply_speed

    speed = experts.speed if experts.speed is not None else experts.high.weights.speed
    blocks = experts.blocks_on_gpu if experts.blocks_on_gpu >= 0 else None
    second = make_provider(
        experts.memory_mode, experts.formats["high"].path, experts.formats["low"].path, device,
        weights=experts.weights, blocks_on_gpu=blocks, video=video, cfg_mode="sequential", camera=camera,
        log=lambda line: log.info("LingBot-World CFG on %s: %s", device, line), loader=_patched_loader(experts),
        prepare=None if speed is None else (lambda model: apply_speed(model, speed)))
    log.info("LingBot-World: CFG-parallel, the unconditional pass on %s (%s)", device, second.plan.reason)
    return TwoDeviceCFG(main_provider, second, device)


def _patched_loader(experts):
    """A `make_provider(loader=...)` that puts each expert's ComfyUI patches (its LoRAs) on the second copy; None
    when neither expert has any."""
    patches = {name: dict(experts.patcher(name).patches) for name in ("high", "low")}
    if not any(patches.values()):
        return None
    merge = bool(getattr(experts.high.weights, "lora_merge", False))
    by_path: dict[str, dict] = {}
    for name in ("high", "low"):
        path = str(experts.formats[name].path)
        if path in by_path and experts.high.patches_uuid != experts.low.patches_uuid:
            raise ValueError("cfg_parallel: the two experts are the same file with different LoRAs, which the second "
                             "GPU's copy cannot tell apart; set cfg_parallel to off")
        by_path[path] = patches[name]
    from ...memory.placement import _default_loader
    from ...quant.lora import apply_lora
    from .lora_patches import hooks_from_patches

    def load(path, device, mode, compute_dtype, host=None):
        model = _default_loader(path, device=device, mode=mode, compute_dtype=compute_dtype, host=host)
        chosen = by_path.get(str(path))
        if chosen:
            hooks, plain = hooks_from_patches(chosen, model)
            # merged like the main copy when the loader node asked for it, unless blocks stream from RAM (host)
            apply_lora(model, hooks, plain, merge_linears=merge and host is None, dtype=compute_dtype, device=device)
        return model

    return load

"""Dual-expert sampling loop of LingBot-World (spec §5.5).

High-noise expert while t >= boundary*1000, then the low-noise expert; classifier-free guidance per expert in
float32; the same camera tensor for both CFG passes. Expert placement is delegated to an `ExpertProvider`
so ComfyUI's model management (nodes/) and plain policies (CLI) can both drive it.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch
import torch.nn as nn

from .expert_schedule import expert_for_timestep
from .schedulers import make_scheduler

log = logging.getLogger(__name__)

EXPERTS = ("high", "low")
CFG_MODES = ("auto", "batch", "layered", "sequential")


class ExpertProvider(Protocol):
    """Places experts on the compute device for the sampler.

    `acquire(name)` returns the expert ready to run ("high" or "low"); `release(name)` tells the provider the
    sampler is done with it for now (it may keep it resident, move it off the GPU or drop it).
    """

    def acquire(self, name: str) -> nn.Module: ...

    def release(self, name: str) -> None: ...


class Cancelled(Exception):
    """Raised when the cancel check asks the sampler to stop."""


@dataclass
class SamplingSettings:
    steps: int = 70
    shift: float = 10.0
    boundary: float = 0.947
    guide_high: float = 5.0
    guide_low: float = 5.0
    solver: str = "unipc"
    # "batch" (cond+uncond as one batch of 2), "layered" (one after the other inside each block, sharing the camera
    # FiLM and each layer's weight preparation), "sequential" (two forwards), "auto" (the memory planner's choice)
    cfg_mode: str = "auto"
    num_train_timesteps: int = 1000

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0.0 < self.boundary <= 1.0:
            raise ValueError(f"boundary must be in (0, 1], got {self.boundary}")
        if self.cfg_mode not in CFG_MODES:
            raise ValueError(f"cfg_mode must be one of {', '.join(CFG_MODES)}; got {self.cfg_mode!r}")


@dataclass
class StepInfo:
    index: int  # 0-based step just finished
    total: int
    timestep: int
    expert: str
    x0: torch.Tensor  # current clean-latent estimate [1, 16, F, H, W] (normalised latent space)


def make_noise(shape: Sequence[int], seed: int, source: str = "cpu", device=None) -> torch.Tensor:
    """Initial latent noise, float32.

    The reference draws `randn(16, F, H, W)` from a CUDA generator seeded with `seed` (Philox), so
    `source="cuda"` is reference-exact on a GPU; `source="cpu"` gives the same noise on every machine.
    """
    if source not in ("cpu", "cuda"):
        raise ValueError(f"noise source must be 'cpu' or 'cuda', got {source!r}")
    if source == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("noise source 'cuda' needs a CUDA GPU; use 'cpu' noise on this machine")
    gen_device = torch.device("cuda") if source == "cuda" else torch.device("cpu")
    g = torch.Generator(device=gen_device).manual_seed(int(seed))
    noise = torch.randn(tuple(shape[1:]) if shape[0] == 1 else tuple(shape), generator=g, device=gen_device,
                        dtype=torch.float32)
    noise = noise.reshape(tuple(shape))
    return noise.to(device) if device is not None else noise


# velocity(model, x, t, ctx_pos, ctx_neg, y, camera, guide, batched, cancel) -> CFG velocity float32
VelocityFn = Callable[..., torch.Tensor]


def _model_velocity(
    model: nn.Module,
    x: torch.Tensor,
    t: torch.Tensor,
    ctx_pos: torch.Tensor,
    ctx_neg: torch.Tensor,
    y: torch.Tensor,
    camera: Optional[torch.Tensor],
    guide: float,
    batched: bool,
    cancel: Callable[[], None],
    layered: bool = False,
    film=None,
) -> torch.Tensor:
    """CFG velocity `uncond + g * (cond - uncond)` in float32.

    batched: one forward of batch 2; layered: one forward whose two samples go one after the other inside each
    block (`WanDiT.forward(layered=True)`, bit-identical to the two forwards of sequential); else two forwards.
    film: a camera FiLM cache (wan/dit/film_cache.py) every call of the run shares.
    """
    extra = {} if film is None or camera is None else {"film": film}
    if guide == 1.0:  # uncond has no effect: skip its forward (exact)
        cancel()
        return model(x, t, ctx_pos, y, camera=camera, **extra).float()
    if batched or layered:
        cancel()
        # layered: x, t, y and camera are the same for both passes, so the model may share what they alone decide
        if layered:
            extra.update(layered=True, shared_input=True)
        both = model(x.expand(2, *x.shape[1:]), t.expand(2), torch.cat([ctx_pos, ctx_neg]), y, camera=camera, **extra)
        cond, uncond = both.float().chunk(2)
    else:
        cancel()
        cond = model(x, t, ctx_pos, y, camera=camera, **extra).float()
        cancel()
        uncond = model(x, t, ctx_neg, y, camera=camera, **extra).float()
    return uncond + guide * (cond - uncond)


def sample(
    provider: ExpertProvider,
    noise: torch.Tensor,
    context: torch.Tensor,
    negative_context: torch.Tensor,
    y: torch.Tensor,
    camera: Optional[torch.Tensor] = None,
    settings: Optional[SamplingSettings] = None,
    device=None,
    callback: Optional[Callable[[StepInfo], None]] = None,
    cancel_check: Optional[Callable[[], bool]] = None,
    velocity: Optional[VelocityFn] = None,
    camera_cache=None,
) -> torch.Tensor:
    """Run the whole denoising loop; returns the final latent [1, 16, F, H, W] float32 (normalised space).

    context / negative_context: [1, 512, text_dim] (already zero-padded, see `wan.dit.pad_context`).
    cancel_check: called before every model call; returning True (or raising) stops the run.
    velocity: how a step's CFG velocity is computed (default: both passes here, batched, layered or one after the
    other);
    the parallel layouts pass theirs (parallel/cfg.py: one pass per rank; parallel/local_cfg.py: two devices).
    camera_cache: a camera FiLM cache (wan.dit.film_cache.FilmCache; the caller makes and closes it) for the
    default velocity: each expert computes its camera FiLM in its first call and reads it in every later one.
    """
    s = settings or SamplingSettings()
    s.validate()
    device = torch.device(device) if device is not None else noise.device
    sched = make_scheduler(s.solver, s.steps, s.shift)
    timesteps = [int(v) for v in sched.timesteps]
    total = len(timesteps)

    x = noise.to(device=device, dtype=torch.float32)
    ctx_pos = context.to(device)
    ctx_neg = negative_context.to(device)
    y = y.to(device=device, dtype=torch.float32)
    cam = camera.to(device) if camera is not None else None
    batched = s.cfg_mode == "batch"
    if velocity is None:
        velocity = functools.partial(_model_velocity, layered=s.cfg_mode == "layered", film=camera_cache)
    elif camera_cache is not None:
        raise ValueError("camera_cache serves the built-in velocity; a custom velocity passes its own cache")

    def cancel() -> None:
        if cancel_check is not None and cancel_check():
            raise Cancelled("sampling cancelled")

    current: Optional[str] = None
    model: Optional[nn.Module] = None
    try:
        for i, t_int in enumerate(timesteps):
            if sched.done:  # duplicated leading timesteps: sigma 0 is reached one call early (spec §6.3)
                break
            name = expert_for_timestep(t_int, s.boundary, s.num_train_timesteps)
            if name != current:
                if current is not None:
                    model = None
                    provider.release(current)
                cancel()
                model = provider.acquire(name)
                current = name
                log.info("step %d/%d: %s-noise expert (t=%d)", i + 1, total, name, t_int)
            guide = s.guide_high if name == "high" else s.guide_low
            t = torch.tensor([t_int], device=device, dtype=torch.long)
            with torch.no_grad():
                v = velocity(model, x, t, ctx_pos, ctx_neg, y, cam, guide, batched, cancel)
                x = sched.step(v, t_int, x)
            del v
            if callback is not None:
                callback(StepInfo(i, total, t_int, name, sched.x0_estimate))
    finally:
        model = None
        if current is not None:
            provider.release(current)
    return x


class ResidentExperts:
    """The simplest provider: both experts already on the device (tests, big GPUs)."""

    def __init__(self, high: nn.Module, low: nn.Module):
        self.models = {"high": high, "low": low}
        self.events: list[tuple[str, str]] = []

    def acquire(self, name: str) -> nn.Module:
        self.events.append(("acquire", name))
        return self.models[name]

    def release(self, name: str) -> None:
        self.events.append(("release", name))

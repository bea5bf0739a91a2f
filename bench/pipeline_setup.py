"""What the pipeline cases (and the other drivers) build on: the bench DiT config, the simulated card's memory cap,
real conditioning inputs, a short sampling schedule, and the Recorder timing a provider's expert loads and the
activation peak of each expert phase."""
from __future__ import annotations

import time
from typing import Optional

import torch

from ..wan.dit.model import DiTConfig
from .bench_nf4_load import bench_config as load_bench_config

GiB = 1024**3


def bench_config(tiny: bool, layers: Optional[int] = None) -> DiTConfig:
    """Full size (the released shapes), or the smallest DiT of the same structure for the CPU smoke run."""
    if tiny:
        return DiTConfig.tiny(num_layers=layers or 4)
    return load_bench_config(False, layers)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def apply_cap(device: torch.device, cap_gib: Optional[float], context_gib: float) -> Optional[int]:
    """Limit this process's caching allocator like a card of `cap_gib` GiB whose context takes `context_gib`."""
    if device.type != "cuda" or not cap_gib:
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int((cap_gib - context_gib) * GiB)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    return cap


def make_inputs(video: tuple, cfg: DiTConfig, device: torch.device, seed: int = 0) -> dict:
    """Real conditioning shapes: y (mask + random latent), a preset camera at the size, random bf16 text."""
    from ..wan.control.camera import camera_condition
    from ..wan.control.camera_presets import preset_camera
    from ..wan.i2v import first_frame_mask
    from ..wan.sizes import latent_frames, latent_size

    frames, h, w = video
    f_lat = latent_frames(frames)
    lat_h, lat_w = latent_size(h, w)
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(1, 16, f_lat, lat_h, lat_w, generator=g)
    y = torch.cat([first_frame_mask(f_lat, lat_h, lat_w)[None], latent], dim=1)
    path = preset_camera("dolly_in+pan_right", frames=frames)
    cam = camera_condition(path.poses, path.intrinsics, h, w, frames).plucker
    text_dtype = torch.bfloat16
    ctx = (0.2 * torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)).to(text_dtype)
    neg = (0.2 * torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)).to(text_dtype)
    return {
        "y": y.to(device), "camera": cam.to(device), "ctx": ctx.to(device), "neg": neg.to(device),
        "shape": (1, 16, f_lat, lat_h, lat_w),
    }


def schedule(high: int, low: int, shift: float = 10.0):
    """SamplingSettings whose first `high` steps use the high-noise expert and the next `low` the low one."""
    from ..wan.sampling.sampler import SamplingSettings
    from ..wan.sampling.schedulers import make_scheduler

    steps = high + low
    ts = [int(t) for t in make_scheduler("unipc", steps, shift).timesteps]
    if low == 0:
        boundary = ts[-1] / 1000
    else:
        boundary = (ts[high - 1] + ts[high]) / 2000
    return SamplingSettings(steps=steps, shift=shift, boundary=boundary)


class Recorder:
    """Wraps a provider: times acquire/release, and measures each expert phase's peak over its resident weights."""

    def __init__(self, inner, device: torch.device):
        self.inner, self.device = inner, device
        self.events: list[dict] = []
        self.phases: list[dict] = []
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._phase: Optional[dict] = None

    def _roll(self) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated(self.device))
            self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)

    def _close_phase(self) -> None:
        if self._phase is not None and self.device.type == "cuda":
            sync(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self._phase["peak_allocated"] = peak
            self._phase["peak_reserved"] = torch.cuda.max_memory_reserved(self.device)
            self._phase["activation_peak"] = peak - self._phase["weights_allocated"]
        if self._phase is not None:
            self.phases.append(self._phase)
        self._phase = None

    def acquire(self, name: str):
        self._close_phase()
        t0 = time.perf_counter()
        model = self.inner.acquire(name)
        sync(self.device)
        t1 = time.perf_counter()
        alloc = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        self._roll()
        self._phase = {"expert": name, "weights_allocated": alloc}
        src = self.inner.events[-1]["source"] if getattr(self.inner, "events", None) else None
        self.events.append({"op": "acquire", "name": name, "source": src, "seconds": t1 - t0, "t_end": t1,
                            "allocated_after": alloc})
        return model

    def release(self, name: str) -> None:
        self._close_phase()
        self._roll()
        t0 = time.perf_counter()
        self.inner.release(name)
        sync(self.device)
        t1 = time.perf_counter()
        alloc = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        src = self.inner.events[-1]["source"] if getattr(self.inner, "events", None) else None
        self.events.append({"op": "release", "name": name, "source": src, "seconds": t1 - t0, "t_end": t1,
                            "allocated_after": alloc})


def step_times(step_ends: list[tuple[int, str, float]], events: list[dict]) -> list[dict]:
    """Seconds of model compute per step: the time between step ends minus the acquire/release inside it."""
    out = []
    prev = next(e["t_end"] for e in events if e["op"] == "acquire")
    for index, expert, t in step_ends:
        switch = sum(e["seconds"] for e in events if prev < e["t_end"] <= t)
        out.append({"step": index, "expert": expert, "seconds": round(t - prev - switch, 4)})
        prev = t
    return out

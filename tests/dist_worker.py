"""One rank of the parallel tests (tests/test_parallel.py starts N of these with gloo on the CPU).

    python tests/dist_worker.py LAYOUTS OUT_FILE [cpu|cuda]   # LAYOUTS: e.g. "cfg,ulysses" (WORLD_SIZE ranks)

Every rank builds the same tiny models from fixed seeds, joins the session (parallel/group.py, as the CLI does),
runs the scenarios below under the layout and rank 0 writes the results to OUT_FILE (safetensors). The test
computes the same scenarios in one process with the builders of this file and compares.
Not collected by pytest (no test_ prefix); loaded by file path by the test for the builders.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, sample
from lingbot_world.world.models import V1_FAST

CFG = DiTConfig.tiny(num_heads=4, dim=64, num_layers=2, text_dim=16, text_len=8)
FAST = DiTConfig.tiny(num_heads=4, dim=64, num_layers=2, text_dim=16, text_len=8, causal=True)
LAT = (3, 6, 6)  # latent F, H, W: 3 x 3 x 3 = 27 tokens (not a multiple of 2 or 4: padding is exercised)
FAST_LAT = (9, 4, 6)  # 3 chunks of 3 latent frames, 6 tokens per frame (18 per chunk)


def model(cfg: DiTConfig, seed: int, device="cpu") -> WanDiT:
    torch.manual_seed(seed)
    m = WanDiT(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 100)
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    m.set_token_chunk(7)  # several token chunks per rank (and chunk borders that differ from one process)
    return m.to(device)


def inputs(cfg: DiTConfig, lat, seed: int = 0, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    f, h, w = lat
    out = {"x": torch.randn(1, 16, f, h, w, generator=g), "y": torch.randn(1, 20, f, h, w, generator=g),
           "camera": torch.randn(1, 384, f, h, w, generator=g),
           "ctx": pad_context([torch.randn(5, cfg.text_dim, generator=g)], cfg.text_len),
           "neg": pad_context([torch.randn(6, cfg.text_dim, generator=g)], cfg.text_len)}
    return {k: v.to(device) for k, v in out.items()}


def _device(m: WanDiT) -> torch.device:
    return m.patch_embedding.weight.device


def forwards(m: WanDiT) -> dict:
    """One forward with the camera, a batch of 2 (batched CFG) and one without a camera."""
    i = inputs(CFG, LAT, device=_device(m))
    t = torch.tensor([937], device=_device(m))
    with torch.no_grad():
        one = m(i["x"], t, i["ctx"], i["y"], camera=i["camera"])
        two = m(torch.cat([i["x"], i["x"] * 0.5]), t.expand(2), torch.cat([i["ctx"], i["neg"]]), i["y"],
                camera=i["camera"])
        bare = m(i["x"], t, i["neg"], i["y"])
    return {"forward": one, "forward_batch2": two, "forward_no_camera": bare}


def sampling(high: WanDiT, low: WanDiT, cfg_mode: str, velocity=None) -> torch.Tensor:
    """4 steps of the dual-expert sampler (2 per expert), guide 5 / 3.5."""
    i = inputs(CFG, LAT, seed=1, device=_device(high))
    s = SamplingSettings(steps=4, shift=10.0, boundary=0.9, guide_high=5.0, guide_low=3.5, cfg_mode=cfg_mode)
    with torch.no_grad():
        return sample(ResidentExperts(high, low), i["x"], i["ctx"], i["neg"], i["y"], i["camera"], s,
                      velocity=velocity)


def fast_run(m: WanDiT, heads: int, camera_film: bool = False, **layout_kw) -> torch.Tensor:
    """The Fast chunk loop over 3 chunks with a K/V cache of `heads` heads (the whole video, or a window);
    camera_film: each chunk's camera FiLM kept for its later calls (a rank keeps its share of the tokens)."""
    from lingbot_world.wan.dit.film_cache import FilmCache

    device = _device(m)
    i = inputs(FAST, FAST_LAT, seed=2, device=device)
    fsl = (FAST_LAT[1] // 2) * (FAST_LAT[2] // 2)
    cache = cache_layout(FAST_LAT[0], fsl, **layout_kw).make(FAST.num_layers, heads, FAST.head_dim,
                                                             dtype=torch.float32, device=device)
    gen = make_generator(5, "cpu")
    noise = draw(gen, (1, 16, *FAST_LAT), device)
    with torch.no_grad():
        film = FilmCache.on_device(FAST.num_layers) if camera_film else None
        return FastRun(m, noise, i["ctx"], i["y"], i["camera"], cache, gen, device=device, film=film,
                       schedule=V1_FAST.recipe.schedule(), chunk_frames=V1_FAST.recipe.chunk_frames).run()


FAST_LAYOUTS = {"fast": {}, "fast_window": {"window_frames": 6, "sink_frames": 1}, "fast_max_attention": {
    "max_attention": 20}, "fast_window_film": {"window_frames": 6, "sink_frames": 1, "camera_film": True}}


def run_layout(session, layout_mode: str) -> dict[str, torch.Tensor]:
    device = session.device
    from lingbot_world.parallel.cfg import CFGParallel
    from lingbot_world.parallel.layout import plan_layout
    from lingbot_world.parallel.ulysses import SequenceParallel

    layout = plan_layout(layout_mode, session.world, CFG.num_heads, model="base")
    session.set_layout(layout)

    def sp():
        if layout.ulysses == 1:
            return None
        return SequenceParallel(layout.ulysses, layout.sp_rank(session.rank), session.sp_group, CFG.num_heads)

    high, low = model(CFG, 1, device), model(CFG, 2, device)
    for m in (high, low):
        m.set_seq_parallel(sp())
    results: dict[str, torch.Tensor] = {}
    if layout.cfg == 1:
        results.update(forwards(high))
        results["sample_batch"] = sampling(high, low, "batch")
    velocity = CFGParallel(layout.cfg_rank(session.rank), session.cfg_group) if layout.cfg == 2 else None
    results["sample_sequential"] = sampling(high, low, "sequential", velocity)
    if layout.cfg == 1:
        fast = model(FAST, 3, device)
        fast.set_seq_parallel(sp())
        for name, kw in FAST_LAYOUTS.items():
            results[name] = fast_run(fast, FAST.num_heads // layout.ulysses, **kw)
    return results


def main(modes: str, out: str, device: str = "cpu") -> int:
    """modes: comma-separated layouts (cfg, ulysses, auto), run one after the other in one session."""
    from safetensors.torch import save_file

    from lingbot_world.parallel.group import Session

    torch.set_num_threads(1)  # the test's one-process reference runs with one thread too (same GEMM blocking)
    session = Session.start(device, timeout_s=60)
    try:
        results: dict[str, torch.Tensor] = {}
        for mode in modes.split(","):
            results.update({f"{mode}/{k}": v for k, v in run_layout(session, mode).items()})
        # every rank must hold the same results (the gathers give every rank the whole output)
        sums = session.gather_json({k: float(v.double().sum()) for k, v in results.items()}, "comparing results")
        if session.is_main:
            save_file({k: v.contiguous().cpu() for k, v in results.items()}, out,
                      metadata={"same_on_every_rank": json.dumps(all(s == sums[0] for s in sums))})
    finally:
        session.close()
    left = _gloo_threads()
    if left:  # a group still alive at exit aborts the process at random (its thread needs the GIL then)
        print(f"gloo threads still running after Session.close(): {left}", file=sys.stderr)
        return 3
    return 0


def _gloo_threads() -> list[str]:
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return []
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
    return [n for n in names if "gloo" in n or "tcpstore" in n]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

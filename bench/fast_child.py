"""bench_fast's children: the conditioning inputs and what a child process does with one case.

Run as `python -m lingbot_world.bench.bench_fast --child SPEC` (bench_fast's main hands the spec to CHILDREN):
`child_fast` loads the Fast model through the memory planner and times every chunk (or profiles one mid-video
chunk: `profile_chunk`), `child_base` times one resident base expert's steps. `fast_inputs` and `child_start` are
shared with bench_fast_speed's and bench_parallel's children.
"""
from __future__ import annotations

import time

import torch

from ..wan.dit.model import DiTConfig
from .bench_models import spec_recipe
from .pipeline_setup import apply_cap, sync
from .pipeline_child import timed_forwards
from .common import peak_rss_bytes, rss_bytes

PROFILE_TOP_OPS = 15


# ---- inputs ----------------------------------------------------------------------------------------------------
def fast_inputs(video: tuple, cfg: DiTConfig, device: torch.device, latent_frames: int, vae=None, seed: int = 0,
                camera_form: str = "v1") -> dict:
    """y (mask + a random latent, or the VAE encode of a random first frame when `vae` is given), a preset camera at
    the chunk-rounded latent frames in the model's float order (`camera_form`, its recipe's), random bf16 text; the
    encode time when measured."""
    from ..wan.control.camera import camera_condition
    from ..wan.control.camera_presets import preset_camera
    from ..wan.i2v import build_i2v_condition, first_frame_mask
    from ..wan.sizes import latent_size

    frames, h, w = video
    lat_h, lat_w = latent_size(h, w)
    g = torch.Generator().manual_seed(seed)
    out: dict = {}
    video_frames = 4 * (latent_frames - 1) + 1
    if vae is not None:
        image = torch.rand(3, h, w, generator=g) * 2 - 1
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            y = build_i2v_condition(vae, image, h, w, video_frames)
        sync(device)
        out["vae_encode_s"] = round(time.perf_counter() - t0, 3)
    else:
        latent = torch.randn(1, 16, latent_frames, lat_h, lat_w, generator=g)
        y = torch.cat([first_frame_mask(latent_frames, lat_h, lat_w)[None], latent], dim=1)
    path = preset_camera("dolly_in+pan_right", frames=frames)
    cam = camera_condition(path.poses, path.intrinsics, h, w, ((frames - 1) // 4) * 4 + 1,
                           latent_frames=latent_frames, form=camera_form).plucker
    ctx = (0.2 * torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)).to(torch.bfloat16)
    out.update(y=y.cpu(), camera=cam, ctx=ctx.to(device))  # y and camera sliced per chunk by FastRun, as the CLI
    return out


# ---- children ----------------------------------------------------------------------------------------------------
def child_start(spec: dict):
    """What every Fast child does first: its device (capped as the spec says), the config and the video's frames
    in chunks of the spec's recipe. Returns (device, cuda, cfg, FastFrames, h, w, out) with `out` holding the cap
    and the frame counts."""
    from ..wan.sampling.fast_sampler import fast_frames

    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    if cuda:
        torch.empty(1, device=device)
    cfg = DiTConfig.from_json(spec["config"])
    frames, h, w = spec["video"]
    fr = fast_frames(frames, chunk=spec_recipe(spec).chunk_frames)
    out.update(frames=fr.frames, latent_frames=fr.latent_frames, chunks=fr.chunks)
    return device, cuda, cfg, fr, h, w, out


def child_fast(spec: dict) -> dict:
    from ..memory.fast_planner import plan_fast_memory
    from ..memory.kv_placement import FastPlacement
    from ..memory.estimates import available_ram_bytes, free_vram_bytes
    from ..wan.dit.kv_cache import cache_layout
    from ..wan.sampling.fast_sampler import FastRun, draw, make_generator
    from ..wan.vae.model import VAEConfig, WanVAE

    device, cuda, cfg, fr, h, w, out = child_start(spec)
    vae = None
    if spec.get("vae", True):
        with torch.device(device):
            vae = WanVAE(VAEConfig.tiny() if spec["tiny"] else VAEConfig()).eval().requires_grad_(False)
    inputs = fast_inputs(spec["video"], cfg, device, fr.latent_frames, vae)
    if vae is not None:
        out["vae_encode_s"] = inputs["vae_encode_s"]
        vae.to("cpu")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    fsl = (h // 16) * (w // 16)
    layout = cache_layout(fr.latent_frames, fsl, window_frames=spec.get("window"), sink_frames=spec.get("sink", 0))
    vram = free_vram_bytes(device) if cuda else 1 << 60
    plan = plan_fast_memory(h, w, cfg, layout, vram, available_ram_bytes(), cache=spec.get("cache", "auto"),
                            cache_layers_on_gpu=spec.get("cache_layers_on_gpu"))
    out["vram_free_at_plan"] = vram
    out["plan"] = plan.to_json()
    placement = FastPlacement(plan, device, lambda s: None)
    chunk_ends: list[float] = []
    chunk_peaks: list[dict] = []

    def on_chunk(index: int, x0: torch.Tensor) -> None:
        sync(device)
        chunk_ends.append(time.perf_counter())
        rec = {"rss": rss_bytes()}
        if cuda:
            rec["peak_allocated"] = torch.cuda.max_memory_allocated(device)
            rec["peak_reserved"] = torch.cuda.max_memory_reserved(device)
        chunk_peaks.append(rec)

    try:
        t0 = time.perf_counter()
        model = placement.load_model(spec["fast"], "nf4")
        if spec.get("speed"):  # the CLI's --compile / --compute, applied as fast_run does
            from ..speed.options import SpeedOptions, apply_speed, resolve_speed

            model = apply_speed(model, resolve_speed(SpeedOptions(**spec["speed"]), device))
        sync(device)
        out["load_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        cache = placement.make_cache()
        sync(device)
        out["cache_alloc_s"] = round(time.perf_counter() - t0, 3)
        gen = make_generator(42, "cuda" if cuda else "cpu")
        noise = draw(gen, (1, 16, fr.latent_frames, h // 8, w // 8), device)
        # as `generate --model fast` runs it without --save-state: no context pass after the last chunk
        recipe = spec_recipe(spec)
        run = FastRun(model, noise, inputs["ctx"], inputs["y"], inputs["camera"], cache, gen, device=device,
                      on_chunk=on_chunk, final_context=False, film=plan.make_film(device),
                      schedule=recipe.schedule(), chunk_frames=recipe.chunk_frames)
        if spec.get("profile"):
            out["profile"] = profile_chunk(run, device)
            out["stream"] = placement.placement.stats() if placement.placement else None
            return out
        sync(device)
        t_start = time.perf_counter()
        with torch.inference_mode():
            latent = run.run()
        sync(device)
        out["sampling_s"] = round(time.perf_counter() - t_start, 3)
        if spec.get("speed"):
            from ..speed.compile import STATS

            out["speed"] = spec["speed"]
            out["compile_s"] = round(STATS.seconds, 3)  # first-run kernel building inside sampling_s
        out["finite"] = bool(torch.isfinite(latent).all())
        starts = [t_start] + chunk_ends[:-1]
        out["chunk_s"] = [round(e - s, 3) for s, e in zip(starts, chunk_ends)]
        out["chunk_peaks"] = chunk_peaks
        out["stream"] = placement.placement.stats() if placement.placement else None
        if cuda:
            out["peak_allocated"] = max(c["peak_allocated"] for c in chunk_peaks)
            out["peak_reserved"] = max(c["peak_reserved"] for c in chunk_peaks)
        out["peak_rss_sampling"] = peak_rss_bytes()
    finally:
        placement.close()
        if cuda:
            torch.cuda.empty_cache()
    if vae is not None:
        vae.to(device)
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            vae.decode(latent)
        sync(device)
        out["vae_decode_s"] = round(time.perf_counter() - t0, 3)
    return out


def profile_chunk(run, device: torch.device, host_gaps: bool = False) -> dict:
    """Profile the middle chunk of `run` (its 4 steps and the context pass: one `next_chunk()`), after the chunks
    before it, and time the chunks on either side without the profiler: the chunk's wall time where the profiler's
    own CPU cost is absent. Device time well below that wall means the GPU waits for the CPU (launch-bound)."""
    from .speed_profile import profile_split

    mid = run.chunks // 2
    walls: dict = {}
    with torch.inference_mode():
        while run.chunk < mid:
            _timed_chunk(run, device, walls)
        profiled = profile_split(run.next_chunk, device, top_ops=PROFILE_TOP_OPS, host_gaps=host_gaps)
        if not run.done:
            _timed_chunk(run, device, walls)
    around = [walls[c] for c in (mid - 1, mid + 1) if c in walls]
    wall = sum(around) / len(around) if around else None
    return {"chunk": mid, "chunks": run.chunks, "calls": run.calls_per_chunk, "chunk_wall_s": walls,
            "wall_s_around": round(wall, 3) if wall else None, "split": profiled,
            "device_busy_share": round(profiled["kernel_seconds"] / wall, 3) if wall else None}


def _timed_chunk(run, device: torch.device, walls: dict) -> None:
    sync(device)
    t = time.perf_counter()
    index = run.chunk
    run.next_chunk()
    sync(device)
    walls[index] = round(time.perf_counter() - t, 3)


def child_base(spec: dict) -> dict:
    """One base expert resident: s/step of the 70-step schedule (CFG cond + uncond) at the Fast cases' size."""
    from ..loaders.expert_loader import load_expert
    from .pipeline_setup import make_inputs

    device = torch.device(spec["device"])
    out: dict = {"cap_bytes": apply_cap(device, spec.get("cap_gib"), spec["context_gib"])}
    cfg = DiTConfig.from_json(spec["base_config"])
    inputs = make_inputs(tuple(spec["video"]), cfg, device)
    t0 = time.perf_counter()
    model = load_expert(spec["base"], device=device)
    sync(device)
    out["load_s"] = round(time.perf_counter() - t0, 3)
    out.update(timed_forwards(model, inputs, device, batch=False, steps=spec["timed"]))
    return out


CHILDREN = {"fast": child_fast, "base": child_base}

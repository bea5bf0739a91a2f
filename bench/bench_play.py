"""Benchmark: the live player's World session, chunk after chunk as `lingbot-world play` drives it.

    # one H100: 220 chunks at 480x832 on a 24 GB cap, K/V cache in pinned host RAM, window 21 + sink 3 (draft: 15)
    python -m lingbot_world.bench.bench_play --speed draft --chunks 220 --budget-s 480 --workdir /tmp/lwf --keep \\
        --out bench/results/play_draft_220_h100.json
    # a preset or speed options, and the stored FP8 / INT8 weights (converted once from the random NF4 model)
    python -m lingbot_world.bench.bench_play --speed draft --weights fp8 --chunks 220 --budget-s 420 \\
        --workdir /tmp/lwf --keep --out bench/results/play_draft_fp8w_220_h100.json
    python -m lingbot_world.bench.bench_play --tiny --out /tmp/play_tiny.json      # CPU smoke run (CI)
    # the v2 models (issue 47: peak VRAM, torch's and nvidia-smi's, and RSS flat over 200 played chunks; 16-frame
    # chunks, the play window 18 + sink 6; the player's --kv-cache auto: the 1.3B's cache fits on the 24 GB card).
    # The 1.3B: 200 chunks at ~0.6-0.8 s; the 14B's ~3 s chunks on the 24 GB cap: as many as --budget-s allows in
    # one 10-minute call (~130 in 420 s; the results are written every 10 chunks as well)
    python -m lingbot_world.bench.bench_play --model v2-1.3b --speed auto --kv-cache auto --chunks 200 \\
        --budget-s 300 --workdir /tmp/lwv2 --keep --out bench/results/play_v2_1.3b_auto_200_h200.json
    python -m lingbot_world.bench.bench_play --model v2-14b --speed auto --kv-cache auto --chunks 200 \\
        --budget-s 420 --workdir /tmp/lwv2 --keep --out bench/results/play_v2_14b_auto_h200.json
    python -m lingbot_world.bench.bench_play --model v2-1.3b --tiny --chunks 3 --out /tmp/play_v2_tiny.json

A random full-size model of the registry (--model, default v1 Fast; bench_models.py) in the community NF4 layout is
written once to --workdir (each model its own folder, v1 Fast's the one bench_fast uses: reused when its config
matches) and a full-size random Wan 2.1 VAE is made in memory; the text context is random (the prompt's encoder is
outside the chunk loop). The session's settings are the player's (`WorldSettings(play=True)` through
`world.assembly.video_settings`: the model's recipe, its play window and sink, the preset's window cap), its memory
is planned for the played layout and it is driven through `player.driver.SessionDriver`, the player's own worker
thread, with keys that change every chunk, as many frames as `session.keys_for_next_chunk()` asks (v1 Fast 8 then
12, v2 12 then 16).

Per chunk (server timestamps, what the page receives over its socket one hop later): key request -> first decoded
frame JPEG-encoded on the loop ("key -> first frame"), request -> chunk committed (on the loop too), the session's
own DiT / decode / total split, peak VRAM allocated / reserved during the chunk, nvidia-smi's peak during it (every
process on the card, polled every 0.25 s), RSS after it and the seconds since the first chunk: the series of a long
run. Summary over the steady chunks (after --warmup): median and p90 of key -> first frame, sustained frames per
second (frames made / wall time), and whether VRAM (torch's and nvidia-smi's) and RSS stay flat (the last quarter's
peak within --flat-slack-mib of the first steady quarter's). The results file is written every 10 chunks too, so a
run stopped by its machine's time limit keeps what it played. Like this loop,
the page asks for the next chunk as soon as the last one ends (when the server is slower than playback); its own
timestamps (key press -> frame on screen) add the wait for that request (up to one chunk) and the JPEG decode:
the player's page shows them live ("key -> screen").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from ..speed.levers import plan_levers
from .bench_models import BenchModel, add_model_argument, parse_bench_size, parse_model
from .pipeline_setup import apply_cap, sync
from .expert_files import write_random_experts
from .common import SmiPoller, machine_info, rss_bytes, tiny_children, write_json

GiB = 1024**3
KEY_PATTERN = ("w-12", "wj-12", "w-6,wl-6", "d-12", "none-4,s-8", "i-6,k-6", "a-12", "wl-12")  # repeated to fill
SAVE_EVERY = 10  # chunks between writes of the results file


def parse_speed(text: Optional[str]):
    """A preset name ('auto', 'draft', ...) or 'compile=blocks,compute=fp8' -> (preset name or None, SpeedOptions);
    None: the exact defaults."""
    if not text:
        return None
    from ..speed.options import SpeedOptions
    from ..speed.presets import PRESET_NAMES

    if text in PRESET_NAMES:
        return text
    pairs = dict(part.split("=", 1) for part in text.split(",") if part)
    return SpeedOptions(**pairs)


def keys_for(chunk: int, need: int) -> str:
    """`need` frames of keys (the session's keys_for_next_chunk()) that change every chunk."""
    from ..wan.control.actions import KeyTimeline

    pattern = KEY_PATTERN[chunk % len(KEY_PATTERN)]
    return KeyTimeline.from_string(",".join([pattern] * -(-need // 12)))[0:need].to_string()


def build_session(args, device: torch.device, model_path: Path, bm: BenchModel):
    """The World session of `lingbot-world play` on random weights (no text encoder: a random context)."""
    from ..loaders.expert_format import detect_format
    from ..memory.kv_placement import FastPlacement
    from ..speed.options import resolve_speed
    from ..wan.i2v import ConditionTrack
    from ..wan.vae.model import VAEConfig, WanVAE
    from ..world.assembly import Checked, fit_speed, gemm_compute, speed_preparer, video_settings
    from ..world.files import WorldFiles
    from ..world.plan import compute_dtype, plan_world_memory, play_layout
    from ..world.session import WorldSession
    from ..world.settings import WorldSettings

    cfg = bm.cfg
    h, w = bm.size
    speed = parse_speed(args.speed)
    if isinstance(speed, str):  # a preset: its options and its chunk levers (steps, fold, window cap, decode)
        from ..speed.presets import resolve_preset

        plan_speed = resolve_preset(speed, device, weights=args.weights, chunk_steps=args.chunk_steps)
    else:
        plan_speed = resolve_speed(speed, device, weights=args.weights) if speed is not None else None
        if args.chunk_steps is not None:
            from ..speed.options import SpeedOptions
            from ..speed.presets import attach_preset

            plan_speed = attach_preset(plan_speed or resolve_speed(SpeedOptions(), device, weights=args.weights),
                                       None, args.chunk_steps)
    # the model is the one we wrote (the 14B's files cannot tell v1 Fast from v2 14B: the registry entry says it)
    checked = Checked(WorldFiles(model_path.parent, model_path, None, None, None, bm.name), detect_format(model_path),
                      bm.entry)
    plan_speed = fit_speed(checked, plan_speed)  # as the player: a narrow model runs --compile auto eagerly
    settings = WorldSettings(size=f"{h}*{w}", seed=42, noise="cuda" if device.type == "cuda" else "cpu",
                             window=args.window, sink=args.sink, kv_cache=args.kv_cache, speed=plan_speed,
                             weights=args.weights, play=True)
    fs = video_settings(checked, settings, device, h, w)
    with torch.device(device):
        vae = WanVAE(VAEConfig.tiny() if args.tiny else VAEConfig()).eval().requires_grad_(False)
    from ..world.assembly import load_tiny, tiny_bytes

    tiny = None
    if args.tiny_vae:  # a random decoder in taew2_1's format, loaded as the player loads --tiny-vae
        from ..loaders.demo_checkpoint import DEMO_TINY_WIDTHS, write_random_tiny_vae

        tiny = load_tiny(write_random_tiny_vae(Path(args.workdir) / "taew2_1_bench.safetensors",
                                               widths=DEMO_TINY_WIDTHS if args.tiny else (256, 128, 64, 64)), device)
    plan, _ = plan_world_memory(cfg, play_layout(fs), device, h, w, weights=args.weights, kv_cache=args.kv_cache,
                                stream_decode="on", vae_cfg=vae.cfg, camera_film=not args.no_camera_film,
                                film_host=not args.film_device_only, **plan_levers(plan_speed),
                                decode_bytes=tiny_bytes(tiny, h, w, beside_vae=vae.cfg), compute=gemm_compute(plan_speed))
    placement = FastPlacement(plan, device, lambda s: None)
    dtype = compute_dtype(args.weights, device)
    session = WorldSession(placement, fs, device=device, vae=vae, prepare_model=speed_preparer(plan_speed),
                           speed=plan_speed, tiny_decoder=tiny,
                           load_model=lambda: placement.load_model(model_path, args.weights, compute_dtype=dtype))
    g = torch.Generator().manual_seed(0)
    image = torch.rand(3, h, w, generator=g) * 2 - 1
    context = torch.randn(64, cfg.text_dim, generator=g)
    t0 = time.perf_counter()
    session.load()
    sync(device)
    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        session.begin(ConditionTrack.build(vae, image, h, w), context, "bench")
    return session, plan, load_s


async def play(session, chunks: int, device: torch.device, budget_s: float, info: dict | None = None,
               on_row=None) -> list[dict]:
    """Chunks with changing keys through the player's worker; `info` gets the CUDA graphs' counts (replays mean
    the steady state launched each block in one call); on_row(rows) after every chunk."""
    from ..player.driver import SessionDriver

    driver = SessionDriver(session)
    driver.adopt(torch.zeros(session.height, session.width, 3, dtype=torch.uint8).numpy())
    cuda = device.type == "cuda"
    rows: list[dict] = []
    smi = SmiPoller().__enter__()  # nvidia-smi's reading of the card (nothing where it is missing)
    t_start = time.perf_counter()
    try:
        for i in range(chunks):
            if time.perf_counter() - t_start > budget_s:
                break
            need = driver.snapshot["next_keys"]
            keys = keys_for(i, need)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            smi.peaks.pop(0, None)  # the chunk's own peak from here
            first: list[float] = []
            preview: list[float] = []
            t_key = time.perf_counter()

            async def on_frames(chunk, first_frame, data):
                if not first:
                    first.append(time.perf_counter() - t_key)

            async def on_preview(chunk, first_frame, data):  # the step-0 preview, where a tiny decoder makes one
                if not preview:
                    preview.append(time.perf_counter() - t_key)

            report = await driver.step(keys, on_frames, on_preview)
            total = time.perf_counter() - t_key
            row = {"chunk": i + 1, "keys": keys, "frames": report.frames, "key_to_first_frame_s": round(first[0], 4),
                   **({"key_to_preview_s": round(preview[0], 4)} if preview else {}),
                   "total_s": round(total, 4), **{f"session_{k}_s": v for k, v in report.seconds.items()},
                   "rss": rss_bytes(), "t_s": round(time.perf_counter() - t_start, 3)}
            if cuda:
                row["peak_allocated"] = torch.cuda.max_memory_allocated(device)
                row["peak_reserved"] = torch.cuda.max_memory_reserved(device)
            smi_mib = smi.peaks.get(0)
            if smi_mib is None and smi.exe:  # no poll landed inside a short chunk: read the card once now
                smi_mib = smi.read().get(0)
            if smi_mib is not None:
                row["smi_used"] = smi_mib * 2**20  # bytes, as the other readings
            rows.append(row)
            print(f"chunk {i + 1}: key -> first frame {row['key_to_first_frame_s']:.3f} s, chunk {row['total_s']:.3f} s"
                  + (f", peak {row['peak_allocated'] / GiB:.2f} GiB" if cuda else "")
                  + (f", nvidia-smi {smi_mib} MiB" if smi_mib is not None else "")
                  + f", RSS {row['rss'] / GiB:.2f} GiB", flush=True)
            if on_row is not None:
                on_row(rows)
    finally:
        smi.__exit__(None, None, None)
        runner = getattr(session.model, "block_runner", None)
        if info is not None:
            info["graphs"] = runner.stats() if runner is not None else None
        driver.close()  # closes the session: every GPU and pinned buffer freed
    return rows


def summarize(rows: list[dict], warmup: int, slack_mib: float) -> dict:
    steady = rows[warmup:] if len(rows) > warmup + 1 else rows
    firsts = sorted(r["key_to_first_frame_s"] for r in steady)
    wall = sum(r["total_s"] for r in steady)
    previews = sorted(r["key_to_preview_s"] for r in steady if "key_to_preview_s" in r)
    out = {"chunks": len(rows), "steady_chunks": len(steady),
           "key_to_first_frame_median_s": round(statistics.median(firsts), 4),
           "key_to_first_frame_p90_s": round(firsts[min(len(firsts) - 1, int(0.9 * len(firsts)))], 4),
           **({"key_to_preview_median_s": round(statistics.median(previews), 4),
               "key_to_preview_p90_s": round(previews[min(len(previews) - 1, int(0.9 * len(previews)))], 4)}
              if previews else {}),
           "chunk_median_s": round(statistics.median(r["total_s"] for r in steady), 4),
           "sustained_fps": round(sum(r["frames"] for r in steady) / wall, 3) if wall else None}
    q = max(1, len(steady) // 4)
    slack = slack_mib * 2**20
    for key in ("peak_allocated", "peak_reserved", "smi_used", "rss"):
        if any(key not in r for r in steady):
            continue
        early, late = max(r[key] for r in steady[:q]), max(r[key] for r in steady[-q:])
        out[f"{key}_first_quarter"] = early
        out[f"{key}_last_quarter"] = late
        out[f"{key}_flat"] = late - early <= slack
    return out


def run(args, bm: BenchModel) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    res: dict = {"bench": "play", "machine": machine_info(), "args": vars(args), **bm.describe(),
                 "cap_bytes": apply_cap(device, None if args.tiny else args.cap_gib, args.context_gib)}
    fast_path = bm.expert_dir(args.workdir)
    print(f"[model] {'tiny' if args.tiny else 'full-size'} random NF4 {bm.entry.title} in {fast_path} ...", flush=True)
    res["expert"] = write_random_experts({"fast": fast_path}, {"fast": bm.cfg}, str(device), timeout=3600)
    model_path = fast_path
    if args.weights != "nf4":  # the stored FP8 / INT8 copy, converted once from the random NF4 model
        from .bench_fast_speed import lowp_copy

        model_path = bm.expert_dir(args.workdir, args.weights)
        res["lowp_copy"] = lowp_copy(fast_path, model_path, args.weights, str(device), timeout=3600)
    session, plan, load_s = build_session(args, device, model_path, bm)
    played = session.settings  # the model's play window and sink, the preset's cap
    res.update(plan=plan.to_json(), load_s=round(load_s, 3),
               played={"window": played.window, "sink": played.sink, "chunk_frames": played.chunk_frames})
    print(f"[plan] {plan.reason}", flush=True)

    def save_now(rows: list[dict]) -> None:  # a run stopped from outside keeps what it played
        if args.out and len(rows) % SAVE_EVERY == 0:
            write_json(args.out, {**res, "per_chunk": rows, "summary": summarize(rows, args.warmup,
                                                                                 args.flat_slack_mib)})

    rows = asyncio.run(play(session, args.chunks, device, args.budget_s, res, on_row=save_now))
    res["per_chunk"] = rows
    res["summary"] = summarize(rows, args.warmup, args.flat_slack_mib)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        res["after_close_allocated"] = torch.cuda.memory_allocated(device)
    if not args.keep and not args.tiny:
        import shutil

        for path in {fast_path, model_path}:
            shutil.rmtree(path, ignore_errors=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model and 64x112 on the CPU (smoke run, CI)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--chunks", type=int, default=None, help="chunks to play (default 200; tiny 8)")
    p.add_argument("--warmup", type=int, default=None, help="first chunks left out of the summary (default 5; tiny 2)")
    p.add_argument("--window", type=int, default=None,
                   help="latent frames kept (default: the model's play window, v1 Fast 21, v2 18; tiny 6 / 10)")
    p.add_argument("--sink", type=int, default=None,
                   help="latent frames never evicted (default: the model's, v1 Fast 3, v2 6; tiny 1 / 2)")
    p.add_argument("--kv-cache", choices=("auto", "gpu", "host"), default="host", help="where the K/V cache lives")
    p.add_argument("--cap-gib", type=float, default=24.0, help="simulated card size (GiB; 0 = the whole card)")
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    p.add_argument("--speed", default=None, help="a preset (exact, auto, fast, draft) or speed options, e.g. "
                   "compile=blocks,compute=fp8,attention=sdpa")
    p.add_argument("--chunk-steps", type=int, choices=(2, 3, 4), default=None,
                   help="denoising calls per chunk over the preset's (as `play --chunk-steps`)")
    p.add_argument("--tiny-vae", action="store_true",
                   help="decode with a random tiny decoder in taew2_1's format (--tiny-vae of `play`)")
    p.add_argument("--weights", choices=("nf4", "fp8", "int8"), default="nf4",
                   help="the model's stored weights (fp8 / int8: converted once from the random NF4 model)")
    p.add_argument("--no-camera-film", action="store_true",
                   help="compute the camera FiLM at every call instead of keeping it per chunk (A/B)")
    p.add_argument("--film-device-only", action="store_true",
                   help="keep the camera FiLM only of the blocks the card has room for, none in pinned RAM (A/B)")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop playing after this many seconds")
    p.add_argument("--flat-slack-mib", type=float, default=256.0,
                   help="memory counts as flat when the last quarter's peak is within this of the first's")
    p.add_argument("--workdir", default="/tmp/lingbot_fast_bench",
                   help="where the random model is written (each model its own folder: bench_models.py)")
    p.add_argument("--keep", action="store_true", help="keep the random model for the next call")
    p.add_argument("--out", default=None, help="results JSON")
    p.add_argument("--size", default=None, metavar="H*W",
                   help="video size (default the model's benchmark size, 480*832; tiny 64*112), e.g. 304*528 for an "
                        "8 GB card")
    add_model_argument(p)
    args = p.parse_args(argv)
    bm = parse_model(p, args.model, args.tiny)
    if args.size is not None:
        bm = replace(bm, size=parse_bench_size(p, args.size))
    defaults = dict(chunks=(8, 200), warmup=(2, 5), window=(bm.window,) * 2, sink=(bm.sink,) * 2)
    for name, (tiny, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args, bm)
    s = res["summary"]
    print(json.dumps(s, indent=2))
    if args.out:
        write_json(args.out, res)
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

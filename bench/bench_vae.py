"""Benchmark the Wan2.1 VAE: encode/decode time and peak memory, untiled and tiled, at the pipeline's sizes.

GPU (the real measurement):  python bench/bench_vae.py --out vae.json
CPU smoke run:               python bench/bench_vae.py --tiny --out vae_tiny.json

The full-size model gets random weights built directly on the device (timings and memory do not depend on
the values). Each case starts from an emptied allocator cache with the peak counters reset, so "peak" is
that call alone on top of the resident weights and its input.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict

import torch

from ..wan.vae.model import DEFAULT_OVERLAP, DEFAULT_TILE, VAEConfig, WanVAE

FULL_SIZES = ("480x832x81", "464x832x81", "720x1280x81")
TINY_SIZES = ("64x96x9", "48x80x9")
GB = 1e9


def parse_size(s: str) -> tuple:
    h, w, f = (int(v) for v in s.lower().split("x"))
    return h, w, f


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, device: torch.device) -> dict:
    """Run fn() once; wall time and (CUDA) peak allocated / reserved bytes during the call."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    sync(device)
    t0 = time.perf_counter()
    try:
        out = fn()
        sync(device)
    except torch.OutOfMemoryError as e:
        return {"error": f"out of memory: {str(e).splitlines()[0]}"}
    rec = {"seconds": round(time.perf_counter() - t0, 3), "out_shape": list(out.shape)}
    del out
    if device.type == "cuda":
        rec.update(
            resident_before_gb=round(before / GB, 3),
            peak_allocated_gb=round(torch.cuda.max_memory_allocated(device) / GB, 3),
            peak_reserved_gb=round(torch.cuda.max_memory_reserved(device) / GB, 3),
        )
    return rec


def run(args) -> dict:
    device = torch.device(args.device)
    cfg = VAEConfig.tiny() if args.tiny else VAEConfig()
    torch.manual_seed(0)
    with torch.device(device):
        vae = WanVAE(cfg).eval().requires_grad_(False)
    s, t = cfg.spatial_factor, cfg.temporal_factor
    tile = dict(tile=args.tile, overlap=args.overlap)
    modes = {"untiled": dict(tiled=False), "tiled": dict(tiled=True, **tile)}

    # warm-up (kernel selection, allocator) on a small clip, every mode
    warm = torch.zeros(1, 3, 1 + t, 4 * s, 4 * s, device=device)
    for kw in modes.values():
        vae.decode(vae.encode(warm, **kw), **kw)
    del warm

    results = []
    for size in args.sizes:
        h, w, f = parse_size(size)
        for mode in args.modes:
            kw = modes[mode]
            gen = torch.Generator(device=device).manual_seed(0)
            video = torch.rand(1, 3, f, h, w, device=device, generator=gen) * 2 - 1
            rec = {"size": size, "mode": mode, "op": "encode", **measure(lambda: vae.encode(video, **kw), device)}
            results.append(rec)
            print_row(rec)
            del video
            z = torch.randn(1, cfg.z_dim, 1 + (f - 1) // t, h // s, w // s, device=device, generator=gen)
            rec = {"size": size, "mode": mode, "op": "decode", **measure(lambda: vae.decode(z, **kw), device)}
            results.append(rec)
            print_row(rec)
            del z
    return {
        "bench": "vae",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()
                   if k not in ("latent_mean", "latent_std")},
        "weights_gb": round(sum(p.numel() * p.element_size() for p in vae.parameters()) / GB, 3),
        "tile": args.tile, "overlap": args.overlap,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "results": results,
    }


HEADER = f"{'size':>12} {'mode':>8} {'op':>6} {'seconds':>8} {'peak alloc GB':>14} {'peak reserved GB':>17}"


def print_row(r: dict) -> None:
    if "error" in r:
        print(f"{r['size']:>12} {r['mode']:>8} {r['op']:>6} {r['error']}", flush=True)
        return
    alloc = f"{r['peak_allocated_gb']:.2f}" if "peak_allocated_gb" in r else "-"
    res = f"{r['peak_reserved_gb']:.2f}" if "peak_reserved_gb" in r else "-"
    print(f"{r['size']:>12} {r['mode']:>8} {r['op']:>6} {r['seconds']:>8.2f} {alloc:>14} {res:>17}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny config and small clips (CPU smoke run)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--sizes", default=None, help=f"comma-separated HxWxF (default {','.join(FULL_SIZES)})")
    ap.add_argument("--modes", default="untiled,tiled")
    ap.add_argument("--tile", type=int, default=DEFAULT_TILE, help="tile edge in latent cells")
    ap.add_argument("--overlap", type=int, default=DEFAULT_OVERLAP, help="tile overlap in latent cells")
    ap.add_argument("--out", default="bench_vae.json", help="JSON file to write")
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.sizes = args.sizes.split(",") if args.sizes else list(TINY_SIZES if args.tiny else FULL_SIZES)
    args.modes = args.modes.split(",")
    for m in args.modes:
        if m not in ("untiled", "tiled"):
            ap.error(f"unknown mode {m!r}; use untiled and/or tiled")
    if args.tiny and args.tile == DEFAULT_TILE:
        args.tile, args.overlap = 6, 2  # so the small clips are actually split
    print(HEADER, flush=True)
    report = run(args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

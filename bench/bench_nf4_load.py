"""Benchmark: stream an NF4 expert from disk to the GPU (issue 3 targets).

    python -m lingbot_world.bench.bench_nf4_load --out bench/results/nf4_load.json        # H100, full size
    python -m lingbot_world.bench.bench_nf4_load --tiny --device cpu --out /tmp/nf4.json   # CPU smoke run

Steps: (1) a full-size (18.5 B params) random expert is quantized on the GPU layer by layer and written once in
the community layout (≈9.6 GB); (2) the page cache is warmed by reading it once; (3) fresh child processes that
only load it report seconds, GB/s, peak host RSS growth (VmHWM) and peak VRAM; (4) forced failures (a load
cancelled at 60 % from the progress callback, and a truncated copy) must leave `torch.cuda.memory_allocated()`
where it was; (5) a reduced official-format checkpoint (bf16 shards, `--official-layers` of 40 blocks, to save
disk and time) is loaded with NF4 quantization on the fly. Targets: >= 2.5 GB/s warm, RSS growth <= 1 GB,
peak VRAM <= 10.5 GB. Big files are deleted at the end unless --keep.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..loaders.expert_format import detect_format
from ..loaders.expert_loader import load_expert_with_info
from ..loaders.safetensors_stream import iter_tensors
from ..loaders.nf4_writer import make_random_nf4_expert, random_expert_state, write_official_expert
from ..wan.dit.model import DiTConfig
from .common import (
    PeakRSS,
    gb,
    machine_info,
    peak_vram_bytes,
    reset_peak_vram,
    run_json_child,
    table,
    vram_bytes,
    write_json,
)

TARGET_GBPS = 2.5
TARGET_RSS = 1e9
TARGET_VRAM = 10.5e9
MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)


def bench_config(tiny: bool, layers: int | None = None) -> DiTConfig:
    cfg = DiTConfig.tiny(num_layers=4, dim=256, ffn_dim=512, num_heads=2, text_dim=64) if tiny else DiTConfig()
    return dataclasses.replace(cfg, num_layers=layers) if layers else cfg


def make_full_size_expert(out_dir: Path, device: str = "cuda", seed: int = 0, cfg: DiTConfig | None = None) -> dict:
    """A random full-size NF4 expert (community layout) at `out_dir`, quantized on `device`; reusable by other
    benchmarks. Returns the writer's stats plus seconds."""
    t0 = time.perf_counter()
    stats = make_random_nf4_expert(cfg or DiTConfig(), out_dir, device=device, seed=seed)
    return {**stats, "seconds": round(time.perf_counter() - t0, 2)}


def warm_page_cache(path: Path, chunk: int = 64 << 20) -> dict:
    buf = bytearray(chunk)
    view = memoryview(buf)
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(view)
            if not got:
                break
            n += got
    s = time.perf_counter() - t0
    return {"bytes": n, "seconds": round(s, 3), "gb_per_s": round(n / s / 1e9, 2)}


# ---- child: one load in a fresh process ------------------------------------------------------------------
def child_load(path: str, device: str, mode: str, fail_at: float | None) -> dict:
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.empty(1, device=dev)  # CUDA context first: its host memory is not the loader's
    base_vram = vram_bytes(dev) if dev.type == "cuda" else None
    if dev.type == "cuda":
        reset_peak_vram(dev)

    def cancel(done: int, total: int) -> None:
        if fail_at is not None and done >= fail_at * total:
            raise KeyboardInterrupt(f"forced failure at {done / total:.0%} of the load")

    out: dict = {"path": path, "device": device, "mode": mode}
    model = None
    if mode == "stream":  # the reader alone: every tensor read to the device and dropped
        with PeakRSS() as rss:
            fmt = detect_format(path)
            t0 = time.perf_counter()
            n = sum(t.numel() * t.element_size() for f in fmt.files for _, t in iter_tensors(f, dev))
            out.update(bytes_read=n, seconds=round(time.perf_counter() - t0, 4), file_bytes=fmt.file_bytes)
        out["rss_growth_bytes"] = rss.growth
        return out
    with PeakRSS() as rss:
        try:
            fmt = detect_format(path)
            out["file_bytes"] = fmt.file_bytes
            model, info = load_expert_with_info(fmt, dev, mode, progress=cancel)
            out.update(info.to_json())
        except (KeyboardInterrupt, ValueError, OSError) as e:
            out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    out["rss_growth_bytes"] = rss.growth
    out["rss_peak_reset"] = rss.was_reset
    if dev.type == "cuda":
        out["peak_vram_bytes"] = peak_vram_bytes(dev)
        out["vram_before_bytes"] = base_vram
        out["vram_after_bytes"] = vram_bytes(dev)
    if model is not None and dev.type == "cpu":
        # On a CPU target the weights themselves live in host RAM: report the loader's own overhead too.
        out["rss_overhead_bytes"] = rss.growth - out["bytes_on_device"] if rss.growth is not None else None
    del model
    return out


def child(path: Path, device: str, mode: str = "nf4", fail_at: float | None = None) -> dict:
    args = ["-m", MODULE, "--child-load", str(path), "--device", device, "--mode", mode]
    if fail_at is not None:
        args += ["--fail-at", str(fail_at)]
    return run_json_child(args)


def truncated_copy(src: Path, dst: Path, fraction: float = 0.5) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "quantization_meta.json"):
        if (src.parent / name).is_file():
            shutil.copyfile(src.parent / name, dst / name)
    n = int(src.stat().st_size * fraction)
    with open(src, "rb") as fi, open(dst / src.name, "wb") as fo:
        left = n
        while left > 0:
            copied = os.copy_file_range(fi.fileno(), fo.fileno(), left) if hasattr(os, "copy_file_range") else 0
            if not copied:
                fo.write(fi.read(left))
                break
            left -= copied
    return dst


# ---- main ----------------------------------------------------------------------------------------------
def run(args) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = bench_config(args.tiny)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nf4_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    expert = work / "high_noise_model_bnb_nf4"
    res: dict = {"machine": machine_info(), "device": device, "tiny": args.tiny, "config": cfg.to_json()}
    try:
        print(f"[1] writing a random NF4 expert ({'tiny' if args.tiny else 'full size'}) to {expert} ...", flush=True)
        res["write"] = make_full_size_expert(expert, device, cfg=cfg)
        weights = expert / "model.safetensors"
        res["write"]["file_bytes"] = weights.stat().st_size
        print(f"    {gb(res['write']['file_bytes'])} in {res['write']['seconds']} s", flush=True)
        res["warm_read"] = warm_page_cache(weights)
        print(f"[2] page cache warm read: {res['warm_read']['gb_per_s']} GB/s", flush=True)

        loads = []
        for i in range(args.repeats or (1 if args.tiny else 2)):
            r = child(expert, device)
            loads.append(r)
            print(f"[3] load {i + 1}: {r.get('seconds')} s, {r.get('gb_per_s')} GB/s, RSS +{gb(r['rss_growth_bytes'])}, "
                  f"VRAM peak {gb(r.get('peak_vram_bytes'))}", flush=True)
        res["loads"] = loads
        res["best_load"] = min(loads, key=lambda r: r["seconds"])

        r = child(expert, device, fail_at=0.6)
        res["cancelled_load"] = r
        print(f"[4] cancelled at 60%: {r.get('error')}; VRAM after {r.get('vram_after_bytes')} (before {r.get('vram_before_bytes')})", flush=True)
        trunc = truncated_copy(weights, work / "truncated_bnb_nf4")
        r = child(trunc, device)
        res["truncated_load"] = r
        shutil.rmtree(trunc, ignore_errors=True)
        print(f"    truncated copy: {r.get('error')}", flush=True)

        if not args.keep:
            shutil.rmtree(expert, ignore_errors=True)
        ocfg = bench_config(args.tiny, args.official_layers or (2 if args.tiny else 8))
        official = work / "high_noise_model"
        print(f"[5] writing a reduced official checkpoint ({ocfg.num_layers} of {cfg.num_layers} blocks, bf16 shards) ...", flush=True)
        t0 = time.perf_counter()
        gen_device = device if device == "cuda" else "cpu"
        write_official_expert(random_expert_state(ocfg, gen_device, seed=1, dtype=torch.bfloat16), ocfg, official,
                              dtype=torch.bfloat16, max_shard_bytes=(5 << 30) if not args.tiny else (1 << 20))
        res["official_write_seconds"] = round(time.perf_counter() - t0, 2)
        warm_page_cache_all(official)
        r = child(official, device)
        r["layers"] = ocfg.num_layers
        res["official_nf4_on_the_fly"] = r
        print(f"    NF4 on the fly: {r.get('seconds')} s, {r.get('gb_per_s')} GB/s read, RSS +{gb(r['rss_growth_bytes'])}, "
              f"VRAM peak {gb(r.get('peak_vram_bytes'))}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    res["targets"] = check_targets(res, device)
    return res


def warm_page_cache_all(folder: Path) -> None:
    for p in sorted(folder.glob("*.safetensors")):
        warm_page_cache(p)


def check_targets(res: dict, device: str) -> dict:
    best = res["best_load"]
    c = res["cancelled_load"]
    t = res["truncated_load"]
    out = {
        "gb_per_s>=2.5": best["gb_per_s"] >= TARGET_GBPS,
        "rss_growth<=1GB": (best["rss_growth_bytes"] or 0) <= TARGET_RSS,
        "cancel_raised": "error" in c,
        "truncated_raised": "error" in t,
    }
    if device == "cuda":
        out["peak_vram<=10.5GB"] = best["peak_vram_bytes"] <= TARGET_VRAM
        out["vram_restored_after_cancel"] = c["vram_after_bytes"] == c["vram_before_bytes"]
        out["vram_restored_after_truncated"] = t["vram_after_bytes"] == t["vram_before_bytes"]
    else:  # host RAM holds the weights on a CPU target; the loader's own overhead is what is bounded
        out["rss_overhead<=1GB"] = (best.get("rss_overhead_bytes") or 0) <= TARGET_RSS
        out.pop("gb_per_s>=2.5")
        out.pop("rss_growth<=1GB")
    return out


def print_table(res: dict) -> None:
    rows = []
    for name, r in [("nf4 expert (best)", res["best_load"]), ("cancelled at 60%", res["cancelled_load"]),
                    ("truncated copy", res["truncated_load"]), ("official bf16 -> nf4", res["official_nf4_on_the_fly"])]:
        rows.append([
            name,
            gb(r.get("file_bytes")),
            r.get("seconds", "-"),
            r.get("gb_per_s", "-"),
            gb(r.get("rss_growth_bytes")),
            gb(r.get("peak_vram_bytes")),
            gb(r.get("vram_after_bytes")),
            (r.get("error") or "ok")[:40],
        ])
    print(table(rows, ["case", "file", "s", "GB/s", "RSS growth", "VRAM peak", "VRAM after", "result"]))
    print("targets:", json.dumps(res["targets"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke run)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--workdir", default=None, help="where the big files go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the written experts")
    p.add_argument("--repeats", type=int, default=None, help="timed loads of the NF4 expert (default 2; 1 with --tiny)")
    p.add_argument("--official-layers", type=int, default=None, help="blocks in the reduced official checkpoint (default 8; 2 with --tiny)")
    p.add_argument("--child-load", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="nf4", help=argparse.SUPPRESS)
    p.add_argument("--fail-at", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_load:
        print(json.dumps(child_load(args.child_load, args.device or "cuda", args.mode, args.fail_at)))
        return 0
    res = run(args)
    print_table(res)
    if args.out:
        write_json(args.out, res)
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

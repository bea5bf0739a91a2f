"""Benchmark: `lingbot-world compare` at full size on a GPU, on random weights in the real formats: the quality
table of docs/speed.md (PSNR / SSIM of each preset's frames against the first preset's, and the K/V cache's drift,
chunk by chunk) for the presets a user picks between, made exactly as a user makes it on their own weights.

    # one H200: the v2 1.3B, 8 chunks at 480x832 (builds the umT5 .pth, the VAE and the model first, ~1-2 minutes;
    # the K/V drift keeps the first preset's cache on disk at every chunk boundary: ~32 GB in --workdir)
    python -m lingbot_world.bench.bench_compare --model v2-1.3b --chunks 8 --workdir /tmp/lwc \\
        --out-dir bench/results/compare_v2_1.3b_h200
    python -m lingbot_world.bench.bench_compare --tiny --out-dir /tmp/compare_tiny      # CPU smoke run

The files: the model's random NF4 DiT (bench_models.py) in its release folder name under a checkpoint folder, and the
umT5 encoder, VAE and tokenizer in an assets folder (bench_e2e.build_shared_files), a random tiny decoder in
taew2_1's format for the presets that decode with it. The comparison is the CLI itself, run in a child process
(`python -m lingbot_world compare`), with the release's example 00 image and prompt; its compare.json and
compare.png land in --out-dir, with this run's bench.json (the command, the machine, the seconds).

The numbers are those of untrained weights: they show how far each preset moves the video through 30 or 40
untrained blocks, which is more than trained weights move (BENCHMARKS' "error per forward" rows say the same);
users run the same command on their own weights for their numbers (docs/speed.md).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from .bench_e2e import build_shared_files
from .bench_models import add_model_argument, parse_model
from .expert_files import write_random_experts
from .common import SmiPoller, machine_info, write_json

MODULE = __spec__.name if __spec__ is not None else __name__
PACKAGE = MODULE.rsplit(".bench.", 1)[0]
EXAMPLE = Path(__file__).resolve().parents[1] / "assets" / "examples" / "00"
PRESETS = ("exact", "auto", "fast", "draft", "draft:steps=2", "draft:steps=2,tiny-vae")


def build(workdir: Path, bm, device: str) -> dict:
    """The checkpoint folder (the DiT under its release folder name), the assets folder and the tiny decoder."""
    from ..loaders.demo_checkpoint import DEMO_TINY_WIDTHS, write_random_tiny_vae

    t0 = time.perf_counter()
    expert = bm.expert_dir(workdir)
    write_random_experts({"fast": expert}, {"fast": bm.cfg}, device, timeout=3600)
    ckpt = workdir / f"ckpt_{bm.name}"
    ckpt.mkdir(parents=True, exist_ok=True)
    link = ckpt / next(d for d in bm.entry.files.dit_dirs if d)  # the NF4 copy's folder name of the release
    if not link.exists():
        link.symlink_to(expert.resolve())
    assets = workdir / "assets"
    shared = build_shared_files(assets, bm.tiny, device)
    tiny_vae = workdir / "taew2_1_bench.safetensors"
    if not tiny_vae.is_file():
        write_random_tiny_vae(tiny_vae, widths=DEMO_TINY_WIDTHS if bm.tiny else (256, 128, 64, 64))
    return {"ckpt_dir": str(ckpt), "assets_dir": str(assets), "tiny_vae": str(tiny_vae),
            **{k: str(v) for k, v in shared.items()}, "seconds": round(time.perf_counter() - t0, 1)}


def compare_argv(args, bm, files: dict) -> list[str]:
    h, w = bm.size
    argv = [sys.executable, "-m", PACKAGE, "compare", "--model", bm.name, "--ckpt-dir", files["ckpt_dir"],
            "--assets-dir", files["assets_dir"], "--image", str(EXAMPLE / "image.jpg"),
            "--prompt", (EXAMPLE / "prompt.txt").read_text(encoding="utf-8").strip(), "--chunks", str(args.chunks),
            "--size", f"{h}*{w}", "--tiny-vae", files["tiny_vae"], "--out-dir", str(args.out_dir),
            "--cache-dir", str(Path(args.workdir) / "text_cache"), "--kv-drift", args.kv_drift,
            "--device", args.device]
    for preset in args.presets.split(";"):
        argv += ["--preset", preset]
    return argv


def run(args) -> dict:
    bm = args.bench_model
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.tiny else args.device
    res = {"bench": "compare", "machine": machine_info(), "args": {k: v for k, v in vars(args).items()
                                                                   if k != "bench_model"}, **bm.describe()}
    print(f"[files] {'tiny' if args.tiny else 'full-size'} random {bm.entry.title}, umT5, VAE in {workdir} ...",
          flush=True)
    res["files"] = build(workdir, bm, "cpu" if args.tiny else "cuda")
    argv = compare_argv(args, bm, res["files"])
    res["command"] = argv[1:]
    print("[compare] " + " ".join(argv[3:]), flush=True)
    t0 = time.perf_counter()
    with SmiPoller(interval=0.5) as smi:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout_s)
    res["compare_seconds"] = round(time.perf_counter() - t0, 1)
    res["smi_peak_used_mib"] = smi.peak_mib if device != "cpu" else None
    res["returncode"] = proc.returncode
    res["stdout"] = proc.stdout.splitlines()[-60:]
    res["stderr_tail"] = proc.stderr.splitlines()[-30:]
    print(proc.stdout, flush=True)
    if proc.returncode:
        print(proc.stderr[-4000:], file=sys.stderr, flush=True)
    table = Path(args.out_dir) / "compare.json"
    if table.is_file():
        res["compare"] = json.loads(table.read_text(encoding="utf-8"))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tiny model and 64x112 on the CPU (smoke run)")
    p.add_argument("--device", default="cuda", help="the compare run's device (tiny: cpu)")
    p.add_argument("--chunks", type=int, default=8, help="chunks each preset makes (default 8)")
    p.add_argument("--presets", default=";".join(PRESETS),
                   help=f"the presets, ';'-separated, the first the reference (default {';'.join(PRESETS)})")
    p.add_argument("--kv-drift", choices=("on", "off"), default="on")
    p.add_argument("--workdir", default="/tmp/lingbot_compare_bench", help="where the random files are written")
    p.add_argument("--out-dir", type=Path, required=True, help="compare.json, compare.png and bench.json go here")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="the compare run's time limit")
    add_model_argument(p)
    args = p.parse_args(argv)
    args.bench_model = parse_model(p, args.model, args.tiny)
    if args.tiny:
        args.device = "cpu"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    res = run(args)
    write_json(args.out_dir / "bench.json", res)
    print(f"results: {args.out_dir}")
    return res["returncode"]


if __name__ == "__main__":
    sys.exit(main())

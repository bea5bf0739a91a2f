"""Benchmark: end to end through the CLI, wall clock from process start to exit, the Fast model against the base
model on the same 480x832x81 video in one session, full-size random weights in the real formats.

    # one H100, < 9 minutes (builds ~45 GB of files in --workdir first, ~2 minutes)
    python -m lingbot_world.bench.bench_e2e --workdir /tmp/lwe --out bench/results/e2e_h100.json
    # the Fast runs only, overlaps on and off (~5 minutes with the files' ~2 minutes)
    python -m lingbot_world.bench.bench_e2e --workdir /tmp/lwe --out bench/results/e2e_overlap_h100.json \
        --runs store_prompt,fast_cold,fast_cold_overlap_off,fast_cached,fast_cached_overlap_off
    python -m lingbot_world.bench.bench_e2e --tiny --out /tmp/e2e_tiny.json           # CPU smoke run

Files: the Fast model and one base expert as random NF4 experts (community layout; the low-noise expert is the
high one under another name: a real switch, the same bytes), the release's umT5 .pth (bf16, 11.4 GB), the Wan2.1
VAE .pth, a small trained tokenizer. Every run is `generate` with its defaults (speed `auto` included) in a fresh
process started by this one: its wall time includes Python's start, the imports, CUDA's start and the exit; the
CLI's summary line gives its stages, and time stamps say where the seconds outside them go.
- store_prompt, base_warm: untimed warm-ups (page cache, the prompt cache, inductor's kernels);
- fast_cold: `--model fast`, prompt not cached (--no-text-cache: the umT5 child runs, beside the loading where it fits);
- fast_cached: the same with the prompt in the cache (what every later run of that prompt costs); fast_cached_compile_off;
- fast_cold_overlap_off / fast_cached_overlap_off: the same with `--overlap off` (the start-up one step after the
  other: imports, VAE encode, load, the K/V cache's host memory), for the seconds the overlaps save in one session;
- base_70: the base model with its defaults (70 steps), measured: a call of its own (~9 minutes on an H100), after
  a call that made the files (--workdir kept) and warmed inductor's cache (base_warm); its runs join --out's;
- base_2 / base_4: the base model with --steps 2 and 4 (each one expert switch); without base_70,
  base end to end = wall(2) + 68 x (wall(4) - wall(2)) / 2 (the slope is one step's seconds, CFG included).
A card is simulated with `set_per_process_memory_fraction` (--cap-gib minus --context-gib) in the CLI process; the
umT5 child is not capped by it, but the CLI counts the child's VRAM against that cap before loading anything beside it,
and nvidia-smi's peak (parent + child) is recorded to show that both fit on such a card.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from .common import SmiPoller, earlier_results, machine_info, write_json

MODULE = __spec__.name if __spec__ is not None else __name__
PACKAGE = MODULE.rsplit(".bench.", 1)[0]
GiB = 1024**3
STEPS = 70
PROMPT = "A stone bridge over a river in a quiet mountain village, morning light, the camera glides forward."
TARGET = 20.0  # issue #14: Fast >= 20x faster than the base model end to end


# ---- the files -------------------------------------------------------------------------------------------------
def build_shared_files(folder: Path, tiny: bool, device: str) -> dict:
    """The files every LingBot-World download shares, random but in the release's formats: the umT5 .pth (bf16,
    11.4 GB at full size), the Wan2.1 VAE .pth and a small trained tokenizer. Reused when present."""
    from ..wan.text.umt5 import UMT5Config
    from ..wan.vae.model import VAEConfig, WanVAE
    from .bench_t5 import build_release_file, train_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    t5 = folder / "models_t5_umt5-xxl-enc-bf16.pth"
    if not t5.is_file():
        tmp = t5.with_suffix(".tmp")
        build_release_file(tmp, UMT5Config.tiny() if tiny else UMT5Config(), device)
        os.replace(tmp, t5)
    vae = folder / "Wan2.1_VAE.pth"
    if not vae.is_file():
        torch.manual_seed(20)
        model = WanVAE(VAEConfig())  # the CLI knows the real VAE only (outside a demo folder)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, vae.with_suffix(".tmp"))
        os.replace(vae.with_suffix(".tmp"), vae)
    tok = folder / "tokenizer" / "spiece.model"
    if not tok.is_file():
        train_tokenizer(tok.parent, 400 if tiny else 2000)
    return {"t5": t5, "vae": vae, "tokenizer": tok}


def build_files(workdir: Path, tiny: bool, device: str) -> dict:
    """Reused when present (config.json of the experts matches; the other files exist)."""
    from ..wan.dit.model import DiTConfig
    from .pipeline_setup import bench_config
    from .expert_files import write_random_experts

    t0 = time.perf_counter()
    base = bench_config(tiny)
    cfgs = {"fast": DiTConfig(**{**base.__dict__, "causal": True}), "base": base}
    paths = {"fast": workdir / "lingbot_world_fast_bnb_nf4", "base": workdir / "high_noise_model_bnb_nf4"}
    write_random_experts(paths, cfgs, device, timeout=900)
    low = workdir / "low_noise_model_bnb_nf4"
    if not low.exists():
        low.symlink_to(paths["base"].name)
    shared = build_shared_files(workdir, tiny, device)
    return {"fast": paths["fast"], "high": paths["base"], "low": low, **shared,
            "seconds": round(time.perf_counter() - t0, 1)}


# ---- one CLI run -------------------------------------------------------------------------------------------------
def child_main(spec: dict) -> int:
    """In the fresh process: cap the allocator like the card, then run the CLI exactly as a user would."""
    import importlib

    import atexit

    times = {"enter": time.time()}
    if spec.get("cap_bytes") and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_bytes"] / total), 0)
    times["cuda"] = time.time()
    cli = importlib.import_module(f"{PACKAGE}.cli")
    times["cli_imported"] = time.time()
    # the last thing this process says before Python's own teardown (modules, CUDA, pinned memory)
    atexit.register(lambda: print("E2E_TIMES " + json.dumps({**times, "atexit": time.time()}), file=sys.stderr,
                                  flush=True))
    try:
        return cli.main(spec["argv"])
    finally:
        times["main_done"] = time.time()


def summary_stages(stdout: str) -> dict:
    """{stage: seconds} and the CLI's own total from its summary line 'seed N; total Xs (a 1.0s, b 2.0s, ...)'."""
    m = re.search(r"total ([\d.]+)s \((.*)\)", stdout)
    if not m:
        return {}
    stages = {name.strip(): float(sec) for name, sec in re.findall(r"([^,]+?) ([\d.]+)s", m.group(2))}
    return {"cli_total_s": float(m.group(1)), "stages": stages}


def run_cli(name: str, argv: list, cap_bytes: Optional[int], timeout: float, log_dir: Path) -> dict:
    spec = {"argv": argv, "cap_bytes": cap_bytes}
    with SmiPoller(interval=0.2) as smi:  # parent + child processes together
        t_spawn = time.time()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", MODULE, "--child", json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        t_end = time.time()
    peak = smi.peak_mib
    (log_dir / f"{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    out = {"rc": proc.returncode, "wall_s": round(wall, 2), "smi_peak_mib": peak, **summary_stages(proc.stdout)}
    stamp = re.search(r"E2E_TIMES (\{.*\})", proc.stderr)
    if stamp:  # where the seconds outside the CLI's own summary go
        t = json.loads(stamp.group(1))
        out["process"] = {"python_and_torch_import_s": round(t["enter"] - t_spawn, 2),
                          "cuda_init_s": round(t["cuda"] - t["enter"], 2),
                          "cli_import_s": round(t["cli_imported"] - t["cuda"], 2),
                          "main_s": round(t["main_done"] - t["cli_imported"], 2),
                          "exit_s": round(t_end - t["main_done"], 2),
                          # of which: other atexit handlers (registered later, run first) / Python's and CUDA's
                          # teardown after the last one
                          "exit_atexit_s": round(t["atexit"] - t["main_done"], 2),
                          "exit_teardown_s": round(t_end - t["atexit"], 2)}
        if out.get("cli_total_s") is not None:  # main's seconds before the CLI's own clock starts: its imports
            out["process"]["main_before_stages_s"] = round(out["process"]["main_s"] - out["cli_total_s"], 2)
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:500]
    t5 = re.search(r"text encoder: \d+ prompt\(s\) on (\S+) in ([\d.]+) s \((.*)\)", proc.stderr)
    if t5:
        out["t5_device"], out["t5_child_total_s"], out["t5_child_stages"] = t5.group(1), float(t5.group(2)), t5.group(3)
    beside = re.search(r"text encoder on \S+ in the background; (.*)", proc.stderr)
    out["text_beside"] = beside.group(1).strip() if beside else None
    return out


def run(args) -> dict:
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    res = earlier_results(out, args.fresh, "e2e")  # a second call (e.g. base_70 alone) adds its runs
    res.update(machine=machine_info(), device=device, tiny=args.tiny, prompt=PROMPT, cap_gib=args.cap_gib,
               camera="example 00's poses" if args.camera else None)
    files = build_files(workdir, args.tiny, device)
    res["files_seconds"] = files.pop("seconds")
    image = Path(__file__).resolve().parents[1] / "assets" / "examples" / "00" / "image.jpg"
    cache = workdir / "text_cache"
    shutil.rmtree(cache, ignore_errors=True)
    video = ["--frames", "17", "--size", "64*112"] if args.tiny else ["--frames", "81", "--size", "480*832"]
    # example 00's recorded camera: the camera layers run (and the base model's camera cache with them), as in use
    camera = ["--camera", str(image.parent)] if args.camera else []
    common = ["generate", "--image", str(image), "--prompt", PROMPT, "--t5", str(files["t5"]), "--vae", str(files["vae"]),
              "--tokenizer", str(files["tokenizer"]), "--cache-dir", str(cache), "--seed", "7", *video, *camera]
    if device == "cpu":
        common += ["--device", "cpu"]
    ffmpeg = shutil.which("ffmpeg") is not None or _has_imageio_ffmpeg()
    cap = int((args.cap_gib - args.context_gib) * GiB) if device == "cuda" and args.cap_gib else None
    fast = ["--model", "fast", "--fast-model", str(files["fast"])]
    base = ["--high", str(files["high"]), "--low", str(files["low"])]
    if args.camera:  # what auto picks for 70 steps, also in the 2- and 4-step runs the slope is taken from
        base += ["--camera-cache", "host"]
    runs = {  # name: (extra flags, timed?); the untimed ones warm the page cache, the prompt cache and inductor's
        "store_prompt": (fast + ["--frames", "17"], False),
        "fast_cold": (fast + ["--no-text-cache"], True),
        "fast_cold_overlap_off": (fast + ["--no-text-cache", "--overlap", "off"], True),  # the start-up in turn
        "fast_cached": (fast, True),
        "fast_cached_overlap_off": (fast + ["--overlap", "off"], True),
        "fast_cached_compile_off": (fast + ["--compile", "off"], True),
        "base_warm": (base + ["--steps", "1", "--no-text-cache"], False),
        "base_2": (base + ["--steps", "2", "--no-text-cache"], True),
        "base_4": (base + ["--steps", "4", "--no-text-cache"], True),
        "base_70": (base + ["--no-text-cache"], True),  # the defaults: 70 steps, ~9 minutes on an H100
    }
    res.setdefault("runs", {})
    for name in args.runs:
        extra, timed = runs[name]
        target = workdir / (f"{name}.mp4" if ffmpeg else name)
        if not ffmpeg:
            shutil.rmtree(target, ignore_errors=True)
        print(f"[{name}] ...", flush=True)
        argv = common + extra + ["--out", str(target)]
        if "--frames" in extra:  # the warm-up's own length replaces the video's
            i = argv.index("--frames")
            del argv[i:i + 2]
            argv += ["--frames", extra[extra.index("--frames") + 1]]
        r = run_cli(name, argv, cap, args.timeout, workdir)
        r["timed"] = timed
        res["runs"][name] = r
        print(f"[{name}] {r.get('error') or str(r['wall_s']) + ' s wall'} {json.dumps(r.get('stages', {}))} "
              f"{json.dumps(r.get('process', {}))}", flush=True)
        if out is not None:
            write_json(out, res)
    res["output"] = "mp4 (ffmpeg)" if ffmpeg else "PNG frames (no ffmpeg on this machine)"
    res["summary"] = summarize(res["runs"])
    if out is not None:
        write_json(out, res)
    print(json.dumps(res["summary"], indent=1))
    return res


def _has_imageio_ffmpeg() -> bool:
    try:
        import imageio_ffmpeg

        return Path(imageio_ffmpeg.get_ffmpeg_exe()).is_file()
    except Exception:
        return False


def summarize(runs: dict) -> dict:
    s: dict = {}
    for name in ("fast_cold", "fast_cached"):  # what the start-up overlaps (imports, encode/load, host memory) save
        on, off = runs.get(name, {}), runs.get(f"{name}_overlap_off", {})
        if on.get("rc") == 0 and off.get("rc") == 0:
            s[f"{name}_overlap_saves_s"] = round(off["wall_s"] - on["wall_s"], 2)
    b2, b4, b70 = runs.get("base_2", {}), runs.get("base_4", {}), runs.get("base_70", {})
    if b2.get("rc") == 0 and b4.get("rc") == 0:
        step = (b4["wall_s"] - b2["wall_s"]) / 2
        s["base_s_per_step"] = round(step, 3)
        s["base_end_to_end_s"] = round(b2["wall_s"] + (STEPS - 2) * step, 1)
        s["base_end_to_end"] = "extrapolated from base_2 and base_4"
    if b70.get("rc") == 0:
        s["base_end_to_end_s"] = b70["wall_s"]
        s["base_end_to_end"] = "measured (base_70)"
    if "base_end_to_end_s" in s:
        for name in ("fast_cold", "fast_cached", "fast_cached_compile_off"):
            r = runs.get(name, {})
            if r.get("rc") == 0:
                ratio = s["base_end_to_end_s"] / r["wall_s"]
                s[f"{name}_s"] = r["wall_s"]
                s[f"{name}_speedup"] = round(ratio, 2)
                s[f"{name}_meets_{TARGET:g}x"] = ratio >= TARGET
    return s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (smoke run)")
    p.add_argument("--workdir", default="/tmp/lingbot_e2e")
    p.add_argument("--out", default=None, help="results JSON")
    p.add_argument("--runs", default="store_prompt,fast_cold,fast_cached,fast_cached_compile_off,base_warm,base_2,base_4",
                   type=lambda s: s.split(","))
    p.add_argument("--cap-gib", type=float, default=24.0, help="simulated card size (0: the whole GPU)")
    p.add_argument("--context-gib", type=float, default=0.5, help="the CUDA context's share of the card")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per CLI run (base_70: give ~590)")
    p.add_argument("--fresh", action="store_true", help="ignore the runs already in --out")
    p.add_argument("--camera", action="store_true",
                   help="both models follow example 00's recorded camera (camera layers on; earlier rows ran without)")
    args = p.parse_args(argv)
    if args.child is not None:
        return child_main(json.loads(args.child))
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

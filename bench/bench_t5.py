"""Benchmark the umT5-XXL text-encoder child process: wall time, load time, child peak RSS / VRAM, parent RSS
growth and cache-hit time.

GPU (the real measurement):  python bench/bench_t5.py --out t5.json [--skip-cpu] [--workdir /big/disk]
CPU smoke run:               python bench/bench_t5.py --tiny --out t5_tiny.json

The encoder file is the release format, `models_t5_umt5-xxl-enc-bf16.pth` (Wan key names, bf16), filled
with random values: timings and memory do not depend on them. It is written by a separate process with
torch.save from a state dict built tensor by tensor on the GPU (when there is one), so host RAM holds one
tensor at a time while writing; 11.36 GB of disk are needed at full size. The tokenizer is a small
SentencePiece model trained here on the prompts (no downloads), so token counts differ a little from the
real umT5 tokenizer; the status records them.

Runs (each a fresh child, as in ComfyUI): CUDA with the file evicted from the page cache first (cold read,
via posix_fadvise), CUDA with the file cached (through `encode_prompts`, which also fills the embedding
cache), and CPU (bf16, the release file used in place). Targets: child peak RSS <= 12.5 GB on the CPU and
<= 2 GB on CUDA, load <= 15 s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..text_encoder.child_process import run_text_encoder
from ..text_encoder.encode import encode_prompts
from ..loaders.t5_tokenizer import resolve_tokenizer_source
from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
from ..wan.text.umt5 import UMT5Config, UMT5Encoder

MODULE = __spec__.name if __spec__ is not None else __name__  # the name this file runs under (`-m`)

PROMPT = (
    "The video presents a soaring journey through a fantasy jungle. The wind whips past the rider's blue hands "
    "gripping the reins, causing the leather straps to vibrate. The ancient gothic castle approaches steadily, "
    "its stone details becoming clearer against the backdrop of floating islands and distant waterfalls."
)
TARGETS = {"child_peak_rss_cpu_bytes": 12.5e9, "child_peak_rss_cuda_bytes": 2e9, "load_s": 15.0}
GB = 1e9


# ---- building the inputs (runs in its own process: `--build-file`) ------------------------------------


def build_release_file(path: Path, cfg: UMT5Config, device: str) -> None:
    """Random bf16 weights with the release's names, generated on `device`, saved with torch.save."""
    torch.manual_seed(0)
    state = {}
    for name, meta in UMT5Encoder.on_meta(cfg).state_dict().items():
        if "norm" in name:
            t = torch.ones(meta.shape, dtype=torch.bfloat16, device=device)
        else:
            std = 1.0 if name == "token_embedding.weight" or "pos_embedding" in name else meta.shape[-1] ** -0.5
            t = torch.randn(meta.shape, dtype=torch.bfloat16, device=device) * std
        state[name] = t
    torch.save(state, path)


def train_tokenizer(folder: Path, vocab_size: int) -> Path:
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    words = (PROMPT + " " + DEFAULT_NEGATIVE_PROMPT).replace("，", " ").split()
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join([PROMPT, DEFAULT_NEGATIVE_PROMPT] * 50 + words * 5), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "spiece"), vocab_size=vocab_size, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    )
    return folder / "spiece.model"


# ---- measuring -----------------------------------------------------------------------------------------


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
    except OSError:
        pass


def evict_from_page_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def parent_measured(fn) -> tuple:
    """Run fn(); returns (result, wall seconds, growth of this process's peak RSS in bytes)."""
    _reset_peak_rss()
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    growth = None if before is None or peak is None else max(0, peak - before)
    return out, wall, growth


def run_case(name: str, enc: Path, tok, texts, device: str, cold: bool, cache_dir: Path | None) -> dict:
    rec = {"case": name, "device_requested": device}
    if cold:
        rec["evicted_from_page_cache"] = evict_from_page_cache(enc)
    stats: dict = {}
    try:
        if cache_dir is None:
            (embs, status), wall, growth = parent_measured(
                lambda: run_text_encoder(enc, tok, texts, device=device))
        else:
            embs, wall, growth = parent_measured(
                lambda: encode_prompts(enc, tok, texts, device=device, cache_dir=cache_dir, stats=stats))
            status = stats["worker"]
    except Exception as e:  # keep the other cases
        rec["error"] = f"{type(e).__name__}: {e}"[-3000:]
        return rec
    rec.update(status)
    rec.update(wall_s=round(wall, 3), parent_rss_growth_bytes=growth,
               finite=all(bool(e.float().isfinite().all()) for e in embs))
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON result path")
    ap.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke run)")
    ap.add_argument("--skip-cpu", action="store_true", help="skip the CPU run of the encoder")
    ap.add_argument("--workdir", help="where to write the encoder file (default: a temp dir, removed after)")
    ap.add_argument("--build-file", nargs=2, metavar=("PATH", "DEVICE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cfg = UMT5Config.tiny(vocab_size=4096) if args.tiny else UMT5Config.xxl()

    if args.build_file:
        build_release_file(Path(args.build_file[0]), cfg, args.build_file[1])
        return 0

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-t5-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "t5",
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()},
        "config": "tiny" if args.tiny else "xxl",
        "params": cfg.num_params(),
        "file_format": "release .pth (Wan names, bf16, torch.save zip), random weights",
        "targets": TARGETS,
    }
    cuda = torch.cuda.is_available()
    if cuda:
        p = torch.cuda.get_device_properties(0)
        result["machine"].update(gpu=p.name, gpu_memory_bytes=p.total_memory, cuda=torch.version.cuda)
    try:
        enc = work / "models_t5_umt5-xxl-enc-bf16.pth"
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", MODULE, "--out", args.out, "--build-file", str(enc), "cuda" if cuda else "cpu"]
        subprocess.run(cmd + (["--tiny"] if args.tiny else []), check=True)
        result["file"] = {"bytes": enc.stat().st_size, "build_s": round(time.perf_counter() - t0, 2)}
        tok = resolve_tokenizer_source(train_tokenizer(work / "tokenizer", 2000 if not args.tiny else 400))
        texts = [PROMPT, DEFAULT_NEGATIVE_PROMPT]
        cache_dir = work / "cache"

        cases = []
        if cuda:
            cases.append(run_case("cuda_cold", enc, tok, texts, "cuda", cold=True, cache_dir=None))
            cases.append(run_case("cuda_warm", enc, tok, texts, "cuda", cold=False, cache_dir=cache_dir))
        if not args.skip_cpu:
            cases.append(run_case("cpu", enc, tok, texts, "cpu", cold=False,
                                  cache_dir=None if cuda else cache_dir))
        result["cases"] = cases

        hits = []
        for _ in range(5):
            stats: dict = {}
            t0 = time.perf_counter()
            encode_prompts(enc, tok, texts, cache_dir=cache_dir, stats=stats)
            hits.append(time.perf_counter() - t0)
            if stats["encoded"]:
                break
        result["cache_hit_ms"] = {"best": round(min(hits) * 1e3, 3), "first": round(hits[0] * 1e3, 3),
                                  "prompts": len(texts)}

        checks = {}
        for c in cases:
            if "error" in c:
                continue
            kind = "cuda" if c["device"].startswith("cuda") else "cpu"
            checks[f"{c['case']}_peak_rss_ok"] = c["peak_rss_bytes"] <= TARGETS[f"child_peak_rss_{kind}_bytes"]
            checks[f"{c['case']}_load_ok"] = c["load_s"] <= TARGETS["load_s"]
        checks["cache_hit_under_50ms"] = min(hits) < 0.05
        result["checks"] = checks
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    for c in result.get("cases", []):
        if "error" in c:
            print(f"{c['case']:10s} ERROR {c['error'][:300]}")
            continue
        vram = c.get("cuda_max_allocated_bytes")
        print(f"{c['case']:10s} device={c['device']:6s} wall={c['wall_s']:7.2f}s load={c['load_s']:6.2f}s "
              f"encode={c['encode_s']:6.2f}s child_peak_rss={c['peak_rss_bytes'] / GB:6.2f}GB "
              f"vram={'-' if vram is None else f'{vram / GB:.2f}GB'} "
              f"parent_growth={(c['parent_rss_growth_bytes'] or 0) / 1e6:.1f}MB tokens={c['lengths']}")
    print(f"cache hit: {result.get('cache_hit_ms')}  checks: {result.get('checks')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Child process: tokenize and encode prompts with umT5, write the embeddings as safetensors, exit.

Run as a plain script, `python worker.py <job.json>` (started by `child_process.run_text_encoder`). It reads and
deletes the job file at once, and dies with its parent (see `_die_with_parent`).
Inside ComfyUI the pack's module name is a filesystem path and `multiprocessing` cannot re-import it, so
this file is self-contained: at module level it imports only the standard library, and it reaches the
pack's own modules by loading the pack from its path under a private package name.

Job (JSON file): encoder, tokenizer {kind, path}, prompts, device ("auto" | "cpu" | "cuda[:N]"), dtype,
max_length, out (safetensors path inside the parent's private temp dir). While it works, the worker prints
progress lines {"stage": "load" | "encode", "done", "total", ...} (load: bytes of weights, encode: prompts) that
the parent shows in ComfyUI's progress bar. The last stdout line is a JSON status: {"ok": true, device, load_s,
encode_s, peak_rss_bytes, cuda_max_allocated_bytes, lengths, ...} or {"ok": false, "error", "error_type"} (exit
code 2). No pickle crosses the process boundary.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

PRIVATE_PACKAGE = "_lingbot_world_worker"
CUDA_MARGIN_BYTES = 1 << 30  # activations (512 tokens), cuBLAS workspace, allocator slack
TEST_DELAY_ENV = "LINGBOT_T5_WORKER_TEST_DELAY"  # tests only: seconds to sleep before loading
PARENT_PID_ENV = "LINGBOT_T5_PARENT_PID"  # set by the parent: exit when that process is gone
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_ORPHANED = 3  # the parent died; nobody reads this status


def _pack_module(name: str):
    """Import `<pack>.<name>` from this file's pack without running the pack's root __init__ (it probes
    ComfyUI, which a worker must never import) and without touching sys.path."""
    if PRIVATE_PACKAGE not in sys.modules:
        root = Path(__file__).resolve().parents[1]
        spec = importlib.util.spec_from_file_location(
            PRIVATE_PACKAGE, root / "__init__.py", submodule_search_locations=[str(root)]
        )
        sys.modules[PRIVATE_PACKAGE] = importlib.util.module_from_spec(spec)  # deliberately not executed
    return importlib.import_module(f"{PRIVATE_PACKAGE}.{name}")


def choose_device(requested: str, needed_bytes: int, cuda_free_bytes: Optional[int]) -> str:
    """'auto' -> 'cuda' when the weights plus a margin fit in free VRAM, else 'cpu'; explicit choices win."""
    if requested == "cpu" or requested.startswith("cuda"):
        if requested.startswith("cuda") and cuda_free_bytes is None:
            raise RuntimeError(f"device={requested} was requested but CUDA is not available in the worker")
        return requested
    if requested != "auto":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {requested!r}")
    return "cuda" if cuda_free_bytes is not None and cuda_free_bytes >= needed_bytes + CUDA_MARGIN_BYTES else "cpu"


def peak_rss_bytes() -> Optional[int]:
    """This process's peak resident set (VmHWM), or None where /proc is unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def report(stage: str, done: int, total: int, **extra) -> None:
    """One progress line for the parent (see child_process.StageReader)."""
    print(json.dumps({"stage": stage, "done": int(done), "total": int(total), **extra}), flush=True)


def throttled(stage: str, steps: int = 50, **extra):
    """A (done, total) callback that reports at most `steps` times (plus the end)."""
    last = [-1]

    def update(done: int, total: int) -> None:
        step = steps * done // total if total else steps
        if step != last[0]:
            last[0] = step
            report(stage, done, total, **extra)

    return update


def run_job(job: dict) -> dict:
    delay = float(os.environ.get(TEST_DELAY_ENV, "0") or 0)
    if delay > 0:
        time.sleep(delay)
    t_start = time.perf_counter()
    stages = {}  # seconds of each start-up stage: where a slow start goes

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        stages[name] = round(now - since, 4)
        return now

    import torch
    from safetensors.torch import save_file

    t5_files = _pack_module("loaders.t5_files")
    t5_tokenizer = _pack_module("loaders.t5_tokenizer")
    t = lap("import_s", t_start)

    source = t5_tokenizer.TokenizerSource(job["tokenizer"]["kind"], Path(job["tokenizer"]["path"]))
    tokenizer = t5_tokenizer.UMT5Tokenizer.from_source(source)
    max_length = int(job.get("max_length", t5_tokenizer.MAX_LENGTH))
    tokens = [tokenizer(text, max_length) for text in job["prompts"]]
    t = lap("tokenize_s", t)

    info = t5_files.inspect_t5_file(job["encoder"])
    dtype = getattr(torch, job.get("dtype", "bfloat16"))
    t = lap("inspect_s", t)
    requested = job.get("device", "auto")
    # a CPU job never starts CUDA (its context costs seconds and VRAM)
    free = torch.cuda.mem_get_info()[0] if requested != "cpu" and torch.cuda.is_available() else None
    lap("cuda_init_s", t)
    needed = info.device_bytes(dtype)
    device = choose_device(requested, needed, free)

    t0 = time.perf_counter()
    report("load", 0, 1, device=device)
    model = t5_files.load_umt5(info, device=device, dtype=dtype, progress=throttled("load", device=device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    embeddings = []
    report("encode", 0, len(tokens))
    with torch.inference_mode():
        for ids, mask in tokens:
            embeddings.append(model.encode(ids, mask)[0].to("cpu"))
            report("encode", len(embeddings), len(tokens))
    encode_s = time.perf_counter() - t0

    save_file({f"prompt_{i}": e.contiguous() for i, e in enumerate(embeddings)}, job["out"])
    status = {
        "ok": True,
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "format": info.describe(),
        "config": {"dim": info.config.dim, "num_layers": info.config.num_layers},
        "lengths": [int(e.shape[0]) for e in embeddings],
        "device_bytes_needed": needed,
        "cuda_free_bytes": free,
        "load_s": round(load_s, 4),
        "encode_s": round(encode_s, 4),
        "total_s": round(time.perf_counter() - t_start, 4),
        "startup": stages,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    if device.startswith("cuda"):
        status["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        status["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return status


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the parent (ComfyUI or the CLI), even when it is SIGKILLed or OOM-killed.

    Linux: the kernel sends SIGKILL when the parent goes (PR_SET_PDEATHSIG); a parent that died before
    that call is caught by comparing getppid(). Everywhere: the parent holds our stdin pipe open and never
    writes to it, so end-of-file means it is gone; a watchdog thread then exits at once (os._exit works
    even while the main thread is inside a long torch call).
    Ctrl-C in a terminal reaches the whole process group: the parent decides, so SIGINT is ignored here.
    """
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still covers it
        if os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)

    def watchdog() -> None:
        # the raw fd, not sys.stdin: a daemon thread blocked in a buffered reader holds its lock, which
        # aborts the interpreter's shutdown
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: worker.py <job.json>", file=sys.stderr)
        return 64
    parent = os.environ.get(PARENT_PID_ENV)
    if parent:
        _die_with_parent(int(parent))
    try:
        job_path = Path(argv[0])
        job = json.loads(job_path.read_text(encoding="utf-8"))
        job_path.unlink()  # the prompt stays on disk no longer than needed, whatever happens next
        status = run_job(job)
    except Exception as e:  # report, never hang: the parent reads the status line and stderr
        traceback.print_exc()
        status = {"ok": False, "error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__}
    print(json.dumps(status), flush=True)
    return 0 if status["ok"] else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

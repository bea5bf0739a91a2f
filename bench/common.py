"""Shared helpers for the benchmarks: child processes returning JSON, machine info, tables, nvidia-smi polling,
and the plumbing of the case-based drivers (bench_fast, bench_parallel, bench_pipeline, bench_speed): their common
arguments, the case loop under a wall-clock budget, one case's child process and its JSON result (memory readings
live in memory/memstats.py)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from ..memory.memstats import (  # noqa: F401  (re-exported for the benchmarks)
    PeakRSS,
    peak_rss_bytes,
    peak_vram_bytes,
    proc_status_bytes,
    reset_peak_rss,
    reset_peak_vram,
    rss_bytes,
    vram_bytes,
)

def run_json_child(args: Sequence[str], timeout: float = 600, env: Optional[dict] = None) -> dict:
    """Run `python <args>` in a fresh process and parse the last line of its stdout as JSON."""
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"child {' '.join(args)} printed nothing; stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


@contextlib.contextmanager
def tiny_children(tiny: bool):
    """With --tiny, the processes the run starts (its cases, the random-model writers) use one CPU thread each.
    The caller's environment is restored afterwards: a test calling a benchmark's main() in-process starts other
    processes later, and one inheriting OMP_NUM_THREADS=1 computes with other GEMM blocking than a 2-thread
    process (last-bit differences: a player server so started no longer equalled the batch run bit for bit)."""
    if not tiny or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


def machine_info() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_bytes=p.total_memory, cuda=torch.version.cuda)
    return info


def earlier_results(out, fresh: bool, bench: str) -> dict:
    """The results JSON at `out` that this call adds its cases to (earlier calls' cases kept), or a new one when
    `fresh`, missing or unreadable."""
    res: dict = {"bench": bench, "cases": {}}
    if out is not None and Path(out).is_file() and not fresh:
        try:
            res = json.loads(Path(out).read_text())
            res.setdefault("cases", {})
        except json.JSONDecodeError:
            pass
    return res


def write_json(path, obj) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=2, default=str))


def gb(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    """A plain fixed-width text table."""
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*cells[0]), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*r) for r in cells[1:]]
    return "\n".join(lines)


def in_gb(n: Optional[float]) -> Optional[float]:
    """Bytes as GB (1e9) to two places; None stays None."""
    return None if n is None else round(n / 1e9, 2)


def mib_in_gb(n: Optional[float]) -> Optional[float]:
    """MiB (nvidia-smi's unit) as GB (1e9) to two places; None stays None."""
    return None if n is None else round(n * 1024**2 / 1e9, 2)


def case_ok(r: Optional[dict]) -> bool:
    """A case that ran: recorded and without an error."""
    return r is not None and "error" not in r


# ---- nvidia-smi -------------------------------------------------------------------------------------------------
class SmiPoller:
    """Polls `nvidia-smi --query-gpu=index,memory.used` (MiB, every process on the card) in a thread while a child
    runs: the peak per GPU. Nothing is polled where nvidia-smi is missing."""

    def __init__(self, interval: float = 0.25):
        self.exe = shutil.which("nvidia-smi")
        self.interval = interval
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def read(self) -> dict[int, int]:
        """MiB used on each GPU now ({} where nvidia-smi cannot say)."""
        if not self.exe:
            return {}
        try:
            r = subprocess.run([self.exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=5)
            return {int(i): int(used) for i, used in (line.split(",") for line in r.stdout.strip().splitlines())}
        except (OSError, ValueError, subprocess.SubprocessError):
            return {}

    @property
    def peak_mib(self) -> Optional[int]:
        """The peak of GPU 0, the one the single-GPU benchmarks run on."""
        return self.peaks.get(0)

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, used in self.read().items():
                self.peaks[i] = max(self.peaks.get(i, 0), used)
            self._stop.wait(self.interval)

    def __enter__(self) -> "SmiPoller":
        if self.exe:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


# ---- the case-based drivers: arguments ---------------------------------------------------------------------------
def add_case_arguments(p: argparse.ArgumentParser, cases: Iterable[str], default_cases: Iterable[str], *,
                       tiny_help: str, budget_s: float, min_case_s: float, workdir: str, workdir_help: str,
                       keep_help: str, cases_note: str = "", time_box: Optional[tuple[str, float, str]] = None) -> None:
    """The arguments every case-based driver takes, with its own defaults and help texts: --tiny, --device, --out,
    --fresh, --cases, --budget-s, the driver's time-box flag when it has one (`time_box`: flag, default, help),
    --min-case-s, --workdir, --keep and the hidden --child (a case's child process: its spec file)."""
    names = ",".join(cases)
    p.add_argument("--tiny", action="store_true", help=tiny_help)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--out", default=None, help="results JSON (rewritten after every case; earlier cases kept)")
    p.add_argument("--fresh", action="store_true", help="ignore results already in --out")
    p.add_argument("--cases", default=",".join(default_cases), help=f"comma-separated subset of {names}{cases_note}")
    p.add_argument("--budget-s", type=float, default=budget_s, help="wall-clock budget; later cases are skipped")
    if time_box is not None:
        flag, default, help_text = time_box
        p.add_argument(flag, type=float, default=default, help=help_text)
    p.add_argument("--min-case-s", type=float, default=min_case_s, help="do not start a case with less budget left")
    p.add_argument("--workdir", default=workdir, help=workdir_help)
    p.add_argument("--keep", action="store_true", help=keep_help)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)


def parse_cases(p: argparse.ArgumentParser, text: str, cases: Iterable[str]) -> list[str]:
    """--cases as a list; an unknown name ends the call with one usage line that lists the valid ones."""
    known = list(cases)
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in chosen if c not in known]
    if bad:
        p.error(f"unknown case(s) {bad}; choose from {', '.join(known)}")
    return chosen


# ---- the case-based drivers: the parent's loop -------------------------------------------------------------------
class CaseLoop:
    """One call of a case-based driver: its results (an earlier call's cases in --out kept unless --fresh), the
    wall-clock budget (--budget-s from construction on), the JSON rewritten after every case, and the loop that runs
    each case in a child of its own: a case is skipped when less than --min-case-s of the budget is left, an error
    is recorded and the next case runs."""

    def __init__(self, args, bench: str, device: str, finish: Callable[[dict], None], notes: list, **fields):
        """`finish(res)` adds the driver's summary and targets before each save; `fields` (config, gpus, ...) are
        recorded between the machine and the arguments."""
        self.args = args
        self.t_start = time.perf_counter()
        self.out = Path(args.out) if args.out else None
        self.finish = finish
        self.res = earlier_results(self.out, args.fresh, bench)
        self.res.update(machine=machine_info(), device=device, tiny=args.tiny, **fields,
                        args={k: v for k, v in vars(args).items() if k != "child"}, notes=notes)

    def remaining(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t_start)

    def save(self) -> None:
        self.finish(self.res)
        self.res["elapsed_seconds"] = round(time.perf_counter() - self.t_start, 1)
        if self.out is not None:
            write_json(self.out, self.res)

    def run(self, run_case: Callable[[str, float], dict], workdir: Path, written: Iterable[Path] = (),
            time_box: Optional[float] = None) -> dict:
        """`run_case(name, seconds)` runs one case within `seconds` (the budget left, at most `time_box`) and returns
        its result. At the end, whatever happened: the spec files go, and the folders in `written` (the experts)
        unless --keep. Returns the results."""
        args, cases = self.args, self.res["cases"]
        try:
            for name in args.cases:
                left = self.remaining()
                if left < args.min_case_s:
                    cases[name] = {"error": f"skipped: {left:.0f} s of the budget left"}
                    print(f"[{name}] skipped (budget)", flush=True)
                    self.save()
                    continue
                box = left if time_box is None else min(left, time_box)
                print(f"[{name}] running ({left:.0f} s of budget left"
                      + ("" if time_box is None else f", time box {box:.0f} s") + ") ...", flush=True)
                try:
                    r = run_case(name, box)
                except Exception as e:  # the parent never dies on one case
                    r = {"error": f"{type(e).__name__}: {e}"}
                cases[name] = r
                done = f"ok in {r.get('child_seconds')} s" + (
                    f", {r['s_per_step']} s/step" if r.get("s_per_step") is not None else "")
                print(f"[{name}] {(r.get('error') or done)[:300]}", flush=True)
                self.save()
        finally:
            self.res["parent_peak_rss"] = peak_rss_bytes()
            self.save()
            if not args.keep:
                for p in written:
                    shutil.rmtree(p, ignore_errors=True)
            for spec_file in Path(workdir).glob("spec_*.json"):
                spec_file.unlink(missing_ok=True)
        return self.res


# ---- the case-based drivers: one case's child process -----------------------------------------------------------
def run_case_child(spec: dict, workdir: Path, timeout: float, module: str, *, launcher: Sequence[str] = (),
                   env: Optional[dict] = None, smi_per_gpu: bool = False) -> dict:
    """Run one case as `python [launcher...] -m <module> --child <spec file>` (launcher: torchrun for several GPUs)
    in a process group of its own while polling nvidia-smi, and return the JSON line it prints last, with its
    seconds and nvidia-smi's peak (GPU 0 and its reading before the start, or every GPU with `smi_per_gpu`). `env`
    adds variables the environment does not set already. A case that overruns `timeout` is killed with every process
    it started (ranks, compile workers) and recorded as an error; when the parent is interrupted, the case goes too."""
    path = Path(workdir) / f"spec_{spec['case']}.json"
    path.write_text(json.dumps(spec))
    child_env = dict(os.environ)
    for k, v in (env or {}).items():
        child_env.setdefault(k, v)
    if spec["device"] == "cuda" and spec.get("expandable_segments", True):
        child_env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    cmd = [sys.executable, *launcher, "-m", module, "--child", str(path)]
    t0 = time.perf_counter()
    with SmiPoller() as smi:
        baseline = smi.read().get(0)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            stdout, stderr = proc.communicate()
            return {"error": f"timeout after {timeout:.0f} s (time box)", "stderr_tail": stderr[-2000:],
                    "child_seconds": round(time.perf_counter() - t0, 1)}
        except BaseException:  # Ctrl-C in the parent: the case's own session would not see it, so end it here
            _kill_group(proc)
            raise
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    res = json.loads(lines[-1]) if lines else {"error": f"child exited {proc.returncode} without a result",
                                               "stderr_tail": stderr[-3000:]}
    res["child_seconds"] = round(time.perf_counter() - t0, 1)
    if smi_per_gpu and smi.peaks:
        res["smi_peak_used_mib"] = {str(k): v for k, v in sorted(smi.peaks.items())}
    elif not smi_per_gpu and smi.peak_mib is not None:
        res["smi_peak_used_mib"] = smi.peak_mib
        res["smi_baseline_mib"] = baseline
    if proc.returncode != 0 and "error" not in res:
        res["error"] = f"child exited {proc.returncode}: {stderr[-800:]}"
    return res


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, SIGKILL when it is still there 15 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def child_main(spec_path: str, children: dict, rank: Optional[int] = None) -> int:
    """In a case's child process: run `children[spec["kind"]](spec)` and print its result, or its error, as one JSON
    line for the parent (the next case runs either way). With `rank` (one process of a multi-GPU case) an error names
    the rank and only rank 0 prints a result."""
    spec = json.loads(Path(spec_path).read_text())
    who = "" if rank is None else f"rank {rank}: "
    try:
        out = children[spec["kind"]](spec)
    except torch.OutOfMemoryError as e:
        first_line = str(e).partition("\n")[0]
        out = {"error": f"{who}OOM: {first_line[:300]}"}
    except Exception as e:  # recorded by the parent; the next case still runs
        out = {"error": f"{who}{type(e).__name__}: {str(e)[:500]}", "traceback": traceback.format_exc()[-3000:]}
    if spec["device"] == "cuda" and "error" in out:
        try:
            out["vram_at_error"] = vram(torch.device("cuda"))
        except Exception:  # noqa: BLE001 - a broken CUDA context: the error itself still goes to the parent
            pass
    if not rank or "error" in out:
        out["peak_rss"] = peak_rss_bytes()
        print(json.dumps(out, default=str), flush=True)
    return 0


def cuda_ms(fn, iters: int = 10) -> float:
    """Mean GPU milliseconds of fn() over `iters` calls after one warm call (CUDA events, no host timing)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def vram(device: torch.device) -> dict:
    """The caching allocator's readings on `device` ({} off CUDA)."""
    if device.type != "cuda":
        return {}
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
    }

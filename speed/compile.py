"""torch.compile for the DiT's per-token phases (`compile="blocks"`): availability, the persistent inductor cache,
and a wrapper that times compilations and falls back to eager when asked to.

What is compiled are the phase functions of `wan/dit/token_ops.py` (and the FP8/INT8 activation quantizers):
small pure functions of tensors (and norm modules, whose weights dynamo treats as inputs). The NF4 linears,
attention and the block-swap hooks stay eager, so:
- both experts and all 40 blocks share one compiled graph per phase (same code object, weights as inputs; no
  recompile at the expert switch);
- token chunks of different length reuse one graph: the token count is marked dynamic on the first call
  (`_mark_token_dims`), so one graph per phase and dtype serves every chunk length, video size and batch;
- nothing compiled hangs off a model, so moving, unloading or rebuilding a model (ComfyUI) keeps the compiled
  code, and a K/V cache or a sequence-parallel exchange at the attention call is outside the graphs.
The inductor cache (FX graphs and Triton kernels) lives in ~/.cache/lingbot-world/inductor unless
TORCHINDUCTOR_CACHE_DIR or LINGBOT_INDUCTOR_CACHE says otherwise, so a later run loads instead of compiling.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)

CACHE_ENV = "LINGBOT_INDUCTOR_CACHE"
MIN_RECOMPILE_LIMIT = 32  # per phase function: dtype x (static, dynamic) x block-0/bf16 variants, with room
BACKEND = "inductor"  # tests use "aot_eager": the same tracing and functionalization without a C++/Triton build
# Inductor keeps a fused kernel's bf16 intermediates in float32 (the 1 + scale of the camera FiLM, the RMSNorm
# before its gain and RoPE), where eager and the reference round each op's result to bf16. Emulating those casts
# makes the compiled phases round where eager rounds: on the CPU, a 4-block dim-1024 model's compiled forward
# went from 2.7e-3 to 8e-4 relative to eager (the rest is float32 reduction order), at no memory-traffic cost.
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run here (no Triton for the GPU, no C++ compiler for the CPU, unsupported Python)."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lingbot-world" / "inductor"


def configure_cache(path: Optional[os.PathLike] = None) -> Path:
    """Point inductor's cache at a persistent folder (reused across runs); an explicit TORCHINDUCTOR_CACHE_DIR
    set by the user wins over the default but not over `path`."""
    if path is None:
        path = os.environ.get(CACHE_ENV) or os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    try:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = True
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return path


def unavailable_reason(device: torch.device) -> Optional[str]:
    """Why torch.compile cannot serve this device, or None."""
    try:
        import torch._dynamo as dynamo
    except ImportError as e:  # pragma: no cover
        return f"torch.compile is not available in this torch build ({e})"
    if hasattr(dynamo, "is_dynamo_supported") and not dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version with this torch build"
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton

            if not has_triton():
                return ("torch.compile needs Triton for CUDA GPUs and it is not installed (pip install triton; "
                        "on Windows: pip install triton-windows)")
        except ImportError:
            return "torch.compile needs Triton for CUDA GPUs and torch cannot find it"
        return None
    if device.type == "cpu":
        if not any(shutil.which(c) for c in ("c++", "g++", "clang++", "cl")):
            return "torch.compile on the CPU needs a C++ compiler (g++ or clang++) and none was found"
        return None
    return f"torch.compile is not set up for {device.type} devices here"


class CompileStats:
    """Calls that compiled (first use, or a new shape) and their wall time: the warm-up cost."""

    def __init__(self):
        self.compiling_calls = 0
        self.seconds = 0.0
        self.fallbacks: list[str] = []
        self.announced = False

    def to_json(self) -> dict:
        return {"compiling_calls": self.compiling_calls, "seconds": round(self.seconds, 2),
                "fallbacks": list(self.fallbacks), "graphs": _graph_count()}

    def summary(self) -> str:
        text = f"torch.compile warm-up: {self.compiling_calls} compilations, {self.seconds:.1f} s"
        return text + (f"; ran eagerly after a compile error: {', '.join(self.fallbacks)}" if self.fallbacks else "")


STATS = CompileStats()


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompiledFn:
    """torch.compile(fn) with warm-up accounting; on a compile error it raises (strict) or logs one line and
    runs `fn` eagerly from then on (the exact same maths)."""

    def __init__(self, fn: Callable, strict: bool, backend: str = "inductor"):
        self.fn = fn
        self.name = getattr(fn, "__name__", "fn")
        self.strict = strict
        self.backend = backend
        self.compiled = torch.compile(fn, fullgraph=True, backend=backend, options=inductor_options(backend))
        self.failed = False
        self.__name__ = self.name
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        if self.failed:
            return self.fn(*args, **kwargs)
        if not STATS.announced:
            STATS.announced = True
            log.info("torch.compile: building the DiT's per-token kernels on first use (a minute or two the first "
                     "time; later runs load them from %s)", os.environ.get("TORCHINDUCTOR_CACHE_DIR", "the cache"))
        _mark_token_dims(args)
        before = _graph_count()
        t0 = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise  # memory, not the compiler: the caller's OOM handling applies
        except Exception as e:  # noqa: BLE001 - any compiler failure: eager is the same maths
            if self.strict:
                first = str(e).partition("\n")[0][:300]
                raise CompileUnavailable(f"torch.compile failed on the DiT phase {self.name!r}: "
                                         f"{type(e).__name__}: {first}") from e
            self.failed = True
            STATS.fallbacks.append(self.name)
            log.warning("torch.compile failed on the DiT phase %r (%s: %s); running it eagerly from now on",
                        self.name, type(e).__name__, str(e).partition("\n")[0][:200])
            return self.fn(*args, **kwargs)
        if _graph_count() != before:
            STATS.compiling_calls += 1
            STATS.seconds += time.perf_counter() - t0
            log.debug("torch.compile: DiT phase %r compiled in %.1f s", self.name, time.perf_counter() - t0)
        return out


def inductor_options(backend: str) -> Optional[dict]:
    """The inductor config patches of the compiled phases (only those this torch knows), or None for other
    backends (they take no options)."""
    if backend != "inductor":
        return None
    try:
        import torch._inductor.config as inductor_config
    except ImportError:  # pragma: no cover
        return None
    return {k: v for k, v in INDUCTOR_OPTIONS.items() if hasattr(inductor_config, k)} or None


def _mark_token_dims(args) -> None:
    """Make the token count symbolic from the first call on. Left to automatic dynamic shapes, the first chunk
    (storage offset 0) is served by a static graph and the dynamic graph guards on a non-zero offset, so a new
    chunk length recompiled every phase. The token count is dim 1 of a phase's first tensor (x [B, n, ...]);
    every dim of that size in the call's tensors follows it (rope tables, q/k buffers)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].dim() < 2 or tensors[0].shape[1] < 2:
        return
    n = tensors[0].shape[1]
    for t in tensors:
        for d, size in enumerate(t.shape):
            if size == n:
                torch._dynamo.maybe_mark_dynamic(t, d)


_WRAPPED: dict = {}


def compiled(fn: Callable, strict: bool = False) -> Callable:
    """One CompiledFn per function (and strictness) for the whole process: every model shares it."""
    key = (fn, strict, BACKEND)
    if key not in _WRAPPED:
        import torch._dynamo

        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name) and getattr(cfg, name) < MIN_RECOMPILE_LIMIT:
                setattr(cfg, name, MIN_RECOMPILE_LIMIT)
        _WRAPPED[key] = CompiledFn(fn, strict, BACKEND)
    return _WRAPPED[key]

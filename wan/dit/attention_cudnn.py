"""cuDNN attention graphs through cudnn-frontend (the `nvidia-cudnn-frontend` package, imported lazily; it uses
the cuDNN that torch ships): one graph per shape and device, and the fastest of cuDNN's plans for it, chosen by
timing each once on the first call's real inputs.

Two graphs use this: bf16 attention (`attention=cudnn`, exact: the maths of torch SDPA's cuDNN kernel, which runs
cuDNN's first heuristic plan rather than the fastest) and FP8 attention (attention_fp8.py). Set
LINGBOT_CUDNN_TUNE=0 to run the heuristic's first plan instead (the timing comparison in bench_attention_fp8).
"""
from __future__ import annotations

import importlib.util
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

TUNE_ENV = "LINGBOT_CUDNN_TUNE"


def installed() -> bool:
    return importlib.util.find_spec("cudnn") is not None


def bhsd(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """(dims, strides) of a [B, S, H, D] tensor as cuDNN's [B, H, S, D] view."""
    b, s, h, d = t.shape
    st = t.stride()
    return [b, h, s, d], [st[0], st[2], st[1], st[3]]


@dataclass
class Built:
    """A finalized graph: its named tensors, a workspace for its plans and the plan it runs."""

    graph: object
    tensors: dict
    workspace: torch.Tensor
    plans: int
    plan: Optional[int] = None  # chosen on the first execute; -1: cuDNN's default (the heuristic's first plan)
    plan_ms: dict = field(default_factory=dict)  # plan index -> ms of one run (the tuning), or an error

    def execute(self, pack: dict, handle) -> None:
        """Run the graph on `pack` ({tensor name: torch tensor}); the first call chooses the plan."""
        variant = {self.tensors[name]: t for name, t in pack.items()}
        if self.plan is None:
            self.plan = self._choose(variant, handle)
        if self.plan < 0:
            self.graph.execute(variant, self.workspace, handle=handle)
        else:
            self.graph.execute_plan_at_index(variant, self.workspace, self.plan, handle=handle)

    def _choose(self, variant: dict, handle) -> int:
        """The fastest plan's index; -1 (the default plan) when there is no choice, tuning is off or no plan
        could be timed."""
        if self.plans <= 1 or os.environ.get(TUNE_ENV, "1") == "0":
            return -1
        best, best_ms = -1, math.inf
        for i in range(self.plans):
            try:
                ms = self._time(variant, handle, i)
            except Exception as e:  # noqa: BLE001 - a plan this shape cannot run is skipped
                self.plan_ms[i] = f"{type(e).__name__}: {str(e).partition(chr(10))[0][:120]}"
                continue
            self.plan_ms[i] = round(ms, 3)
            if ms < best_ms:
                best, best_ms = i, ms
        return best

    def _time(self, variant: dict, handle, i: int, runs: int = 2) -> float:
        """ms of one run of plan i (after a warm-up run)."""
        need = self.graph.get_workspace_size_plan_at_index(i)
        if need > self.workspace.numel():
            self.workspace = torch.empty(need, device=self.workspace.device, dtype=torch.uint8)
        self.graph.execute_plan_at_index(variant, self.workspace, i, handle=handle)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(runs):
            self.graph.execute_plan_at_index(variant, self.workspace, i, handle=handle)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / runs


def finalize(cudnn, graph, tensors: dict, device: torch.device) -> Built:
    """Validate and build every plan cuDNN offers for `graph` (heuristics A, then the fallback list)."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    try:
        graph.build_plans(cudnn.build_plan_policy.ALL)
    except Exception:  # noqa: BLE001 - a build that builds one plan only still runs
        graph.build_plans()
    plans = max(1, int(graph.get_execution_plan_count()))
    workspace = torch.empty(max(1, graph.get_workspace_size()), device=device, dtype=torch.uint8)
    return Built(graph, tensors, workspace, plans)


class GraphCache:
    """cuDNN handles (one per device, following torch's current stream) and built graphs by key."""

    def __init__(self):
        self._graphs: dict[tuple, Built] = {}
        self._handles: dict[int, object] = {}
        self._streams: dict[int, int] = {}
        self._lock = threading.Lock()

    def handle(self, device: torch.device) -> tuple[object, int]:
        import cudnn

        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = self._handles.get(index)
        if handle is None:
            with torch.cuda.device(index):
                handle = self._handles[index] = cudnn.create_handle()
        stream = torch.cuda.current_stream(device).cuda_stream
        if self._streams.get(index) != stream:  # follow torch's current stream (side streams, CUDA graphs)
            cudnn.set_stream(handle=handle, stream=stream)
            self._streams[index] = stream
        return handle, index

    def get(self, key: tuple, device: torch.device, build: Callable) -> tuple[Built, object]:
        """(the graph for `key`, built by build(cudnn, handle) on first use; the device's handle)."""
        import cudnn

        handle, index = self.handle(device)
        key = (index,) + key
        with self._lock:
            built = self._graphs.get(key)
            if built is None:
                built = self._graphs[key] = build(cudnn, handle)
        return built, handle

    def forget(self) -> None:
        """Drop the built graphs and their workspaces (their VRAM)."""
        with self._lock:
            self._graphs.clear()

    def plan_report(self) -> dict:
        """Shape key -> (chosen plan, the tuning's ms per plan), for benchmarks."""
        return {str(k): {"plan": b.plan, "plans": b.plans, "ms": b.plan_ms} for k, b in self._graphs.items()}


class CudnnAttention:
    """Exact bf16/fp16 attention through cudnn-frontend on [B, L, H, D] tensors (any strides)."""

    def __init__(self):
        self.graphs = GraphCache()

    def _build(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        def build(cudnn, handle) -> Built:
            dt = cudnn.data_type.BFLOAT16 if q.dtype == torch.bfloat16 else cudnn.data_type.HALF
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
            tensors = {}
            for name, t in (("q", q), ("k", k), ("v", v)):
                dims, strides = bhsd(t)
                tensors[name] = g.tensor(name=name, dim=dims, stride=strides, data_type=dt)
            o, _stats = g.sdpa(q=tensors["q"], k=tensors["k"], v=tensors["v"], is_inference=True,
                               attn_scale=1.0 / math.sqrt(q.shape[-1]), use_causal_mask=False, name="attention")
            dims, strides = bhsd(torch.empty(q.shape, device="meta"))
            o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(dt)
            tensors["o"] = o
            return finalize(cudnn, g, tensors, q.device)

        return build

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, Lq, H, D], k/v [B, Lk, H, D] (bf16 or fp16, CUDA) -> [B, Lq, H, D] in q's dtype."""
        key = ("sdpa", q.dtype, tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), v.stride())
        built, handle = self.graphs.get(key, q.device, self._build(q, k, v))
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        built.execute({"q": q, "k": k, "v": v, "o": out}, handle)
        return out


def probe(device: torch.device, make: Callable, seq: int = 1024, heads: int = 2, limit: float = 0.02
          ) -> Optional[str]:
    """Run make()(q, k, v) on a small random input against float32 SDPA; the problem (one phrase), or None."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, seq, heads, 128, device=device, generator=g, dtype=torch.bfloat16)
                   for _ in range(3))
        out = make()(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.float().transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
        err = ((out.float() - ref).norm() / ref.norm()).item()
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run is the answer
        first = str(e).partition("\n")[0][:200]
        return f"cuDNN attention failed on a test input ({type(e).__name__}: {first})"
    if not err <= limit:
        return f"cuDNN attention differs from SDPA by {err:.3g} (relative) on a test input"
    return None


def unavailable_reason(device: torch.device, min_capability: tuple = (8, 0)) -> Optional[str]:
    """Why cudnn-frontend attention cannot run on `device` (one phrase), or None."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "cuDNN attention needs a CUDA GPU"
    cap = torch.cuda.get_device_capability(device)
    if cap < tuple(min_capability):
        return f"this cuDNN attention needs sm{min_capability[0]}{min_capability[1]}+; this GPU is sm{cap[0]}{cap[1]}"
    if not installed():
        return "cuDNN attention needs the nvidia-cudnn-frontend package (pip install nvidia-cudnn-frontend)"
    return None

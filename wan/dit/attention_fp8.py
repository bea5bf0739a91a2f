"""FP8 self-attention on Hopper and newer: cuDNN's fused FP8 flash attention through cudnn-frontend (the
`nvidia-cudnn-frontend` package, imported lazily; it uses the cuDNN that torch ships).

q, k and v are quantized per tensor to float8 e4m3 (scale 448 / amax, computed on the GPU: no host sync). Inside the
kernel the softmax probabilities are quantized with the fixed scale 448 (they lie in [0, 1]). On Hopper cuDNN writes
the output in FP8 too (bf16 output needs Blackwell); it is scaled by 256 / amax(v): every output row is a convex
combination of v's rows, so |o| <= amax(v) and the scaled output cannot overflow. The output is returned in the
inputs' dtype (bf16, or fp16 in an fp16 model: e4m3 values are exact in both).

Measured on an H100 (1 x 40 heads x 31,668 x 128): 24 ms against 39 ms for bf16 cuDNN SDPA (~870 against 530
TFLOP/s); relative error against float32 attention 6e-2 on random inputs, 1.3e-1 on peaked ones (bf16: 2e-3).
It is an approximate kernel, used only when asked for (`attention=fp8`, or `auto` with `compute=fp8`).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .attention_cudnn import Built, GraphCache, finalize, installed

E4M3_MAX = 448.0
# The output's scale over amax(v): headroom below 448 (FP8's relative precision does not depend on the scale).
OUTPUT_SCALE = 256.0
FP16_MAX = 65504.0
HEAD_DIM = 128  # cuDNN's FP8 attention on Hopper takes head dim 128 only
MIN_CAPABILITY = (9, 0)


def unavailable_reason(device: torch.device) -> Optional[str]:
    """Why FP8 attention cannot run on `device` (one phrase), or None."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "FP8 attention needs a CUDA GPU"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return (f"cuDNN's FP8 attention needs a Hopper or newer GPU (sm90+); this one is sm{cap[0]}{cap[1]}")
    if not installed():
        return "FP8 attention needs the nvidia-cudnn-frontend package (pip install nvidia-cudnn-frontend)"
    version = torch.backends.cudnn.version() or 0
    if version < 90100 or version == 91000:  # FP8 forward attention: cuDNN 9.1+, broken in 9.10.0
        return f"cuDNN {version} has no usable FP8 attention (9.1 or newer, not 9.10.0, is needed)"
    return None


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| in float32, one reduction kernel, no temporary (kept eager: torch's whole-tensor reduction reads at
    near the memory bandwidth, a compiled one did not)."""
    return torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)


def cast(x: torch.Tensor, x_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (float8 e4m3 of x * scale, 1 / scale as a [1, 1, 1, 1] float32 tensor), scale = 448 / amax.

    The product is taken in x's dtype with the scale rounded to it (no float32 copy of a 0.3 GB q in eager mode;
    the compiled version is one kernel), and the descale is that rounded scale's exact inverse. The scale is kept
    within x's dtype (fp16 ends at 65504: an fp16 tensor whose amax is below 448 / 65504 is scaled by 65504)."""
    floor = E4M3_MAX / FP16_MAX if x.dtype == torch.float16 else 1e-30
    scale = (E4M3_MAX / x_amax.clamp_min(floor)).to(x.dtype)
    q8 = (x * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q8, (1.0 / scale.float()).reshape(1, 1, 1, 1)


def quantize(x: torch.Tensor, cast_fn: Callable = cast) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 quantization of x: (x8, descale)."""
    return cast_fn(x, amax(x))


def dequantize(o8: torch.Tensor, scale: torch.Tensor, out: Optional[torch.Tensor] = None,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The kernel's FP8 output (o * scale) back to `dtype`, bf16 or fp16 (FP8 values are exact in both; one
    rounding, of the product), into `out` (a tensor of o8's shape, whose dtype then counts) when given."""
    dtype = dtype if out is None else out.dtype
    inv = (1.0 / scale).to(dtype).reshape(())
    if out is None:
        return o8.to(dtype).mul_(inv)
    return out.copy_(o8).mul_(inv)


def _fp8_graph(b: int, h: int, sq: int, skv: int, d: int, device: torch.device):
    """The builder of cuDNN's FP8 attention graph for [B, S, H, D] tensors of these sizes (contiguous)."""

    def build(cudnn, handle) -> Built:
        dt = cudnn.data_type
        g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          handle=handle)

        def seq(name: str, s: int):
            return g.tensor(name=name, dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=dt.FP8_E4M3)

        def scalar(name: str):
            return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)

        t = {"q": seq("q", sq), "k": seq("k", skv), "v": seq("v", skv)}
        t.update((n, scalar(n)) for n in SCALARS)
        o, _stats, amax_s, amax_o = g.sdpa_fp8(q=t["q"], k=t["k"], v=t["v"], is_inference=True,
                                               attn_scale=1.0 / math.sqrt(d), use_causal_mask=False,
                                               name="attention", **{n: t[n] for n in SCALARS})
        o.set_output(True).set_dim([b, h, sq, d]).set_stride([sq * h * d, d, h * d, 1]).set_data_type(dt.FP8_E4M3)
        for x in (amax_s, amax_o):
            x.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
        t.update(o=o, amax_s=amax_s, amax_o=amax_o)
        return finalize(cudnn, g, t, device)

    return build


SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")


class FP8Attention:
    """cuDNN FP8 attention with one graph per shape and device, built on first use (~0.1 s; 1.6 s the very first)
    with the fastest of cuDNN's plans for it (attention_cudnn.Built)."""

    def __init__(self, cast_fn: Callable = cast, dequantizer: Callable = dequantize):
        self.cast = cast_fn  # the compile option swaps in fused versions (speed/options.apply_speed)
        self.dequantizer = dequantizer
        self.graphs = GraphCache()
        self._constants: dict[tuple, torch.Tensor] = {}

    def graph_for(self, q: torch.Tensor, k: torch.Tensor) -> tuple[Built, object]:
        """(the graph for these shapes, the cuDNN handle)."""
        b, sq, h, d = q.shape
        skv = k.shape[1]
        return self.graphs.get(("sdpa_fp8", b, h, sq, skv, d), q.device, _fp8_graph(b, h, sq, skv, d, q.device))

    def pack(self, q8, k8, v8, o8, dq, dk, dv, scale_o) -> dict:
        """The graph's inputs and outputs by name (the probabilities' fixed scales and scratch amax outputs added)."""
        device = q8.device
        return {"q": q8, "k": k8, "v": v8, "o": o8, "descale_q": dq, "descale_k": dk, "descale_v": dv,
                "descale_s": self._constant(device, 1.0 / E4M3_MAX), "scale_s": self._constant(device, E4M3_MAX),
                "scale_o": scale_o, "amax_s": self._constant(device, 0.0, "amax_s"),
                "amax_o": self._constant(device, 0.0, "amax_o")}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reuse_q: bool = False) -> torch.Tensor:
        """q [B, Lq, H, 128], k/v [B, Lk, H, 128] (bf16 or fp16) on a CUDA device -> attention output [B, Lq, H, 128]
        in q's dtype.

        reuse_q: the caller no longer needs q: the output is written into it, so the output costs no memory next to
        q, k, v and their FP8 copies (the block's peak at full size: -0.32 GB)."""
        graph, handle = self.graph_for(q, k)
        q8, dq = quantize(q, self.cast)
        k8, dk = quantize(k, self.cast)
        v8, dv = quantize(v, self.cast)
        scale_o = OUTPUT_SCALE / (dv * E4M3_MAX)  # 256 / amax(v)
        o8 = torch.empty(q.shape, device=q.device, dtype=torch.float8_e4m3fn)
        graph.execute(self.pack(q8, k8, v8, o8, dq, dk, dv, scale_o), handle)
        del q8, k8, v8
        if reuse_q and q.dtype in (torch.bfloat16, torch.float16) and q.is_contiguous():
            return dequantize(o8, scale_o, out=q)  # eager: a compiled in-place write would stage a copy
        return self.dequantizer(o8, scale_o, dtype=q.dtype if q.dtype == torch.float16 else torch.bfloat16)

    def _constant(self, device: torch.device, value: float, tag: str = "") -> torch.Tensor:
        key = (str(device), value, tag)
        c = self._constants.get(key)
        if c is None:
            c = self._constants[key] = torch.full((1, 1, 1, 1), value, device=device)
        return c

    def forget(self) -> None:
        """Drop the built graphs and their workspaces (their VRAM), e.g. when a run ends."""
        self.graphs.forget()


def probe(device: torch.device) -> Optional[str]:
    """Build and run one small FP8 attention on `device` against SDPA; the problem (one phrase), or None."""
    from .attention_cudnn import probe as probe_kernel

    return unavailable_reason(device) or probe_kernel(device, FP8Attention, limit=0.25)

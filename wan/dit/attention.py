"""Attention backend: torch SDPA with the fastest exact kernel for the GPU, or SageAttention / FlashAttention when
installed and chosen, or cuDNN's FP8 attention for the long self-attention (attention_fp8.py).

The reference never masks on a single GPU (full-length q/k, unmasked text), so plain unmasked attention
computes the same maths (spec §9). `attention(q, k, v)` is the one call every DiT attention goes through.

SDPA kernels are all exact; their speed differs by GPU. Measured on an H100 at 464x832x81 (31,668 tokens, 40
heads of 128): cuDNN 607 TFLOP/s against 377 for the flash kernel (issue 15), so Hopper and newer put cuDNN
first; Ampere/Ada put FlashAttention-2 first. torch still falls through to the next kernel when one cannot take
the inputs. SageAttention quantizes q/k to int8 (approximate, ~2x on Ampere/Ada); its first call on real
inputs is checked against SDPA, and a build that gives wrong results (the PyPI 1.0.6 build has been reported to
give black Wan videos) is refused. `fp8` (Hopper and newer, nvidia-cudnn-frontend) runs the video tokens'
self-attention in FP8 (~1.6x the bf16 kernel, ~6e-2 relative error) and leaves the short text cross-attention on SDPA.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("sdpa", "sage", "flash", "fp8", "cudnn")
CHOICES = ("auto",) + BACKENDS
SDPA_KERNELS = ("cudnn", "flash", "efficient", "math")
# A backend whose first real call differs from SDPA by more than this is refused (bf16 kernels agree to ~1e-2).
SAGE_MAX_REL_ERROR = 0.05
# FP8 attention's error is FP8 rounding of q, k, v, the probabilities and the output: 0.06-0.13 on random inputs.
FP8_MAX_REL_ERROR = 0.25
# FP8 attention quantizes all of q, k and v on each call: for few queries over many keys (a Fast chunk over its
# cache) that costs more than the faster kernel saves. H100, 31,668 keys: 4,524 queries take 5.5 ms in FP8 against
# 4.8 ms in bf16; 31,668 queries 27.6 against 36.1 ms (bench/results/attention_kernels_h100.json). Break-even near
# 1 query per 5.5 keys: FP8 runs where the queries are at least a quarter of the keys. Allowed for a rolled `draft`
# chunk too (H200, 4,680 queries over 23,400 keys, fixed shapes, compiled quantizers), it saved nothing: 0.778
# against 0.774 s per chunk (bench/results/fast_chunk_today_h200.json).
FP8_MIN_QUERY_SHARE = 4
MAX_REL_ERROR = {"sage": SAGE_MAX_REL_ERROR, "flash": 0.02, "fp8": FP8_MAX_REL_ERROR, "cudnn": 0.02}

_backend = "sdpa"
_sdpa_order: Optional[tuple[str, ...]] = None  # None: torch's own order (CPU)
CHECKS: dict[str, float] = {}  # backend -> relative error against SDPA on its first real call in this process
_fp8 = None  # attention_fp8.FP8Attention, made on first use
_cudnn = None  # attention_cudnn.CudnnAttention, made on first use


def available_backends() -> list[str]:
    out = ["sdpa"]
    if importlib.util.find_spec("sageattention") is not None:
        out.append("sage")
    if importlib.util.find_spec("flash_attn_interface") is not None or importlib.util.find_spec("flash_attn") is not None:
        out.append("flash")
    from . import attention_cudnn

    if attention_cudnn.installed():
        out += ["fp8", "cudnn"]
    return out


def sdpa_kernel_order(device: Optional[torch.device] = None) -> Optional[tuple[str, ...]]:
    """SDPA kernels fastest first for this device (all exact); None on a CPU (torch decides)."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 9:  # Hopper, Blackwell: cuDNN's attention is the fastest exact kernel
        return ("cudnn", "flash", "efficient", "math")
    if major == 8:  # Ampere, Ada: FlashAttention-2
        return ("flash", "cudnn", "efficient", "math")
    return ("efficient", "math")  # Turing and older: no flash kernel in torch


def set_backend(name: str, device: Optional[torch.device] = None, sdpa_order: Optional[Sequence[str]] = None) -> str:
    """Select the attention kernel for every DiT call: "auto" (= "sdpa" with the GPU's fastest exact kernel),
    "sdpa", "sage", "flash", "fp8" or "cudnn" (the last two: the video self-attention only). Returns the backend used. sdpa_order overrides the SDPA kernel order (names from
    SDPA_KERNELS; an empty sequence = torch's own order; None = the fastest for `device`)."""
    global _backend, _sdpa_order
    if name not in CHOICES:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {CHOICES}")
    if name == "auto":
        name = "sdpa"
    if name not in available_backends():
        raise ValueError(f"attention backend {name!r} is not installed; available: {available_backends()}")
    order = sdpa_kernel_order(device) if sdpa_order is None else (tuple(sdpa_order) or None)
    bad = [k for k in (order or ()) if k not in SDPA_KERNELS]
    if bad:
        raise ValueError(f"unknown SDPA kernel(s) {bad}; choose from {SDPA_KERNELS}")
    _backend, _sdpa_order = name, order
    return name


def get_backend() -> str:
    return _backend


def get_sdpa_order() -> Optional[tuple[str, ...]]:
    return _sdpa_order


def _sdpa_backends(order: Sequence[str]):
    from torch.nn.attention import SDPBackend

    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}
    return [getattr(SDPBackend, names[k]) for k in order if hasattr(SDPBackend, names[k])]


@functools.cache
def _priority_supported() -> bool:
    from torch.nn.attention import sdpa_kernel

    return "set_priority" in inspect.signature(sdpa_kernel).parameters


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: Optional[Sequence[str]] = None) -> torch.Tensor:
    """Torch SDPA on [B, L, H, D] tensors, with the kernels tried in `order` (None: torch's default)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if order is None or not q.is_cuda:
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
    from torch.nn.attention import sdpa_kernel

    kw = {"set_priority": True} if _priority_supported() else {}
    with sdpa_kernel(_sdpa_backends(order), **kw):
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


def fp8_kernel():
    """The process's FP8 attention (one graph cache shared by every model)."""
    global _fp8
    if _fp8 is None:
        from .attention_fp8 import FP8Attention

        _fp8 = FP8Attention()
    return _fp8


def cudnn_kernel():
    """The process's exact cudnn-frontend attention (its graphs and chosen plans shared by every model)."""
    global _cudnn
    if _cudnn is None:
        from .attention_cudnn import CudnnAttention

        _cudnn = CudnnAttention()
    return _cudnn


def _kernel(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reuse_q: bool = False) -> torch.Tensor:
    """SageAttention, FlashAttention (3 when installed, else 2), cuDNN FP8 or cudnn-frontend bf16 on fp16/bf16
    [B, L, H, D] tensors. reuse_q: q may be overwritten with the output (FP8 attention uses it)."""
    if name == "fp8":
        return fp8_kernel()(q, k, v, reuse_q=reuse_q)
    if name == "cudnn":
        return cudnn_kernel()(q, k, v)
    if name == "sage":
        from sageattention import sageattn

        return sageattn(q, k, v, tensor_layout="NHD", is_causal=False)
    try:
        from flash_attn_interface import flash_attn_func  # FlashAttention-3 (Hopper), like the reference
    except ImportError:
        from flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v)
    return out[0] if isinstance(out, tuple) else out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def check_against_sdpa(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       max_queries: int = 1024, max_heads: int = 4) -> float:
    """Relative error of backend `name` against SDPA on a slice of real inputs (a few heads, the first queries,
    all keys), so a kernel that gives wrong results is caught on the data it would run on."""
    qs, ks, vs = (t[:1, :, :max_heads] for t in (q, k, v))
    qs = qs[:, :max_queries]
    dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    out = _kernel(name, *(t.to(dtype).contiguous() for t in (qs, ks, vs)))
    ref = sdpa(qs.float(), ks.float(), vs.float())  # float32 reference, torch's own kernel choice
    return relative_error(out, ref)


def self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reuse_q: bool = False) -> torch.Tensor:
    """The video tokens' self-attention (the base DiT's, and the Fast model's over its cache): where the
    cudnn-frontend backends (fp8, cudnn) apply. Other backends: the same as attention().
    reuse_q: the caller drops q afterwards, so a kernel may write its output there (saves one q-sized buffer)."""
    if _uses_frontend(q) and (_backend != "fp8" or q.shape[1] * FP8_MIN_QUERY_SHARE >= k.shape[1]):
        return _checked(q, k, v, reuse_q)
    return attention(q, k, v)


def _uses_frontend(q: torch.Tensor) -> bool:
    """fp8 / cudnn on a CUDA tensor of head dim 128 (else SDPA: tiny test configs, the CPU)."""
    return _backend in ("fp8", "cudnn") and q.is_cuda and q.shape[-1] == 128


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked multi-head attention. q [B, Lq, H, D], k/v [B, Lk, H, D] -> [B, Lq, H, D]."""
    if _backend in ("sage", "flash") and q.is_cuda:
        return _checked(q, k, v)
    return sdpa(q, k, v, _sdpa_order)


def _checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reuse_q: bool = False) -> torch.Tensor:
    """The selected non-SDPA backend, checked against SDPA on its first real call (refused if it differs)."""
    global _backend
    if _backend not in CHECKS:
        err = check_against_sdpa(_backend, q, k, v)
        CHECKS[_backend] = err
        limit = MAX_REL_ERROR[_backend]
        if not err <= limit:
            log.warning("attention backend %r differs from SDPA by %.3g (relative) on this model's inputs; "
                        "switching to SDPA for this session%s", _backend, err,
                        " (the PyPI sageattention 1.0.6 build is known to give black Wan videos; install "
                        "SageAttention 2)" if _backend == "sage" else "")
            _backend = "sdpa"
            return sdpa(q, k, v, _sdpa_order)
        log.info("attention backend %r checked against SDPA on real inputs: relative error %.2e", _backend, err)
    # The kernels take only fp16/bf16; like the reference, run other dtypes in bf16 and cast back (spec §9).
    kernel_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    out = _kernel(_backend, *(a.to(kernel_dtype) for a in (q, k, v)), reuse_q=reuse_q and q.dtype == kernel_dtype)
    return out.to(q.dtype)


def probe_sage(device: torch.device, seq: int = 2048, heads: int = 4) -> Optional[str]:
    """Run SageAttention against SDPA on random inputs with the spread of normed q/k; the problem, or None."""
    try:
        import sageattention

        version = getattr(sageattention, "__version__", None)
        if version is None:
            from importlib.metadata import version as dist_version

            version = dist_version("sageattention")
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, seq, heads, 128, device=device, generator=g, dtype=torch.bfloat16) for _ in range(3))
        q, k = q * 2.5, k * 2.5  # peaked attention rows, as after RMSNorm with gains above 1
        err = relative_error(_kernel("sage", q, k, v), sdpa(q.float(), k.float(), v.float()))
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run is the answer
        first = str(e).partition("\n")[0][:200]
        return f"sageattention failed on a test input ({type(e).__name__}: {first})"
    if not err <= SAGE_MAX_REL_ERROR:
        return (f"sageattention {version} differs from SDPA by {err:.3g} (relative) on a test input; the PyPI 1.0.6 "
                "build is known to give black Wan videos, install SageAttention 2")
    return None

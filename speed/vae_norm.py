"""The VAE decoder's norm + SiLU in one kernel (CUDA, Triton imported lazily): a `norm_silu` for its rings.

The decoder's full-resolution tail writes SiLU(RMSNorm(x)) into a conv's ring slot for every frame
(wan/vae/blocks.py norm_silu_into). As torch ops that is five passes over the frame (norm, divide, two scales,
SiLU), each a separate strided kernel; here one program reads a block of pixels with all their channels once and
writes the slot once. The sums run in float32 in another order, so frames differ from the eager ops by float32
rounding, as the rings' tap order already does. Like a cuDNN algorithm, it is a property of the device, not of a
speed preset: every decode on a CUDA GPU with Triton runs it (played, batch, continued, in ComfyUI), so the same
latents give the same frames everywhere on that machine.

    norm_silu = decoder_norm_silu(device)   # None: the eager ops (CPU, no Triton)
    StreamingDecoder(vae, norm_silu=norm_silu)
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..quant.lazy_triton import TritonKernel
from ..wan.vae.blocks import RMSNorm, norm_silu_into

MAX_CHANNELS = 1024  # one program holds a pixel's channels in registers
_EPS = 1e-12  # F.normalize's


def _load():
    from .vae_norm_kernel import norm_silu_kernel

    return norm_silu_kernel


KERNEL = TritonKernel(_load, "VAE's fused norm kernel")


def usable(x: torch.Tensor, out: torch.Tensor) -> bool:
    return (KERNEL.failed is None and x.is_cuda and out.is_cuda and x.dim() == 5 and x.shape[2] == 1
            and out.shape == x.shape and 0 < x.shape[1] <= MAX_CHANNELS and KERNEL.get() is not None)


def fused_norm_silu(norm: RMSNorm, x: torch.Tensor, out: torch.Tensor) -> None:
    """norm_silu_into's result in one kernel where it runs (the eager ops elsewhere)."""
    if not usable(x, out):
        return norm_silu_into(norm, x, out)
    try:
        _launch(norm, x, out)
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build the kernel: the eager ops, for good
        KERNEL.give_up(e)
        norm_silu_into(norm, x, out)


def _launch(norm: RMSNorm, x: torch.Tensor, out: torch.Tensor) -> None:
    triton, kernel = KERNEL.get()
    n, c, _, h, w = x.shape
    block_c = triton.next_power_of_2(c)
    block_p = max(1, 4096 // block_c)
    pixels = n * h * w
    gamma = norm.gamma.reshape(-1)
    xs, os_ = x.stride(), out.stride()
    kernel[(triton.cdiv(pixels, block_p),)](
        x, out, gamma, pixels, h * w, w, c, xs[0], xs[1], xs[3], xs[4], os_[0], os_[1], os_[3], os_[4],
        float(norm.scale), _EPS, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4)


def decoder_norm_silu(device) -> Optional[Callable]:
    """The decoder's norm + SiLU on `device`: fused on a CUDA GPU where Triton imports, None (the eager ops)
    elsewhere."""
    if torch.device(device).type != "cuda" or KERNEL.get() is None:
        return None
    return fused_norm_silu

"""The Triton kernel behind vae_norm.py (this module imports Triton at the top: import it lazily)."""
import triton
import triton.language as tl


@triton.jit
def norm_silu_kernel(x_ptr, out_ptr, g_ptr, pixels, hw, width, channels,
                     xs_n, xs_c, xs_h, xs_w, os_n, os_c, os_h, os_w, scale, eps,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """BLOCK_P pixels per program, all their channels at once: out = silu(x / max(|x|, eps) * scale * gamma)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.arange(0, BLOCK_C)
    n, r = p // hw, p % hw
    h, w = r // width, r % width
    mask = (p < pixels)[:, None] & (c < channels)[None, :]
    x = tl.load(x_ptr + (n * xs_n + h * xs_h + w * xs_w)[:, None] + (c * xs_c)[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    denom = tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)
    gamma = tl.load(g_ptr + c, mask=c < channels, other=0.0).to(tl.float32)
    y = x / denom[:, None] * scale * gamma[None, :]
    y = y * tl.sigmoid(y)
    tl.store(out_ptr + (n * os_n + h * os_h + w * os_w)[:, None] + (c * os_c)[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)

"""The Triton kernel behind token_norm.py (this module imports Triton at the top: import it lazily)."""
import triton
import triton.language as tl


# Integers not specialized: one compiled variant serves every token count and stride, so the one BlockGraphs.build
# compiles at load (a short forward) is the one the captured graphs launch (compiling inside a capture fails).
@triton.jit(do_not_specialize=["tokens", "width", "xs_b", "xs_t", "shift_b", "scale_b"])
def layer_norm_rows_kernel(x_ptr, out_ptr, w_ptr, b_ptr, shift_ptr, scale_ptr, tokens, width,
                           xs_b, xs_t, shift_b, scale_b, eps,
                           AFFINE: tl.constexpr, ROUND_NORM: tl.constexpr, MODULATE: tl.constexpr,
                           BLOCK: tl.constexpr):
    """One token row per program, held in registers: LayerNorm in float32 (two passes over the registers, not
    over memory), optionally its gain and bias, optionally rounded to x's dtype (the reference's `.to(x.dtype)`),
    optionally shift + norm * scale1 of the row's sample, stored once in out's dtype."""
    row = tl.program_id(0)
    b = row // tokens
    t = row % tokens
    c = tl.arange(0, BLOCK)
    mask = c < width
    x = tl.load(x_ptr + b * xs_b + t * xs_t + c, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / width
    y = d * tl.rsqrt(var + eps)
    if AFFINE:
        w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
        y = y * w + bias
    if ROUND_NORM:
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    if MODULATE:
        shift = tl.load(shift_ptr + b * shift_b + c, mask=mask, other=0.0).to(tl.float32)
        scale1 = tl.load(scale_ptr + b * scale_b + c, mask=mask, other=0.0).to(tl.float32)
        y = shift + y * scale1
    tl.store(out_ptr + row * width + c, y.to(out_ptr.dtype.element_ty), mask=mask)

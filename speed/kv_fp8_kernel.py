"""The Triton kernels behind kv_fp8_fused.py (this module imports Triton at the top: import it lazily)."""
import triton
import triton.language as tl


@triton.jit
def _row_exponents(x):
    """Per row of x (float32 [R, D]): e, the smallest integer with max|x| <= 448 * 2^e, clamped to +-120, from
    the bits of the row's max (448 = 1.75 * 2^8: the next exponent when the mantissa is above 1.75)."""
    amax = tl.max(tl.abs(x), axis=1)
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    return tl.minimum(tl.maximum(e, -120), 120)


@triton.jit
def _pow2(e):
    """2^e as float32 for |e| <= 126, from its exponent bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def encode_kernel(x_ptr, out_ptr, codes_ptr, exps_ptr, rows, D,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_OUT: tl.constexpr, WRITE_CODES: tl.constexpr):
    """BLOCK_R rows of D values per program: e4m3 codes of x / 2^e and the exponents (WRITE_CODES), and/or the
    rounded values codes * 2^e in out's dtype (WRITE_OUT)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    rmask = r < rows
    mask = rmask[:, None] & (c < D)[None, :]
    at = r.to(tl.int64)[:, None] * D + c[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    e = _row_exponents(x)
    q = (x * _pow2(-e)[:, None]).to(tl.float8e4nv)
    if WRITE_CODES:
        tl.store(codes_ptr + at, q, mask=mask)
        tl.store(exps_ptr + r, e.to(tl.int8), mask=rmask)
    if WRITE_OUT:
        y = q.to(tl.float32) * _pow2(e)[:, None]
        tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(codes_ptr, exps_ptr, out_ptr, rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """out = codes * 2^exps, BLOCK_R rows of D values per program."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    rmask = r < rows
    mask = rmask[:, None] & (c < D)[None, :]
    at = r.to(tl.int64)[:, None] * D + c[None, :]
    q = tl.load(codes_ptr + at, mask=mask, other=0.0).to(tl.float32)
    e = tl.load(exps_ptr + r, mask=rmask, other=0).to(tl.int32)
    tl.store(out_ptr + at, (q * _pow2(e)[:, None]).to(out_ptr.dtype.element_ty), mask=mask)

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
def _e4m3_bits(v):
    """e4m3 code bits (int32, 0..255) of float32 v with |v| <= 448, rounded to nearest, ties to even: what the
    hardware conversion of Ada / Hopper gives, in integer ops that any GPU Triton supports (an RTX 30xx has no FP8
    conversion). From the 24-bit significand (the implicit 1 included) of |v| = sig * 2^(k-23): a normal code keeps
    its top 4 bits (k >= -6), a subnormal one counts steps of 2^-9, i.e. drops 14 - k bits (capped at 25: then 0).
    The kept bits r (0..16) plus the exponent field shifted in give the code; a carry into the next binade lands
    on the next code by itself."""
    bits = v.to(tl.int32, bitcast=True)
    k = ((bits >> 23) & 0xFF) - 127
    sig = (bits & 0x7FFFFF) | 0x800000
    drop = tl.minimum(20 + tl.maximum(-6 - k, 0), 25)
    half = (1 << (drop - 1)) - 1
    r = (sig + half + ((sig >> drop) & 1)) >> drop
    code = (tl.maximum(k + 6, 0) << 3) + r
    return tl.where(bits < 0, code | 0x80, code)


@triton.jit
def _e4m3_value(code):
    """The float32 value of e4m3 code bits (int32 0..255; 0x7F / 0xFF, NaN, never written), in integer ops."""
    field = (code >> 3) & 15
    man = code & 7
    units = tl.where(field == 0, man, (man + 8) << tl.maximum(field - 1, 0))  # in steps of 2^-9
    v = units.to(tl.float32) * 0.001953125
    # the sign as a bit, not a negation: the compiler may fold -(float(u)) into float(-u), which loses -0
    return (v.to(tl.int32, bitcast=True) | ((code & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def encode_kernel(x_ptr, out_ptr, codes_ptr, exps_ptr, rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  WRITE_OUT: tl.constexpr, WRITE_CODES: tl.constexpr, HW_FP8: tl.constexpr):
    """BLOCK_R rows of D values per program: e4m3 codes of x / 2^e and the exponents (WRITE_CODES), and/or the
    rounded values codes * 2^e in out's dtype (WRITE_OUT). HW_FP8: the codes are float8e4nv, converted by the
    hardware (sm89+); else codes_ptr is uint8 and the bits come from integer ops (the same bits)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    rmask = r < rows
    mask = rmask[:, None] & (c < D)[None, :]
    at = r.to(tl.int64)[:, None] * D + c[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    e = _row_exponents(x)
    scaled = x * _pow2(-e)[:, None]
    if HW_FP8:
        q = scaled.to(tl.float8e4nv)
        value = q.to(tl.float32)
    else:
        q = _e4m3_bits(scaled)
        value = _e4m3_value(q)
        q = q.to(tl.uint8)
    if WRITE_CODES:
        tl.store(codes_ptr + at, q, mask=mask)
        tl.store(exps_ptr + r, e.to(tl.int8), mask=rmask)
    if WRITE_OUT:
        y = value * _pow2(e)[:, None]
        tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(codes_ptr, exps_ptr, out_ptr, rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  HW_FP8: tl.constexpr):
    """out = codes * 2^exps, BLOCK_R rows of D values per program (codes as in encode_kernel)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    rmask = r < rows
    mask = rmask[:, None] & (c < D)[None, :]
    at = r.to(tl.int64)[:, None] * D + c[None, :]
    if HW_FP8:
        q = tl.load(codes_ptr + at, mask=mask, other=0.0).to(tl.float32)
    else:
        q = _e4m3_value(tl.load(codes_ptr + at, mask=mask, other=0).to(tl.int32))
    e = tl.load(exps_ptr + r, mask=rmask, other=0).to(tl.int32)
    tl.store(out_ptr + at, (q * _pow2(e)[:, None]).to(out_ptr.dtype.element_ty), mask=mask)

"""The Triton kernel behind nf4_rows.py (this module imports Triton at the top: import it lazily)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def nf4_rows_kernel(packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, q_ptr, s_ptr,
                    blocks, offset, inv_qmax, tiny,
                    BLOCKS: tl.constexpr, BLOCKSIZE: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
                    NESTED: tl.constexpr, FP16: tl.constexpr, ROUND_INT: tl.constexpr):
    """One weight row (output channel) per program, held as [its quantization blocks, BLOCKSIZE / 2 bytes]: NF4
    codes -> the compute dtype's values, as bitsandbytes dequantizes them, then the row quantizer's amax, scale
    and codes (rowwise_kernel.py). Each byte and block scale is read once, each code written once."""
    row = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = BLOCKSIZE // 2
    b = tl.arange(0, BLOCKS)
    mask_b = b < blocks
    first_block = row * blocks  # the row's first block in the flattened weight (rows are whole blocks)
    packed_ptr += first_block * half  # the row's bases as scalars: the per-element offsets stay 32-bit
    q_ptr += first_block * BLOCKSIZE
    if NESTED:  # double quant: 8-bit block scales, themselves scaled per NESTED_BLOCKSIZE blocks, plus an offset
        scale8 = tl.load(absmax_ptr + first_block + b, mask=mask_b, other=0).to(tl.int32)
        outer = tl.load(nested_absmax_ptr + (first_block + b) // NESTED_BLOCKSIZE, mask=mask_b, other=0.0)
        absmax = libdevice.add_rn(libdevice.mul_rn(tl.load(nested_code_ptr + scale8), outer), offset)
    else:
        absmax = tl.load(absmax_ptr + first_block + b, mask=mask_b, other=0.0)
    absmax = absmax[:, None]
    j = tl.arange(0, half)[None, :]
    mask = mask_b[:, None] & (j < half)
    byte = tl.load(packed_ptr + b[:, None] * half + j, mask=mask, other=0).to(tl.int32)
    w_even = libdevice.mul_rn(tl.load(code_ptr + (byte >> 4)), absmax)  # bnb packs the even element high
    w_odd = libdevice.mul_rn(tl.load(code_ptr + (byte & 15)), absmax)
    if FP16:  # bnb's one rounding to the compute dtype
        w_even, w_odd = w_even.to(tl.float16).to(tl.float32), w_odd.to(tl.float16).to(tl.float32)
    else:
        w_even, w_odd = w_even.to(tl.bfloat16).to(tl.float32), w_odd.to(tl.bfloat16).to(tl.float32)
    w_even, w_odd = tl.where(mask, w_even, 0.0), tl.where(mask, w_odd, 0.0)
    amax = tl.maximum(tl.max(tl.max(tl.abs(w_even), axis=1), axis=0), tl.max(tl.max(tl.abs(w_odd), axis=1), axis=0))
    scale = tl.maximum(amax, tiny) * inv_qmax
    inv = libdevice.div_rn(1.0, scale)
    y = tl.reshape(tl.join(w_even * inv, w_odd * inv), (BLOCKS, BLOCKSIZE))  # even, odd, even, ... per block
    if ROUND_INT:
        y = libdevice.rint(y)
    k = tl.arange(0, BLOCKSIZE)[None, :]
    tl.store(q_ptr + b[:, None] * BLOCKSIZE + k, y.to(q_ptr.dtype.element_ty), mask=mask_b[:, None] & (k < BLOCKSIZE))
    tl.store(s_ptr + row, scale)

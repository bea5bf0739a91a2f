"""The Triton kernel behind rowwise_triton.py (this module imports Triton at the top: import it lazily)."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, cols, x_row_stride, q_row_stride, inv_qmax, tiny,
                         BLOCK: tl.constexpr, ROUND_INT: tl.constexpr):
    """One row per program: amax, scale = max(amax, tiny) / qmax, q = x * (1 / scale) (rounded for int8)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    # As torch's CUDA kernels compute it, so scales and codes match bit for bit: a tensor divided by a Python
    # number is multiplied by the float32 reciprocal of that number; reciprocal() is an IEEE division.
    scale = tl.maximum(amax, tiny) * inv_qmax
    y = x * libdevice.div_rn(1.0, scale)
    if ROUND_INT:
        y = libdevice.rint(y)  # round half to even, as torch.round
    tl.store(q_ptr + row * q_row_stride + offs, y.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)

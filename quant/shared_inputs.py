"""Quantize an activation once for every low-precision linear that reads it.

q, k and v read one normed input, the camera FiLM's scale and shift layers one hidden state. Inside
`quantize_once()`, FP8/INT8 linears (fp8.linear, int8.linear) share the quantized copy of an input instead of
each quantizing it again: on a full-size forward that is three of eleven activation quantizations per block.
The callers guarantee the input is not changed in place inside the block (versions cannot be checked under
inference_mode); the memo keeps each input alive, so its address cannot be reused for another tensor.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

_local = threading.local()


@contextmanager
def quantize_once() -> Iterator[None]:
    if getattr(_local, "memo", None) is not None:  # nested: the outer scope's memo serves
        yield
        return
    _local.memo = {}
    try:
        yield
    finally:
        _local.memo = None


def quantized(quantize: Callable, x: torch.Tensor):
    """quantize(x), or the result of the same call on the same tensor earlier in this `quantize_once()` scope."""
    memo = getattr(_local, "memo", None)
    if memo is None:
        return quantize(x)
    key = (quantize, x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (x, quantize(x))
    return hit[1]

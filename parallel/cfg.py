"""CFG-parallel: the conditional pass on one group of ranks, the unconditional pass on the other, one all-gather of
the two velocities per step; then every rank combines them and steps the scheduler identically.

The guidance formula and its order of operations are the sampler's (`uncond + g * (cond - uncond)` in float32), and
each pass is the same batch-1 forward as the sequential CFG of one process, so the result equals a one-process
run with `cfg_mode="sequential"` (bit for bit on the CPU; tests/test_parallel.py). With a guide scale of 1 there is
no unconditional pass: every rank computes the conditional one (no exchange).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .messages import GroupRef, collective_failure


class CFGParallel:
    """The sampler's `velocity` for a rank of a CFG pair: `cfg_rank` 0 runs the conditional pass, 1 the other."""

    def __init__(self, cfg_rank: int, group=None):
        if cfg_rank not in (0, 1):
            raise ValueError(f"cfg_rank must be 0 (conditional pass) or 1 (unconditional), got {cfg_rank}")
        self.cfg_rank, self.group = cfg_rank, GroupRef(group)
        self.exchanges = 0

    def __call__(self, model: nn.Module, x: torch.Tensor, t: torch.Tensor, ctx_pos: torch.Tensor,
                 ctx_neg: torch.Tensor, y: torch.Tensor, camera: Optional[torch.Tensor], guide: float, batched: bool,
                 cancel: Callable[[], None]) -> torch.Tensor:
        cancel()
        if guide == 1.0:  # no unconditional pass (exact), as in one process
            return model(x, t, ctx_pos, y, camera=camera).float()
        own = model(x, t, ctx_pos if self.cfg_rank == 0 else ctx_neg, y, camera=camera).float().contiguous()
        both = [torch.empty_like(own) for _ in range(2)]
        try:
            dist.all_gather(both, own, group=self.group())
        except RuntimeError as e:
            raise collective_failure("exchanging the guidance passes", e) from e
        self.exchanges += 1
        cond, uncond = both
        return uncond + guide * (cond - uncond)

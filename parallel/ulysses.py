"""Ulysses sequence parallelism: each rank of a group holds 1/N of a forward's tokens, and around self-attention an
all-to-all regroups q, k, v from "my tokens, every head" to "every token, my heads" and the output back.

Everything else in a DiT block works per token (norms, modulation, q/k/v/o projections, RoPE, camera FiLM,
cross-attention to the text, FFN), so it runs unchanged on the rank's tokens: the model's per-token work, its
memory and its attention FLOPs all divide by N. What a rank does (the DeepSpeed-Ulysses scheme the reference uses,
spec §11):
  1. after the patch embedding, the L tokens are zero-padded to a multiple of N and rank r keeps tokens
     [r*L/N, (r+1)*L/N); the camera tokens and the RoPE tables are cut the same way (padding rows: identity);
     the time modulation is one row per sample here (spec §2.7), so it needs no cut;
  2. in every block, q/k/v [B, L/N, H, D] -> all-to-all -> [B, L, H/N, D]; the padding tokens are dropped so the
     keys are exactly the video's (the reference masks them with k_lens; dropping them is the same maths), attention
     (or the Fast model's cache, which then holds only this rank's H/N heads) runs on the rank's heads, the output is
     padded again and all-to-all'ed back to [B, L/N, H, D];
  3. after the head, the per-token outputs [B, L/N, 64] are all-gathered and the padding is dropped.
Attention over a subset of heads is the same computation per head, so the result equals one process's up to the
floating-point order of the GEMMs over fewer rows (measured: see tests/test_parallel.py).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .messages import GroupRef, collective_failure

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class SequenceParallel:
    """The sequence split of one model over a process group (`group` None = the default group).

    Attached with `WanDiT.set_seq_parallel(sp)`; the model calls `scatter` after its embeddings, each block calls
    `attend(fn, q, k, v)` around its self-attention, the model calls `gather` after its head.
    """

    def __init__(self, degree: int, rank: int, group=None, num_heads: Optional[int] = None):
        if degree < 2:
            raise ValueError(f"a sequence split needs at least 2 ranks, got {degree}")
        if not 0 <= rank < degree:
            raise ValueError(f"rank {rank} outside a group of {degree}")
        if num_heads is not None and num_heads % degree:
            raise ValueError(f"{num_heads} attention heads do not split over {degree} ranks")
        self.degree, self.rank, self.group = degree, rank, GroupRef(group)
        self.tokens: Optional[int] = None  # L of the forward in progress (set by scatter)
        self.calls = 0  # all-to-alls done (tests, benchmarks)

    # ---- tokens ---------------------------------------------------------------------------------------------
    def shard(self, tokens: int) -> tuple[int, int]:
        """(first token, tokens per rank) of this rank for a forward of `tokens` tokens (padded to N x per rank)."""
        per = -(-tokens // self.degree)
        return self.rank * per, per

    def _cut(self, t: torch.Tensor, tokens: int, pad_value: float = 0.0) -> torch.Tensor:
        """Rows [start, start + per) of t along dim -2 (tokens), as a fresh tensor, padded past the end."""
        start, per = self.shard(tokens)
        dim = t.dim() - 2
        end = min(start + per, tokens)
        part = t.narrow(dim, start, max(0, end - start)) if end > start else t.narrow(dim, 0, 0)
        if part.shape[dim] == per:
            return part.clone()
        pad = [0, 0] * (t.dim() - dim - 1) + [0, per - part.shape[dim]]
        return F.pad(part, pad, value=pad_value)

    def scatter(self, h: torch.Tensor, cam: Optional[torch.Tensor], rope: tuple[torch.Tensor, torch.Tensor]):
        """This rank's share of the tokens h [B, L, dim], the camera tokens [B, L, dim] and RoPE (cos, sin) [L, d/2]."""
        tokens = h.shape[1]
        self.tokens = tokens
        cos, sin = rope
        return (self._cut(h, tokens), None if cam is None else self._cut(cam, tokens),
                (self._cut(cos, tokens, 1.0), self._cut(sin, tokens, 0.0)))

    def gather(self, out: torch.Tensor) -> torch.Tensor:
        """Every rank's per-token output [B, L/N, C] joined in token order [B, L, C] (on every rank)."""
        if self.tokens is None:
            raise RuntimeError("gather() without scatter(): the forward did not split its tokens")
        out = out.contiguous()
        parts = [torch.empty_like(out) for _ in range(self.degree)]
        self._run("gathering the tokens", lambda: dist.all_gather(parts, out, group=self.group()))
        return torch.cat(parts, dim=1)[:, :self.tokens]

    # ---- attention --------------------------------------------------------------------------------------------
    def attend(self, fn: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """fn(q, k, v) over every token and this rank's heads; q/k/v and the result are [B, L/N, H, D]."""
        if self.tokens is None:
            raise RuntimeError("attend() outside a split forward")
        tokens = self.tokens
        qh, kh, vh = (self.to_heads(t)[:, :tokens] for t in (q, k, v))
        out = fn(qh, kh, vh)
        del qh, kh, vh
        if out.shape[1] != tokens:
            raise RuntimeError(f"attention returned {out.shape[1]} tokens for {tokens}")
        padded = self.shard(tokens)[1] * self.degree
        if padded != tokens:
            out = F.pad(out, (0, 0, 0, 0, 0, padded - tokens))
        return self.to_tokens(out)

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L/N, H, D] (my tokens, every head) -> [B, L_pad, H/N, D] (every token, my heads)."""
        b, n, heads, d = x.shape
        if heads % self.degree:
            raise ValueError(f"{heads} heads do not split over {self.degree} ranks")
        hn = heads // self.degree
        send = x.reshape(b, n, self.degree, hn, d).permute(2, 0, 1, 3, 4).contiguous()  # [N, B, n, H/N, D]
        recv = torch.empty_like(send)  # recv[j]: rank j's tokens, my heads
        self._all_to_all(recv, send)
        return recv.permute(1, 0, 2, 3, 4).reshape(b, self.degree * n, hn, d)

    def to_tokens(self, y: torch.Tensor) -> torch.Tensor:
        """[B, L_pad, H/N, D] (every token, my heads) -> [B, L/N, H, D] (my tokens, every head)."""
        b, padded, hn, d = y.shape
        n = padded // self.degree
        send = y.reshape(b, self.degree, n, hn, d).permute(1, 0, 2, 3, 4).contiguous()  # [N, B, n, H/N, D]
        recv = torch.empty_like(send)  # recv[j]: my tokens, rank j's heads
        self._all_to_all(recv, send)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, n, self.degree * hn, d)

    def _all_to_all(self, recv: torch.Tensor, send: torch.Tensor) -> None:
        self.calls += 1
        self._run("the attention all-to-all", lambda: dist.all_to_all_single(recv, send, group=self.group()))

    def _run(self, what: str, fn) -> None:
        try:
            fn()
        except RuntimeError as e:
            raise collective_failure(what, e) from e

    def __repr__(self) -> str:
        return f"SequenceParallel(rank {self.rank} of {self.degree})"

"""3D rotary position embedding of the Wan DiT (spec §2.5).

Head dim d is split into frame / height / width parts of d - 4*(d//6), 2*(d//6), 2*(d//6) dims, each with
its own frequency table (theta 10000). Pairs are *interleaved*: dims (2j, 2j+1) are the real and imaginary
part of one complex number. Angles are computed in float64 like the reference; the rotation itself runs in
float32 (the result is cast to bf16 for attention anyway).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..uploads import upload


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Real dims per axis (frame, height, width); each is even."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def _axis_freqs(dims: int, theta: float = 10000.0) -> torch.Tensor:
    j = torch.arange(0, dims, 2, dtype=torch.float64)
    return 1.0 / theta ** (j / dims)


def frame_angles(frames: int, head_dim: int, frame_offset: int = 0) -> torch.Tensor:
    """The frame axis' angles [frames, df/2] (float64) of frames frame_offset .. frame_offset + frames - 1."""
    positions = torch.arange(frame_offset, frame_offset + frames, dtype=torch.float64)
    return torch.outer(positions, _axis_freqs(axis_dims(head_dim)[0]))


def space_angles(h: int, w: int, head_dim: int) -> torch.Tensor:
    """The height and width axes' angles [h*w, (dh + dw)/2] (float64) of the tokens of one frame, row-major."""
    _, dh, dw = axis_dims(head_dim)
    ah = torch.outer(torch.arange(h, dtype=torch.float64), _axis_freqs(dh))
    aw = torch.outer(torch.arange(w, dtype=torch.float64), _axis_freqs(dw))
    return torch.cat([ah[:, None, :].expand(h, w, -1), aw[None, :, :].expand(h, w, -1)], dim=-1).reshape(h * w, -1)


def spread(per_frame: torch.Tensor, per_token: torch.Tensor) -> torch.Tensor:
    """[F, a] frame columns beside [h*w, b] height/width columns -> [F*h*w, a + b], tokens in (f, h, w) order."""
    f, n = per_frame.shape[0], per_token.shape[0]
    return torch.cat([per_frame[:, None, :].expand(f, n, -1), per_token[None].expand(f, -1, -1)],
                     dim=-1).reshape(f * n, -1)


def rope_angles(grid: tuple[int, int, int], head_dim: int, device=None, frame_offset: int = 0) -> torch.Tensor:
    """Angles [F*H*W, head_dim/2] (float64) for tokens in (f, h, w) row-major order.

    frame_offset: temporal position of the first frame (the causal model's chunk at latent frame `start_frame`
    uses rows start_frame .. start_frame + F - 1; height/width rows always start at 0, spec Fast §5).
    """
    f, h, w = grid
    return spread(frame_angles(f, head_dim, frame_offset), space_angles(h, w, head_dim)).to(device)


class RopeCache:
    """cos/sin tables per (grid, device, frame offset): tiny ([L, d/2] float32) and reused by every block and step.

    A causal chunk at a new frame offset needs a new table, but only its frame columns change: the height and
    width columns are computed once per size and kept on the device, and a chunk's frame columns (a few numbers)
    are computed on the host and uploaded without a host sync (wan/uploads.py), then spread over the chunk's tokens
    on the device. The values are rope_angles' to the bit (each column's cos/sin of the same float64 angle)."""

    def __init__(self, head_dim: int):
        self.head_dim = head_dim
        self._tables: dict = {}
        self._space: dict = {}

    def get(self, grid: tuple[int, int, int], device, frame_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        key = (tuple(grid), str(device), int(frame_offset))
        if key not in self._tables:
            if len(self._tables) > 4:  # sizes rarely change within a session; keep a few
                self._tables.clear()
            self._tables[key] = self._build(tuple(grid), torch.device(device), int(frame_offset))
        return self._tables[key]

    def _build(self, grid: tuple[int, int, int], device: torch.device,
               frame_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        f, h, w = grid
        frames = frame_angles(f, self.head_dim, frame_offset)
        cos_s, sin_s = self._space_tables(h, w, device)
        return (spread(upload(frames.cos().float(), device), cos_s),
                spread(upload(frames.sin().float(), device), sin_s))

    def _space_tables(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of the height and width columns on the device, once per size."""
        key = (h, w, str(device))
        if key not in self._space:
            if len(self._space) > 4:
                self._space.clear()
            ang = space_angles(h, w, self.head_dim)
            self._space[key] = (ang.cos().float().to(device), ang.sin().float().to(device))
        return self._space[key]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotate x [B, L, heads, d] (interleaved pairs) by per-token angles, in float32.

    Returns float32, or writes the result into `out` (any float dtype, e.g. the bf16 q/k buffer) and returns it.
    Eager: one complex multiply (each element read once, written once); under torch.compile the same maths
    in real arithmetic, which inductor fuses into one kernel (it has no complex code generation).
    """
    b, seq, heads, d = x.shape
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    if torch.compiler.is_compiling():
        re, im = x.float().reshape(b, seq, heads, d // 2, 2).unbind(-1)
        rot = torch.stack((re * c - im * s, re * s + im * c), dim=-1).reshape(b, seq, heads, d)
    else:
        xc = torch.view_as_complex(x.float().reshape(b, seq, heads, d // 2, 2))
        rot = torch.view_as_real(xc * torch.complex(c, s)).reshape(b, seq, heads, d)
    if out is None:
        return rot
    return out.copy_(rot)

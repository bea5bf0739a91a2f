"""The arithmetic of the Fast model's chunks: every GEMM and attention call one chunk makes, as shapes and counts.

bench_floor times each shape alone on the GPU at the best kernel there is for it and sums them: the time a chunk
would take if the GPU did nothing but its GEMMs and attention (no per-token work, no dequantization, no copies,
no launch gaps). tests/test_chunk_work.py checks these lists against the FLOPs a tiny model's chunks really run.

What one model call over a chunk of L tokens attending to K keys does (spec §2.4):
- patch embedding (a 1x2x2 conv: a GEMM of L x dim x in_dim*4), the time embedding and projection (one row), the
  head (L x 64 x dim);
- per block: q, k, v, o of the self-attention and q, o of the cross-attention (L x dim x dim each), the FFN
  (L x ffn x dim, L x dim x ffn), self-attention of L queries over K keys and cross-attention over the text;
- camera: the control tokens (L x dim x control_in, then two L x dim x dim) and, per block, the FiLM's four
  L x dim x dim GEMMs, in every call, or only in a chunk's first call when the FiLM is kept (the camera is the same
  in all of a chunk's calls);
- the text: its embedding and each block's cross-attention k and v, once per video (the cache keeps them).
A chunk of `chunk_frames` latent frames (the model's recipe: v1 Fast 3, v2 4) makes `steps` denoising calls and
then the context pass over the clean chunk (unless it is folded into the last step). Its keys are the cached frames
plus its own, capped by the K/V window (the sink's frames are among them: v2's window of 18 with a sink of 6 attends
to the first 6 frames and the latest 12). Sequence parallelism over
`shards` GPUs (Ulysses) gives each GPU 1/shards of the rows of the blocks' GEMMs, the cross-attention and the
head, and 1/shards of the heads of the self-attention; the embeddings (patch, control tokens, time, text) run
whole on every GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ..wan.dit.model import DiTConfig


@dataclass(frozen=True)
class Gemm:
    m: int  # rows (tokens)
    n: int  # output features
    k: int  # input features
    calls: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.calls

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k


@dataclass(frozen=True)
class Attention:
    queries: int
    keys: int
    heads: int
    head_dim: int
    calls: int = 1

    @property
    def flops(self) -> int:  # q k^T and p v
        return 4 * self.queries * self.keys * self.heads * self.head_dim * self.calls

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.queries, self.keys, self.heads, self.head_dim


Work = list[Union[Gemm, Attention]]


def forward_work(cfg: DiTConfig, tokens: int, keys: int, *, camera: bool = True, film: bool = True,
                 text: bool = False, shards: int = 1) -> Work:
    """One model call over `tokens` tokens attending to `keys` keys. film: this call computes the camera FiLM
    (and the control tokens); text: it computes the text embedding and the cross-attention's text k, v."""
    if tokens % shards or cfg.num_heads % shards:
        raise ValueError(f"{tokens} tokens and {cfg.num_heads} heads must divide into {shards} shards")
    d, f, layers = cfg.dim, cfg.ffn_dim, cfg.num_layers
    rows = tokens // shards
    heads = cfg.num_heads // shards
    patch = cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    work: Work = [Gemm(tokens, d, cfg.in_dim * patch),  # patch embedding (before the tokens are split)
                  Gemm(1, d, cfg.freq_dim), Gemm(1, d, d), Gemm(1, 6 * d, d),  # time embedding, projection
                  Gemm(rows, d, d, 6 * layers),  # self q k v o, cross q o
                  Gemm(rows, f, d, layers), Gemm(rows, d, f, layers),  # FFN
                  Attention(tokens, keys, heads, cfg.head_dim, layers),
                  Attention(rows, cfg.text_len, cfg.num_heads, cfg.head_dim, layers),
                  Gemm(rows, cfg.out_dim * patch, d)]  # head
    if text:
        work += [Gemm(cfg.text_len, d, cfg.text_dim), Gemm(cfg.text_len, d, d), Gemm(cfg.text_len, d, d, 2 * layers)]
    if camera and film:
        work += [Gemm(tokens, d, cfg.camera_in), Gemm(tokens, d, d, 2), Gemm(rows, d, d, 4 * layers)]
    return work


def chunk_keys(index: int, frame_tokens: int, chunk_frames: int = 3, window_frames: Optional[int] = None) -> int:
    """Keys chunk `index` attends to: every frame so far and its own, at most the window's."""
    frames = (index + 1) * chunk_frames
    if window_frames is not None:
        frames = min(frames, window_frames)
    return frames * frame_tokens


def chunk_work(cfg: DiTConfig, frame_tokens: int, index: int, *, chunk_frames: int = 3, steps: int = 4,
               fold_context: bool = False, context_pass: bool = True, window_frames: Optional[int] = None,
               camera: bool = True, film_kept: bool = True, shards: int = 1) -> Work:
    """Every call chunk `index` of a video makes: `steps` denoising calls, then the context pass unless it is
    folded into the last step or not wanted (a run's last chunk); the text once, in the video's first call."""
    tokens = chunk_frames * frame_tokens
    keys = chunk_keys(index, frame_tokens, chunk_frames, window_frames)
    calls = steps + (1 if context_pass and not fold_context else 0)
    work: Work = []
    for call in range(calls):
        work += forward_work(cfg, tokens, keys, camera=camera, film=not film_kept or call == 0,
                             text=index == 0 and call == 0, shards=shards)
    return merge(work)


def video_work(cfg: DiTConfig, frame_tokens: int, latent_frames: int, *, chunk_frames: int = 3,
               last_context: bool = True, **kw) -> list[Work]:
    """chunk_work of each chunk of a video of `latent_frames` latent frames (last_context: the last chunk makes
    its context pass too, as a played chunk does)."""
    if latent_frames % chunk_frames or latent_frames < chunk_frames:
        raise ValueError(f"{latent_frames} latent frames are not a whole number of {chunk_frames}-frame chunks")
    chunks = latent_frames // chunk_frames
    return [chunk_work(cfg, frame_tokens, i, chunk_frames=chunk_frames,
                       context_pass=last_context or i + 1 < chunks, **kw) for i in range(chunks)]


def merge(work: Sequence[Union[Gemm, Attention]]) -> Work:
    """The same calls with equal shapes counted together (first-seen order)."""
    counts: dict = {}
    for w in work:
        key = (type(w), w.shape)
        counts[key] = counts.get(key, 0) + w.calls
    out: Work = []
    for (kind, shape), calls in counts.items():
        out.append(kind(*shape, calls=calls))
    return out


def flops(work: Sequence[Union[Gemm, Attention]], kind: Optional[type] = None) -> int:
    return sum(w.flops for w in work if kind is None or isinstance(w, kind))

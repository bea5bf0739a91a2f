"""bench/chunk_work.py's lists of GEMMs and attention calls against what a tiny Fast model's chunks really run: the
GEMM FLOPs torch's FlopCounterMode counts (linears and the patch conv) and every attention call's shape, chunk by
chunk, for the release's schedule, the draft levers (3 steps, the context pass folded, a window with a sink, the
FiLM kept), a run without its last context pass, and the v2 recipe's chunks of 4 latent frames through its window of
18 with a sink of 6. The full-size numbers are checked against the spec's sizes (v1 Fast / the v2 14B, the v2
1.3B)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from lingbot_world.bench import chunk_work as cw
from lingbot_world.wan.dit.film_cache import FilmCache
from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.dit.model import DiTConfig
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, fast_schedule, make_generator
from lingbot_world.world.models import V1_FAST, V2_1_3B

from tests.conftest import load_sibling


ft = load_sibling("fast_tiny")
GEMM_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.convolution")


def _measured_chunks(run, monkeypatch) -> list[tuple[int, dict]]:
    """Per chunk of the run: (GEMM FLOPs counted, {(queries, keys, heads, head_dim): calls} of its attention)."""
    seen: dict = {}
    real = F.scaled_dot_product_attention

    def recording(q, k, v, *a, **kw):
        shape = (q.shape[2], k.shape[2], q.shape[1], q.shape[3])  # [B, H, L, D]
        seen[shape] = seen.get(shape, 0) + q.shape[0]
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    out = []
    while not run.done:
        seen.clear()
        counter = FlopCounterMode(display=False)
        with counter:
            run.next_chunk()
        counts = counter.get_flop_counts()["Global"]
        out.append((sum(v for op, v in counts.items() if str(op) in GEMM_OPS), dict(seen)))
    return out


def _expected(work) -> tuple[int, dict]:
    return (cw.flops(work, cw.Gemm),
            {w.shape: w.calls for w in work if isinstance(w, cw.Attention)})


def _check(run, expected_chunks, monkeypatch):
    measured = _measured_chunks(run, monkeypatch)
    assert len(measured) == len(expected_chunks)
    for i, (got, work) in enumerate(zip(measured, expected_chunks)):
        assert got == _expected(work), f"chunk {i}"


def test_release_schedule_with_the_camera_computed_in_every_call(monkeypatch):
    model = ft.make_model()
    layout = cache_layout(9, ft.FSL)
    cache = layout.make(ft.TINY.num_layers, ft.TINY.num_heads, ft.TINY.head_dim, dtype=torch.float32)
    run = ft.fast_run(model, cache, frames=9)
    _check(run, cw.video_work(ft.TINY, ft.FSL, 9, film_kept=False), monkeypatch)


def test_draft_levers_window_sink_and_the_film_kept(monkeypatch):
    model = ft.make_model()
    layout = cache_layout(12, ft.FSL, window_frames=6, sink_frames=3)
    cache = layout.make(ft.TINY.num_layers, ft.TINY.num_heads, ft.TINY.head_dim, dtype=torch.float32)
    film = FilmCache(device_blocks=range(ft.TINY.num_layers))
    run = ft.fast_run(model, cache, frames=12, schedule=V1_FAST.recipe.schedule(3), fold_context=True,
                      film=film)
    expected = cw.video_work(ft.TINY, ft.FSL, 12, steps=3, fold_context=True, window_frames=6, film_kept=True)
    assert [max(w.keys for w in c if isinstance(w, cw.Attention)) for c in expected] == [18, 36, 36, 36]
    _check(run, expected, monkeypatch)


def test_a_run_without_its_last_context_pass(monkeypatch):
    model = ft.make_model()
    cache = cache_layout(6, ft.FSL).make(ft.TINY.num_layers, ft.TINY.num_heads, ft.TINY.head_dim,
                                         dtype=torch.float32)
    run = ft.fast_run(model, cache, frames=6, final_context=False, schedule=V1_FAST.recipe.schedule(2))
    expected = cw.video_work(ft.TINY, ft.FSL, 6, steps=2, last_context=False, film_kept=False)
    calls = [sum(w.calls for w in c if isinstance(w, cw.Attention) and w.keys != ft.TINY.text_len) for c in expected]
    assert calls == [3 * ft.TINY.num_layers, 2 * ft.TINY.num_layers]
    _check(run, expected, monkeypatch)


def _v2_run(model, cache, frames: int, **kw) -> FastRun:
    """tests/fast_tiny.py's run with the v2 1.3B's recipe: chunks of 4 latent frames, its schedule."""
    recipe = V2_1_3B.recipe
    g = torch.Generator().manual_seed(50)
    y = torch.randn(1, 20, frames, ft.LH, ft.LW, generator=g)
    cam = torch.randn(1, 384, frames, ft.LH, ft.LW, generator=g)
    ctx = torch.randn(1, ft.TINY.text_len, ft.TINY.text_dim, generator=g)
    gen = make_generator(3, "cpu")
    noise = draw(gen, (1, 16, frames, ft.LH, ft.LW), "cpu")
    kw.setdefault("schedule", recipe.schedule())
    return FastRun(model, noise, ctx, y, cam, cache, gen, device="cpu", chunk_frames=recipe.chunk_frames, **kw)


def test_v2_chunks_of_4_through_the_18_frame_window_with_its_6_frame_sink(monkeypatch):
    # 6 chunks of 4: the 5th is the first past the window (20 > 18); from there every chunk attends to the sink
    # and the latest frames, 18 in all, as the release's local_attn_size 18 / sink_size 6
    model = ft.make_model()
    layout = cache_layout(24, ft.FSL, 4, window_frames=18, sink_frames=6, release=(18, 6))
    assert layout.evict and layout.sink_tokens == 6 * ft.FSL
    cache = layout.make(ft.TINY.num_layers, ft.TINY.num_heads, ft.TINY.head_dim, dtype=torch.float32)
    film = FilmCache(device_blocks=range(ft.TINY.num_layers))
    run = _v2_run(model, cache, 24, film=film)
    expected = cw.video_work(ft.TINY, ft.FSL, 24, chunk_frames=4, window_frames=18, film_kept=True)
    keys = [max(w.keys for w in c if isinstance(w, cw.Attention) and w.keys != ft.TINY.text_len) for c in expected]
    assert [k // ft.FSL for k in keys] == [4, 8, 12, 16, 18, 18]
    _check(run, expected, monkeypatch)


def test_v2_draft_levers_on_chunks_of_4(monkeypatch):
    # the v2 recipe's 2-step variant, the context pass folded, draft's 15-frame window cap over the sink of 6
    model = ft.make_model()
    layout = cache_layout(16, ft.FSL, 4, window_frames=15, sink_frames=6, release=(18, 6))
    cache = layout.make(ft.TINY.num_layers, ft.TINY.num_heads, ft.TINY.head_dim, dtype=torch.float32)
    run = _v2_run(model, cache, 16, schedule=V2_1_3B.recipe.schedule(2), fold_context=True)
    expected = cw.video_work(ft.TINY, ft.FSL, 16, chunk_frames=4, steps=2, fold_context=True, window_frames=15,
                             film_kept=False)
    assert [max(w.keys for w in c if isinstance(w, cw.Attention)) // ft.FSL for c in expected] == [4, 8, 12, 15]
    _check(run, expected, monkeypatch)


def test_full_size_chunk_matches_the_spec_sizes():
    cfg = DiTConfig(causal=True)  # the 14B DiT: 40 blocks of 5120, FFN 13824, 40 heads of 128
    frame_tokens = (480 // 16) * (832 // 16)
    assert frame_tokens == 1560
    video = cw.video_work(cfg, frame_tokens, 21)
    # a mid-video chunk: 4 steps + the context pass, each 40 blocks of 6 + 2 FFN GEMMs over 4,680 rows, the FiLM once
    mid = video[3]
    per_token_block = 2 * (6 * 5120 * 5120 + 2 * 5120 * 13824)
    blocks = 5 * 40 * 4680 * per_token_block + 40 * 4680 * 2 * 4 * 5120 * 5120
    small = cw.flops(mid, cw.Gemm) - blocks
    assert 0 < small < 0.01 * blocks  # embeddings and head
    attn = [w for w in mid if isinstance(w, cw.Attention) and w.keys > 512]
    assert attn == [cw.Attention(4680, 12 * 1560, 40, 128, calls=200)]
    # the mean chunk's attention covers 12 frames of keys (3, 6, ..., 21 over the 7 chunks)
    mean_keys = sum(max(w.keys for w in c if isinstance(w, cw.Attention)) for c in video) / len(video)
    assert mean_keys == 12 * 1560


def test_full_size_v2_1_3b_chunk():
    cfg = V2_1_3B.dit  # 30 blocks of 1536, FFN 8960, 12 heads of 128
    video = cw.video_work(cfg, 1560, 20, chunk_frames=4, window_frames=18)  # 77 frames: 5 chunks of 4
    mid = video[2]  # 4 steps + the context pass over 6,240 rows, the FiLM once
    per_token_block = 2 * (6 * 1536 * 1536 + 2 * 1536 * 8960)
    blocks = 5 * 30 * 6240 * per_token_block + 30 * 6240 * 2 * 4 * 1536 * 1536
    small = cw.flops(mid, cw.Gemm) - blocks
    assert 0 < small < 0.05 * blocks  # embeddings and head
    attn = [w for w in mid if isinstance(w, cw.Attention) and w.keys > 512]
    assert attn == [cw.Attention(6240, 12 * 1560, 12, 128, calls=150)]
    last = [w for w in video[-1] if isinstance(w, cw.Attention) and w.keys > 512]
    assert last == [cw.Attention(6240, 18 * 1560, 12, 128, calls=150)]  # the window's 18 frames


def test_ulysses_shards_split_rows_and_heads():
    cfg = DiTConfig(causal=True)
    one = cw.chunk_work(cfg, 1560, 6)
    two = cw.chunk_work(cfg, 1560, 6, shards=2)
    self_one = [w for w in one if isinstance(w, cw.Attention) and w.keys > 512][0]
    self_two = [w for w in two if isinstance(w, cw.Attention) and w.keys > 512][0]
    assert (self_two.queries, self_two.heads) == (self_one.queries, 20)
    assert self_two.flops * 2 == self_one.flops
    # every per-token GEMM of the blocks halves; the embeddings stay whole on each GPU
    assert 0.5 < cw.flops(two, cw.Gemm) / cw.flops(one, cw.Gemm) < 0.51
    with pytest.raises(ValueError, match="shards"):
        cw.chunk_work(cfg, 1560, 0, shards=3)

"""The causal (Fast) DiT: the base WanDiT with a K/V cache, against the spec's rules written here (float32, tiny).

- cache bookkeeping (append, overwrite at the same start, window eviction after the sink, max_attention) against a
  list model of the spec's rules (Fast §5 steps 3-6);
- RoPE offsets: a chunk at start_frame s uses the temporal rows s.. of the whole video's table;
- one chunk covering the whole video with an empty cache == the base forward;
- chunked with a cache == one pass with a block-causal mask (explicit masked attention written here);
- the timestep embedding per token (the reference) equals the one row per sample the blocks use.
"""
from __future__ import annotations

import math

import pytest
import torch

from lingbot_world.wan.dit import blocks as dit_blocks
from lingbot_world.wan.dit import kv_cache as kv_module
from lingbot_world.wan.dit.kv_cache import KVCache, KVCacheError, shift_left
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, is_causal_config, sinusoidal_embedding
from lingbot_world.wan.dit.rope import rope_angles

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8)
LAT_H, LAT_W = 4, 6  # 2 x 3 = 6 tokens per latent frame
FSL = (LAT_H // 2) * (LAT_W // 2)


@pytest.fixture
def model(randomise_dit):
    m = WanDiT(CFG).eval()
    randomise_dit(m, torch.Generator().manual_seed(7))
    return m


def inputs(frames: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g)
    ctx = torch.randn(1, 5, CFG.text_dim, generator=g)
    return x, y, cam, ctx


# ---- config ------------------------------------------------------------------------------------------------
def test_fast_config_is_told_apart_by_class_name_or_causal_keys():
    base = DiTConfig.tiny().to_json()
    assert base["_class_name"] == "WanModel" and "local_attn_size" not in base
    assert not DiTConfig.from_json(base).causal
    fast = DiTConfig.tiny(causal=True).to_json()
    assert fast["_class_name"] == "WanModelFast" and fast["local_attn_size"] == -1 and fast["sink_size"] == 0
    assert DiTConfig.from_json(fast).causal and DiTConfig.from_json(fast) == DiTConfig.tiny(causal=True)
    # a release config with the class name only, or the causal init arguments only
    assert is_causal_config({**base, "_class_name": "WanModelFast"})
    assert is_causal_config({**base, "local_attn_size": -1})
    assert DiTConfig.from_json({**base, "sink_size": 1, "local_attn_size": 7}).sink_size == 1
    with pytest.raises(ValueError, match="local_attn_size"):
        DiTConfig.from_json({**fast, "local_attn_size": 0})


# ---- the cache's bookkeeping against a list model of the spec --------------------------------------------
class SpecCache:
    """Fast §5 steps 3-6 on a list of token ids (what each slot holds), written from the spec's words."""

    def __init__(self, capacity, sink, evict, max_attention):
        self.capacity, self.sink, self.evict, self.max_attention = capacity, sink, evict, max_attention
        self.slots = [None] * capacity
        self.local_end = self.global_end = 0

    def forward(self, start, length):
        end = start + length
        if self.evict and end > self.global_end and length + self.local_end > self.capacity:
            e = length + self.local_end - self.capacity
            kept = self.slots[self.sink + e:self.local_end]
            self.slots[self.sink:self.sink + len(kept)] = kept
            local_end = self.local_end + end - self.global_end - e
        else:
            local_end = self.local_end + end - self.global_end
        self.slots[local_end - length:local_end] = list(range(start, end))
        lo = 0 if self.max_attention is None else max(0, local_end - self.max_attention)
        attended = self.slots[lo:local_end]
        self.global_end, self.local_end = end, local_end
        return attended


@pytest.mark.parametrize("capacity,sink,evict,max_attention", [
    (12, 0, False, None),  # the release: the whole video, nothing evicted
    (12, 0, False, 5),  # max_attention_size: attend to the latest 5 tokens only
    (7, 2, True, None),  # window with a sink: evictions keep the first 2 tokens
    (6, 0, True, 4),  # window without sink plus max_attention
])
def test_cache_bookkeeping_follows_the_spec(capacity, sink, evict, max_attention, monkeypatch):
    spec = SpecCache(capacity, sink, evict, max_attention)
    # keys carry their video token id, so the attended keys say which tokens the cache holds
    cache = KVCache([torch.full((1, capacity, 1, 1), -1.0)], [torch.zeros(1, capacity, 1, 1)], sink_tokens=sink,
                    evict=evict, max_attention=max_attention)
    seen = []

    def capture(q, k, v):
        seen.append(k[0, :, 0, 0].tolist())
        return q

    monkeypatch.setattr(kv_module, "self_attention", capture)

    calls = [(0, 3), (0, 3), (3, 3), (3, 3), (6, 3), (9, 3), (9, 3)] if capacity >= 12 or evict else [(0, 3)]
    if evict:
        calls += [(12, 3), (15, 2), (17, 3)]
    for start, n in calls:
        cache.begin(start, n)
        ids = torch.arange(start, start + n, dtype=torch.float32).view(1, n, 1, 1)
        cache.attend(0, ids, ids, ids)
        cache.end()
        assert seen[-1] == [float(i) for i in spec.forward(start, n)], (start, n)
        assert (cache.global_end, cache.local_end) == (spec.global_end, spec.local_end)


def test_cache_refuses_chunks_that_do_not_fit():
    cache = KVCache.allocate(1, 6, 1, 2, dtype=torch.float32)
    cache.begin(0, 6)
    cache.end()
    with pytest.raises(KVCacheError, match="does not fit the cache"):
        cache.begin(6, 3)  # no window: the whole video must fit
    win = KVCache.allocate(1, 6, 1, 2, dtype=torch.float32, sink_tokens=4, evict=True)
    win.begin(0, 3)
    win.end()
    with pytest.raises(KVCacheError, match="beside the 4-token sink"):
        win.begin(3, 6)
    with pytest.raises(ValueError, match="sink_tokens"):
        KVCache.allocate(1, 6, 1, 2, sink_tokens=6)


def test_shift_left_equals_a_copy_through_a_clone():
    t = torch.arange(40.0).view(1, 20, 2, 1)
    for dst, by, count in [(0, 3, 10), (2, 1, 15), (4, 7, 9)]:
        want = t.clone()
        want[:, dst:dst + count] = t[:, dst + by:dst + by + count].clone()
        got = t.clone()
        shift_left(got, dst, by, count)
        assert torch.equal(got, want)


# ---- RoPE and time embedding --------------------------------------------------------------------------------
def test_rope_offset_rows_are_the_whole_videos_rows():
    whole = rope_angles((9, 2, 3), CFG.head_dim)
    for start in (0, 3, 6):
        chunk = rope_angles((3, 2, 3), CFG.head_dim, frame_offset=start)
        assert torch.equal(chunk, whole[start * FSL:(start + 3) * FSL])


def test_per_token_timestep_embedding_equals_one_row_per_sample(model):
    # The reference expands t to every token of the chunk; every row is then the same values, so the blocks'
    # one modulation row per sample is exact.
    t = torch.tensor([978])
    e, e0 = model.time_modulation(t)
    per_token = sinusoidal_embedding(CFG.freq_dim, t.expand(7))
    rows_e = model.time_embedding(per_token.float())
    rows_e0 = model.time_projection(rows_e).unflatten(1, (6, CFG.dim))
    torch.testing.assert_close(rows_e, e.expand(7, -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rows_e0, e0.expand(7, -1, -1), rtol=1e-6, atol=1e-6)


# ---- the two consistency facts of spec Fast §5 --------------------------------------------------------------
def new_cache(capacity_frames: int, **kw) -> KVCache:
    return KVCache.allocate(CFG.num_layers, capacity_frames * FSL, CFG.num_heads, CFG.head_dim,
                            dtype=torch.float32, **kw)


def test_one_chunk_over_the_whole_video_equals_the_base_forward(model):
    x, y, cam, ctx = inputs(6)
    t = torch.tensor([947])
    with torch.no_grad():
        base = model(x, t, ctx, y, camera=cam)
        causal = model(x, t, ctx, y, camera=cam, kv_cache=new_cache(6))
        no_cam = model(x, t, ctx, y, kv_cache=new_cache(6))
    torch.testing.assert_close(causal, base, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(no_cam, model(x, t, ctx, y), rtol=1e-5, atol=1e-5)


def masked_attention_factory(total_tokens: int, chunk_tokens: int):
    """Self-attention of the whole video where chunk i sees chunks <= i (explicit softmax); cross-attention plain."""

    def attention(q, k, v, reuse_q=False):  # reuse_q: a kernel may overwrite q (FP8 attention)
        if k.shape[1] != total_tokens:
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        chunk = torch.arange(total_tokens) // chunk_tokens
        allowed = chunk[None, :] <= chunk[:, None]  # [query, key]
        scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.double()).to(q.dtype)

    return attention


def test_chunked_with_cache_equals_one_block_causal_pass(model, monkeypatch):
    frames, chunk = 9, 3
    x, y, cam, ctx = inputs(frames, seed=1)
    t = torch.tensor([825])
    cache = new_cache(frames)
    with torch.no_grad():
        chunks = [model(x[:, :, s:s + chunk], t, ctx, y[:, :, s:s + chunk], camera=cam[:, :, s:s + chunk],
                        kv_cache=cache, start_frame=s) for s in range(0, frames, chunk)]
        monkeypatch.setattr(dit_blocks, "self_attention", masked_attention_factory(frames * FSL, chunk * FSL))
        full = model(x, t, ctx, y, camera=cam)
    torch.testing.assert_close(torch.cat(chunks, dim=2), full, rtol=1e-5, atol=1e-5)
    assert cache.global_end == frames * FSL and cache.text_ready


def test_denoising_calls_overwrite_the_chunks_slots(model):
    x, y, cam, ctx = inputs(6, seed=2)
    cache = new_cache(6)
    with torch.no_grad():
        model(x[:, :, :3], torch.tensor([999]), ctx, y[:, :, :3], camera=cam[:, :, :3], kv_cache=cache,
              cache_final=False)
        k_noisy = cache.k[0][:, :3 * FSL].clone()
        model(x[:, :, :3] * 0.5, torch.tensor([0]), ctx, y[:, :, :3], camera=cam[:, :, :3], kv_cache=cache)
    assert cache.local_end == 3 * FSL and not torch.equal(cache.k[0][:, :3 * FSL], k_noisy)
    assert torch.count_nonzero(cache.k[0][:, 3 * FSL:]) == 0  # nothing written beyond the chunk


def test_forward_checks_and_aborts_cleanly(model):
    x, y, cam, ctx = inputs(3)
    with pytest.raises(ValueError, match="start_frame needs a kv_cache"):
        model(x, torch.tensor([999]), ctx, y, start_frame=3)
    cache = new_cache(3)
    with pytest.raises(KVCacheError):
        model(x, torch.tensor([999]), ctx, y, kv_cache=cache, start_frame=3)  # past the cache's end
    assert cache.plan is None and cache.global_end == 0  # nothing half-planned

"""K/V cache placement: the plan (made-up numbers), and every placement giving the same latents.

On the CPU the host-streamed path runs with a CPU "device" (synchronous copies through the block-swap ring), so
the bookkeeping of streamed layers (past uploaded, chunk written back only on the context pass, eviction shifts
in host memory) is checked against the all-resident cache bit for bit. The CUDA tests run the same on a GPU.
"""
from __future__ import annotations

import gc
import traceback

import pytest
import torch

from lingbot_world.memory.fast_plan import FastMemoryError
from lingbot_world.memory.fast_planner import CACHE_VRAM_SPARE, plan_fast_memory
from lingbot_world.memory.kv_placement import FastPlacement, place_kv_cache
from lingbot_world.memory.kv_stream import KVStreamer
from lingbot_world.memory.estimates import VRAM_HEADROOM
from lingbot_world.memory.pinned import clear_device_caches
from lingbot_world.wan.dit.kv_cache import KVCache, cache_layout
from lingbot_world.wan.dit.model import DiTConfig, WanDiT
from lingbot_world.wan.sampling.sampler import Cancelled

from tests.conftest import load_sibling

GB = 10**9
GiB = 1024**3
FULL = DiTConfig(causal=True)


def layout480(**kw):
    return cache_layout(21, 30 * 52, **kw)  # 480x832 -> 464x832 for 16:9; 480x832 itself: 30 x 52 tokens


# ---- the plan ---------------------------------------------------------------------------------------------------
def test_whole_cache_on_a_big_gpu_is_the_reference_layout():
    p = plan_fast_memory(480, 832, FULL, layout480(), 80 * GiB, 100 * GiB)
    assert p.cache == "gpu" and p.cache_layers_on_gpu == 40 and p.cache_text and p.fits
    assert abs(p.estimates["cache_bytes"] - 26.8e9) < 0.1e9  # spec: 26.8 GB in bf16 at 480x832x81
    assert "K/V cache on the GPU" in p.reason and "<= " in p.reason


@pytest.mark.parametrize("card_gib", [24, 16])
def test_consumer_cards_stream_the_cache_from_host_ram(card_gib):
    vram = int((card_gib - 0.5) * GiB)
    p = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB)
    assert p.cache == "host" and p.blocks_on_gpu is None and p.fits
    est = p.estimates
    on_device = (est["model_bytes"] + (p.cache_layers_on_gpu + 2) * est["cache_layer_bytes"] + est["text_kv_bytes"]
                 + est["activation_bytes"] + est["headroom"]
                 + p.film_blocks * est["film_block_bytes"] + est["film_buffer_bytes"])
    assert on_device == est["device_bytes"]
    assert on_device <= vram - CACHE_VRAM_SPARE  # the planned bytes leave the spare free
    assert on_device + est["cache_layer_bytes"] > vram - CACHE_VRAM_SPARE  # ... and no more layer would fit
    assert p.film_blocks == 40 or on_device + est["film_block_bytes"] > vram - CACHE_VRAM_SPARE  # nor more FiLM
    if card_gib == 24:  # 64 GiB of RAM keeps the others' FiLM; a 16 GB card has no room for the buffers
        assert p.film_blocks + p.film_host_blocks == 40
    else:
        assert p.film_host_blocks == 0
    assert est["host_bytes"] == (40 - p.cache_layers_on_gpu) * est["cache_layer_bytes"]
    assert f"{p.cache_layers_on_gpu}/40 layers on the GPU" in p.reason and "stream from pinned RAM" in p.reason
    if card_gib == 24:
        assert on_device <= 22.5 * GB


def test_cuda_graphs_pool_is_planned_only_where_a_window_rolls():
    from lingbot_world.memory.fast_planner import GRAPH_POOL_FACTOR

    vram = int(23.5 * GiB)
    rolling = layout480(window_frames=15, sink_frames=3)
    without = plan_fast_memory(480, 832, FULL, rolling, vram, 64 * GiB, camera_film=False)
    graphed = plan_fast_memory(480, 832, FULL, rolling, vram, 64 * GiB, graphs=True, camera_film=False)
    pool = graphed.estimates["graph_pool_bytes"]
    assert pool == int(without.estimates["activation_bytes"] * GRAPH_POOL_FACTOR)
    layer = without.estimates["cache_layer_bytes"]  # 0.48 GB: the pool (1.05 GB) takes 2-3 layers' room
    assert without.cache_layers_on_gpu - 3 <= graphed.cache_layers_on_gpu <= without.cache_layers_on_gpu - 2
    assert graphed.estimates["device_bytes"] + pool <= without.estimates["device_bytes"] + layer
    assert "CUDA graphs" in graphed.reason
    whole = layout480()  # the cache holds the whole video: it never rolls, no graph is ever captured
    assert plan_fast_memory(480, 832, FULL, whole, vram, 64 * GiB, graphs=True, camera_film=False).reason == \
        plan_fast_memory(480, 832, FULL, whole, vram, 64 * GiB, camera_film=False).reason


def test_with_cuda_graphs_the_camera_film_is_kept_on_the_device_only():
    """The graphs replay over the FiLM values' device addresses (speed/block_graphs.py), so a graphed plan keeps
    the FiLM of the blocks the card has room for and none in pinned RAM: the v2 1.3B on a 24 GB card keeps every
    block's, the 14B (which keeps some in RAM without graphs) only the device's."""
    from lingbot_world.world.models import model

    small = model("v2-1.3b").dit
    window = cache_layout(40, 30 * 52, 4, window_frames=18, sink_frames=6)
    plan = plan_fast_memory(480, 832, small, window, int(23.5 * GiB), 64 * GiB, graphs=True)
    assert plan.film_blocks == small.num_layers and plan.film_host_blocks == 0, plan.reason
    rolling = layout480(window_frames=15, sink_frames=3)
    eager = plan_fast_memory(480, 832, FULL, rolling, int(23.5 * GiB), 64 * GiB)
    graphed = plan_fast_memory(480, 832, FULL, rolling, int(23.5 * GiB), 64 * GiB, graphs=True)
    assert eager.film_host_blocks > 0 and graphed.film_host_blocks == 0


def test_the_camera_film_takes_only_the_room_the_model_and_cache_layers_leave():
    """The chunk's camera FiLM (2 x tokens x dim per block) saves compute in every call but the first. A cache
    layer given up for it would buy a few blocks' FiLM (about 1 % of a 24 GB card's chunk, measured) and pin that
    layer in RAM instead: the FiLM gets what the model, its blocks and the cache layers leave."""
    vram, decoder = int(23.5 * GiB), int(7.0e9)
    per = 2 * 3 * 30 * 52 * FULL.dim * 2  # 3 latent frames of 30 x 52 tokens, (1 + scale, shift) in bf16
    kept = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, film_host=False)
    computed = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, camera_film=False)
    assert kept.film_host_blocks == computed.film_host_blocks == 0
    assert kept.estimates["film_block_bytes"] == per and computed.film_blocks == 0
    assert kept.film_blocks > 0 and kept.cache_layers_on_gpu == computed.cache_layers_on_gpu
    assert kept.estimates["host_bytes"] == computed.estimates["host_bytes"]  # no more pinned RAM
    left = vram - decoder - CACHE_VRAM_SPARE - computed.estimates["device_bytes"]
    assert kept.film_blocks == left // per < computed.estimates["cache_layer_bytes"] // per
    assert kept.estimates["device_bytes"] == computed.estimates["device_bytes"] + kept.film_blocks * per
    assert f"camera FiLM of {kept.film_blocks}/40 blocks" in kept.reason and "later calls" in kept.reason
    assert "camera FiLM" not in computed.reason
    # the whole card: every block's FiLM beside the whole cache
    whole = plan_fast_memory(480, 832, FULL, layout480(), 79 * GiB, 64 * GiB, extra_vram=decoder)
    assert whole.cache == "gpu" and whole.film_blocks == 40
    # FP8 weights on 24 GB stream model blocks: nor does the FiLM take a block's room
    fp8 = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, weights="fp8", extra_vram=decoder)
    fp8_off = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, weights="fp8", extra_vram=decoder,
                               camera_film=False)
    assert fp8.blocks_on_gpu == fp8_off.blocks_on_gpu is not None
    assert fp8.cache_layers_on_gpu == fp8_off.cache_layers_on_gpu
    # layers asked for keep their room; the FiLM gets what they leave
    asked = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, cache="host",
                             cache_layers_on_gpu=computed.cache_layers_on_gpu, film_host=False)
    assert asked.cache_layers_on_gpu == computed.cache_layers_on_gpu and asked.film_blocks == kept.film_blocks
    fewer = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, cache="host",
                             cache_layers_on_gpu=0, film_host=False)
    assert fewer.film_blocks > kept.film_blocks
    # a Ulysses rank keeps the FiLM of its half of the tokens
    half = plan_fast_memory(480, 832, FULL, layout480(), 79 * GiB, 64 * GiB, seq_parallel=2)
    assert half.estimates["film_block_bytes"] == per // 2
    # nothing to keep without a camera
    assert plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, camera=False).film_blocks == 0
    # a CPU run keeps it in RAM when RAM allows
    assert plan_fast_memory(480, 832, FULL, layout480(), None, 100 * GiB).film_blocks == 40
    assert 0 < plan_fast_memory(480, 832, FULL, layout480(), None, 40 * GiB).film_blocks < 40
    assert plan_fast_memory(480, 832, FULL, layout480(), None, 36 * GiB).film_blocks == 0
    assert plan_fast_memory(480, 832, FULL, layout480(), None, 40 * GiB).film_host_blocks == 0  # RAM is the device


def test_the_blocks_the_card_has_no_room_for_keep_their_film_in_pinned_ram():
    """The FiLM of the blocks the device has no room for is written to pinned RAM once per chunk and streamed back
    in the chunk's later calls through FILM_HOST_SLOTS device buffers, for as many blocks as RAM holds beside the
    pinned cache and the RAM reserve. The buffers and the allocator's slack beside them (FILM_HOST_SLACK, measured)
    come before the cache layers and the device-kept blocks, and the plan still leaves the card's spare free."""
    from lingbot_world.memory.fast_planner import FILM_HOST_SLACK, FILM_HOST_SLOTS, _film_places
    from lingbot_world.memory.estimates import RAM_RESERVE

    vram, decoder = int(23.5 * GiB), int(7.0e9)
    per = 2 * 3 * 30 * 52 * FULL.dim * 2
    device_only = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, film_host=False)
    both = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder)
    est = both.estimates
    assert device_only.film_blocks >= 2 and device_only.film_host_blocks == 0
    assert both.film_blocks + both.film_host_blocks == 40
    assert est["film_buffer_slots"] == FILM_HOST_SLOTS
    assert est["film_buffer_bytes"] == FILM_HOST_SLOTS * per + FILM_HOST_SLACK
    assert est["film_host_bytes"] == both.film_host_blocks * per
    assert est["device_bytes"] <= vram - decoder - CACHE_VRAM_SPARE  # the spare stays free
    # the buffers and the slack (0.74 GB) take at most two cache layers (0.67 GB each) and the device-kept blocks
    assert device_only.cache_layers_on_gpu - 2 <= both.cache_layers_on_gpu <= device_only.cache_layers_on_gpu
    assert both.film_blocks <= device_only.film_blocks
    assert f"{both.film_host_blocks} blocks in pinned RAM" in both.reason and "2 camera FiLM buffers" in both.reason
    # RAM: only what the pinned cache and the reserve leave; too little for more than the buffers: none there
    for blocks_room in (5.5, 12.5):
        ram = RAM_RESERVE + est["host_bytes"] + int(blocks_room * per)
        p = plan_fast_memory(480, 832, FULL, layout480(), vram, ram, extra_vram=decoder)
        assert p.cache_layers_on_gpu == both.cache_layers_on_gpu and p.film_host_blocks == int(blocks_room)
    short = plan_fast_memory(480, 832, FULL, layout480(), vram, RAM_RESERVE + device_only.estimates["host_bytes"]
                             + int(1.5 * per), extra_vram=decoder)
    assert short.film_host_blocks == 0 and short.film_blocks == device_only.film_blocks
    assert short.cache_layers_on_gpu == device_only.cache_layers_on_gpu
    # where the cache layers would fill the room, the host FiLM still gets its buffers
    full = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB)
    full_off = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, film_host=False)
    assert full_off.film_blocks == 0 and full.film_blocks + full.film_host_blocks == 40
    assert full_off.cache_layers_on_gpu - 2 <= full.cache_layers_on_gpu <= full_off.cache_layers_on_gpu
    # the whole card keeps every block's on the device
    whole = plan_fast_memory(480, 832, FULL, layout480(), 79 * GiB, 64 * GiB, extra_vram=decoder)
    assert (whole.film_blocks, whole.film_host_blocks) == (40, 0)
    # the rule alone: (device blocks, host blocks, buffers)
    assert _film_places(per - 1, per, 40, 100 * per, slots=2, slack=0) == (0, 0, 0)  # no room for a buffer
    assert _film_places(per, per, 40, 100 * per, slots=2, slack=0) == (0, 40, 1)  # room for one: one
    assert _film_places(2 * per, per, 40, 100 * per, slots=2, slack=0) == (0, 40, 2)
    assert _film_places(5 * per, per, 40, 10 * per, slots=2, slack=0) == (3, 10, 2)
    assert _film_places(5 * per, per, 40, 2 * per, slots=2, slack=0) == (5, 0, 0)  # RAM for no more than 2
    assert _film_places(3 * per, per, 40, 10 * per, slots=1, slack=0) == (2, 10, 1)
    assert _film_places(5 * per, per, 40, 100 * per, slots=2, slack=2 * per) == (1, 39, 2)  # the slack first
    assert _film_places(2 * per, per, 40, 100 * per, slots=2, slack=2 * per) == (2, 0, 0)  # no room after it
    assert _film_places(40 * per, per, 40, 100 * per) == (40, 0, 0)
    # the cache of such a plan: the device blocks first, then the host ones, in a store the caller may keep
    from lingbot_world.memory.film_stream import HostFilmStore

    film = both.make_film("cpu")
    store = film.stores["host"]
    assert store.buffers == [None] * FILM_HOST_SLOTS and store.keep_buffers
    assert film.device_blocks == tuple(range(both.film_blocks))
    assert film.host_blocks == tuple(range(both.film_blocks, 40))
    film.close()
    store = HostFilmStore("cpu")
    film = both.make_film(host_store=store)
    assert film.stores["host"] is store
    with pytest.raises(ValueError, match="needs the device or a host store"):
        both.make_film()
    assert device_only.make_film().host_blocks == ()
    assert device_only.make_film_store("cpu") is None


def test_small_cards_block_swap_the_model_too():
    p = plan_fast_memory(480, 832, FULL, layout480(), int(11.5 * GiB), 64 * GiB)
    assert p.cache == "host" and p.cache_layers_on_gpu == 0 and p.blocks_on_gpu is not None and p.blocks_on_gpu < 40
    assert "model block swap" in p.reason
    assert p.estimates["device_bytes"] <= int(11.5 * GiB) - CACHE_VRAM_SPARE
    tight = plan_fast_memory(480, 832, FULL, layout480(), int(7.5 * GiB), 64 * GiB)
    assert not tight.cache_text and "text K/V recomputed" in tight.reason


def test_a_cache_that_would_fill_the_cards_spare_streams_its_last_layers():
    """A Ulysses rank's half cache (or a short video's) that fits the card only by eating the spare: before, the
    whole cache went on the GPU (24.9 GB planned for 25.2 GB free; 25.1 GB in nvidia-smi on a 24 GiB cap)."""
    layout = layout480()
    whole = plan_fast_memory(480, 832, FULL, layout, 80 * GiB, 64 * GiB, seq_parallel=2)
    need = whole.estimates["model_bytes"] + whole.estimates["cache_bytes"] + whole.estimates["text_kv_bytes"] \
        + whole.estimates["activation_bytes"] + whole.estimates["headroom"]
    tight = plan_fast_memory(480, 832, FULL, layout, need + GiB, 64 * GiB, seq_parallel=2)
    assert tight.cache == "host" and 0 < tight.cache_layers_on_gpu < 40
    assert tight.estimates["device_bytes"] <= need + GiB - CACHE_VRAM_SPARE
    roomy = plan_fast_memory(480, 832, FULL, layout, need + CACHE_VRAM_SPARE, 64 * GiB, seq_parallel=2)
    assert roomy.cache == "gpu" and roomy.cache_layers_on_gpu == 40


def test_a_ulysses_rank_keeps_room_for_nccl():
    """NCCL's buffers live outside torch's allocator: a rank's plan leaves SEQ_PARALLEL_VRAM for them (on 2 x H100
    capped at 24 GB, rank 0 reached 24.7 GB in nvidia-smi with 22.0 GB reserved by torch)."""
    from lingbot_world.memory.estimates import SEQ_PARALLEL_VRAM

    vram, decoder = int(23.5 * GiB), int(5.5e9)
    one = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder)
    two = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, extra_vram=decoder, seq_parallel=2)
    assert two.estimates["headroom"] == one.estimates["headroom"] + SEQ_PARALLEL_VRAM
    assert two.estimates["device_bytes"] <= vram - decoder - CACHE_VRAM_SPARE  # NCCL's share is inside the plan
    assert f"headroom {(VRAM_HEADROOM + SEQ_PARALLEL_VRAM) / 1e9:.1f} GB" in two.reason


@pytest.mark.parametrize("weights", ["nf4", "fp8", "int8"])
@pytest.mark.parametrize("card_gib", [12, 16, 24, 32, 48])
def test_streamed_blocks_and_cache_layers_leave_the_same_spare(weights, card_gib):
    """Larger stored weights (FP8/INT8, ~2x NF4) are streamed by the cache's rule: whatever streams, the card's last
    CACHE_VRAM_SPARE stays free (a 24 GB card at <= 22.5 GB with a 5.5 GB decoder beside the model)."""
    vram, decoder = int((card_gib - 0.5) * GiB), int(5.5e9)
    p = plan_fast_memory(480, 832, FULL, layout480(), vram, 64 * GiB, weights=weights, extra_vram=decoder)
    if p.cache == "host" and p.blocks_on_gpu != 0:  # (no resident block at all is the smallest layout there is)
        assert p.estimates["device_bytes"] + decoder <= vram - CACHE_VRAM_SPARE
    if weights != "nf4" and card_gib == 24:
        assert p.blocks_on_gpu is not None and "model block swap" in p.reason


def test_refuses_when_the_cache_does_not_fit_in_host_ram_either():
    with pytest.raises(FastMemoryError, match=r"layers \(\d+\.\d GB\) would live in pinned host RAM but only 8\.6 GB"):
        plan_fast_memory(480, 832, FULL, layout480(), int(23.5 * GiB), 8 * GiB)
    # a bounded cache fits where the whole video's does not
    small = layout480(max_attention=3 * 1560)
    assert plan_fast_memory(480, 832, FULL, small, int(23.5 * GiB), 8 * GiB).cache == "gpu"


def test_a_bf16_cache_short_of_ram_names_the_fp8_preset_when_that_fits():
    """A 16 GB card in a 32 GB box: the 81-frame video's bf16 cache (26.8 GB) does not fit in RAM, its FP8 twin
    does; the refusal says so with the RAM that plan pins, and says nothing of it where FP8 would not fit either."""
    vram, ram = 15 * GiB, 24 * GiB
    fp8 = plan_fast_memory(480, 832, FULL, layout480(), vram, ram, kv_fp8=True)
    with pytest.raises(FastMemoryError) as e:
        plan_fast_memory(480, 832, FULL, layout480(), vram, ram)
    assert f"'fast' (or 'draft') keeps the cache in FP8 (approximate): it fits, with " \
           f"{fp8.estimates['host_bytes'] / 1e9:.1f} GB of pinned RAM" in str(e.value)
    for fp8_too in (False, True):
        with pytest.raises(FastMemoryError) as e:
            plan_fast_memory(480, 832, FULL, layout480(), vram, 12 * GiB, kv_fp8=fp8_too)
        assert "FP8" not in str(e.value) and "Use fewer frames" in str(e.value)


def test_requested_placements_are_kept():
    p = plan_fast_memory(480, 832, FULL, layout480(), int(23.5 * GiB), 64 * GiB, cache="gpu")
    assert p.cache == "gpu" and not p.fits and "WARNING" in p.reason
    p = plan_fast_memory(480, 832, FULL, layout480(), 80 * GiB, 64 * GiB, cache="host", cache_layers_on_gpu=3)
    assert p.cache == "host" and p.cache_layers_on_gpu == 3 and p.reason.startswith("requested:")
    with pytest.raises(ValueError, match="cache placement"):
        plan_fast_memory(480, 832, FULL, layout480(), GiB, GiB, cache="disk")


def test_on_the_cpu_the_plan_has_no_vram_budget_and_says_so():
    """vram_free=None (ComfyUI --cpu, the CLI on a CPU): everything in RAM, like the experts' planner says it."""
    for cache in ("auto", "host"):
        p = plan_fast_memory(480, 832, FULL, layout480(), None, 100 * GiB, cache=cache)
        assert p.cache == "gpu" and p.cache_layers_on_gpu == 40 and p.blocks_on_gpu is None and p.fits
        assert "in host RAM (CPU run, no VRAM)" in p.reason and "free VRAM" not in p.reason
        assert p.estimates["vram_free"] is None and p.estimates["headroom"] == 0
    short = plan_fast_memory(480, 832, FULL, layout480(), None, 8 * GiB)
    assert not short.fits and "WARNING: only 8.6 GB RAM" in short.reason


def test_cache_layouts():
    assert layout480().capacity == 21 * 1560 and layout480().reference_exact and not layout480().evict
    m = layout480(max_attention=2000)
    assert (m.capacity, m.evict, m.max_attention, m.reference_exact) == (4680, True, 2000, True)  # >= one chunk
    w = layout480(window_frames=9, sink_frames=3)
    assert (w.capacity, w.sink_tokens, w.evict, w.reference_exact) == (9 * 1560, 3 * 1560, True, False)
    assert "not the released pipeline's" in w.note
    assert layout480(window_frames=30).evict is False  # covers the whole video
    with pytest.raises(ValueError, match="cannot hold the 3-frame sink plus one 3-frame chunk"):
        layout480(window_frames=5, sink_frames=3)
    with pytest.raises(ValueError, match="only matters with a window"):
        layout480(sink_frames=3)
    with pytest.raises(ValueError, match="window of 2"):
        layout480(window_frames=2)


# ---- identical latents in every placement -------------------------------------------------------------------
_tiny = load_sibling("fast_tiny")
TINY, LH, LW, FSL, fast_latents = _tiny.TINY, _tiny.LH, _tiny.LW, _tiny.FSL, _tiny.fast_latents


@pytest.fixture(scope="module")
def model():
    return _tiny.make_model()


@pytest.mark.parametrize("layout_kw,frames", [
    ({}, 9), ({"max_attention": 2 * FSL + 1}, 9),
    ({"window_frames": 6, "sink_frames": 3}, 12),  # evicts one chunk per chunk: the host ring turns by its length
    ({"window_frames": 7, "sink_frames": 2}, 15),  # ring of 5 frames turned by 3: copies wrap around its end
])
def test_host_streamed_cache_gives_the_resident_latents(model, layout_kw, frames):
    layout = cache_layout(frames, FSL, **layout_kw)
    resident = fast_latents(model, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.float32), frames)
    for on_device in (0, 1):
        got, stats = _tiny.streamed_latents(model, layout, frames, on_device)
        torch.testing.assert_close(got, resident, rtol=0, atol=0)
        assert stats["streamed_layers"] == 3 - on_device and stats["written_back_bytes"] > 0
        assert model.before_block is None and model.after_block is None  # unhooked


def test_host_ring_maps_slots_like_the_shifted_cache():
    from lingbot_world.memory.kv_host_layers import _SlotMap

    cap, sink = 10, 3
    m = _SlotMap(cap, sink)
    shifted = list(range(cap))  # what each slot of a shifted cache holds, as host positions written once
    for evicted in (4, 2, 5, 7):
        m.advance(evicted)
        kept = shifted[sink + evicted:] + shifted[sink:sink + evicted]  # the reference shift (tail reused)
        shifted = shifted[:sink] + kept
        got = [pos + i for a, pos, n in m.pieces(0, cap) for i in range(n)]
        assert got == shifted
        assert all(n > 0 for _, _, n in m.pieces(2, 9)) and len(m.pieces(2, 9)) <= 3


def test_only_the_context_pass_is_written_back(model):
    layout = cache_layout(9, FSL)
    s = _tiny.streamed(model, layout, 1)
    try:
        fast_latents(model, s.cache)
        per_chunk = 2 * 3 * FSL * TINY.num_heads * TINY.head_dim * 4  # K and V of one chunk, float32
        assert s.written_back_bytes == 3 * 2 * per_chunk  # 3 chunks x 2 streamed layers, context passes only
        # uploads: per call the past of each streamed layer (0, 1 and 2 chunks for chunks 0, 1, 2; 5 calls each)
        assert s.uploaded_bytes == 5 * (0 + 1 + 2) * 2 * per_chunk
    finally:
        s.close()


def test_max_attention_bounded_cache_is_reference_exact(model):
    # the release with --max_attention_size M keeps the whole video and attends to the latest M tokens; the bounded
    # cache keeps only those: same keys in the same order, so the same latents
    m = 2 * FSL + 1
    whole = KVCache.allocate(3, 9 * FSL, TINY.num_heads, TINY.head_dim, dtype=torch.float32, max_attention=m)
    bounded = cache_layout(9, FSL, max_attention=m)
    assert bounded.capacity == 3 * FSL
    torch.testing.assert_close(fast_latents(model, bounded.make(3, TINY.num_heads, TINY.head_dim,
                                                                 dtype=torch.float32)),
                               fast_latents(model, whole), rtol=0, atol=0)


def test_cancel_leaves_nothing_allocated(model):
    layout = cache_layout(9, FSL)
    plan = plan_fast_memory(64, 96, TINY, layout, 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1)
    placement = place_kv_cache(plan, model, "cpu", torch.float32)
    host = placement.streamer.host
    calls = []
    with pytest.raises(Cancelled):
        fast_latents(model, placement.cache, cancel_check=lambda: calls.append(1) or len(calls) > 6)
    placement.close()
    assert all(h.buffer.tensor.numel() == 0 and h.k is None for h in host.values())
    assert all(t.numel() == 0 for t in placement.cache.k + placement.cache.v)
    assert model.before_block is None and model.after_block is None


def test_fast_placement_frees_the_model_and_the_cache(model, tmp_path):
    from lingbot_world.loaders.nf4_writer import make_random_nf4_expert

    make_random_nf4_expert(TINY, tmp_path / "fast", device="cpu", seed=1)
    layout = cache_layout(9, FSL)
    plan = plan_fast_memory(32, 48, TINY, layout, 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1)
    with FastPlacement(plan, "cpu") as fp:
        m = fp.load_model(tmp_path / "fast")
        cache = fp.make_cache()
        assert cache.num_layers == 3 and m.cfg.causal
        out = fast_latents(m, cache)
        assert out.isfinite().all()
    assert all(p.numel() == 0 for p in m.parameters())  # dropped, although the test still holds the module


# ---- CUDA -------------------------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("layout_kw,frames", [({}, 9), ({"window_frames": 7, "sink_frames": 2}, 15)])
def test_cuda_host_streamed_cache_matches_the_resident_cache(model, layout_kw, frames):
    dev = torch.device("cuda")
    m = WanDiT(TINY, device=dev, dtype=torch.bfloat16).eval()
    m.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    layout = cache_layout(frames, FSL, **layout_kw)
    resident = fast_latents(m, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16, device=dev),
                            frames, device=dev)
    clear_device_caches(m)  # the RoPE tables
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for on_device in (0, 2):
        s = KVStreamer.build(layout, 3, TINY.num_heads, TINY.head_dim, device=dev, layers_on_device=on_device,
                             dtype=torch.bfloat16, pin=True).install(m)
        try:
            assert all(h.buffer.pinned for h in s.host.values())
            got = fast_latents(m, s.cache, frames, device=dev)
        finally:
            s.close()
        torch.testing.assert_close(got, resident, rtol=0, atol=0)
        del got
        clear_device_caches(m)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == base  # ring buffers, device layers and text K/V freed


@cuda
@pytest.mark.cuda
def test_cuda_cancel_returns_every_byte(model):
    dev = torch.device("cuda")
    m = WanDiT(TINY, device=dev, dtype=torch.bfloat16).eval()
    m.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    plan = plan_fast_memory(32, 48, TINY, cache_layout(9, FSL), 1 << 40, 1 << 40, cache="host",
                            cache_layers_on_gpu=1)
    placement = place_kv_cache(plan, m, dev, torch.bfloat16)
    calls = []
    with pytest.raises(Cancelled) as stopped:
        fast_latents(m, placement.cache, device=dev, cancel_check=lambda: calls.append(1) or len(calls) > 7)
    traceback.clear_frames(stopped.value.__traceback__)  # the run's locals (noise, finished chunks) go with it
    del stopped
    placement.close()
    clear_device_caches(m)
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base and m.before_block is None

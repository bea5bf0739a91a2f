"""The FP8 K/V cache (the `draft` preset's kv_fp8 lever; wan/dit/kv_fp8.py, memory/kv_fp8_layers.py).

- The rounding against an independent one: every e4m3 value enumerated from its bits, the nearest (ties to an even
  code) taken for each value over a power-of-two scale found by a float64 loop.
- What makes the video independent of the memory plan: a rounded value encodes and decodes to itself bit for bit,
  so a layer streamed from RAM as codes gives the bits a layer kept on the device holds. Checked end to end: the
  latents of FP8 caches with 0, 1 or 3 layers on the device are equal, with windows whose host ring wraps.
- Half the bytes: what a streamed layer holds in RAM and uploads per call; the plan counts it.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lingbot_world.memory.kv_park import ParkedKV, park
from lingbot_world.memory.fast_plan import FastMemoryError
from lingbot_world.memory.fast_planner import plan_fast_memory
from lingbot_world.memory.kv_placement import place_kv_cache
from lingbot_world.memory.estimates import RAM_RESERVE
from lingbot_world.memory.kv_stream import KVStreamer, layer_places
from lingbot_world.speed.levers import ChunkLevers, plan_levers
from lingbot_world.speed.presets import PRESETS
from lingbot_world.wan.dit import kv_fp8
from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

from tests.conftest import load_sibling

_tiny = load_sibling("fast_tiny")
TINY, LH, LW, FSL = _tiny.TINY, _tiny.LH, _tiny.LW, _tiny.FSL


# ---- the rounding -----------------------------------------------------------------------------------------------
def _e4m3_values() -> list[float]:
    """Every finite non-negative e4m3fn value from its bit fields (bias 7; exponent 15 with mantissa 7 is NaN)."""
    out = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue
            out.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return sorted(set(out))


def _round_row(row: list[float]) -> list[float]:
    """The reference rounding of one row: scale 2^e, e the smallest integer with max|x| <= 448 * 2^e."""
    grid = _e4m3_values()
    amax = max(abs(x) for x in row)
    e = 0
    if amax > 0:
        e = -200
        while amax > 448 * 2.0 ** e:
            e += 1
    e = max(-120, min(120, e))
    out = []
    for x in row:
        y = abs(x) / 2.0 ** e
        i = min(range(len(grid)), key=lambda j: (abs(grid[j] - y), j % 2))  # ties: the even code
        out.append(math.copysign(grid[i] * 2.0 ** e, x))
    return out


def test_the_rounding_matches_a_reference_written_from_the_format():
    g = torch.Generator().manual_seed(0)
    scales = torch.logspace(-20, 20, 24, dtype=torch.float64)[:, None]
    rows = torch.randn(24, 16, generator=g, dtype=torch.float64) * scales
    rows[0] = 0
    rows[1, 0] = 448.0  # exactly the top of scale 2^0
    rows[2, :] = 1.0
    rows[3, 0] = 448.0 * 2 ** 5 * (1 + 2 ** -20)  # just above a power of two: the next exponent
    x = rows.to(torch.float32)
    got = kv_fp8.round_fp8(x)
    want = torch.tensor([_round_row(r) for r in x.double().tolist()], dtype=torch.float64)
    assert torch.equal(got.double(), want)
    assert kv_fp8.exponents(x[1:4]).flatten().tolist() == [0, -8, 6]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_a_rounded_value_encodes_to_itself_and_errs_at_most_a_sixteenth_of_its_row(dtype):
    # fp16 (an fp16acc model's cache): rows from its subnormals (below 6e-5) to 1e4; decoded values it cannot hold
    # exactly round to ones that encode to themselves as well
    g = torch.Generator().manual_seed(1)
    span = (-7, 4) if dtype == torch.float16 else (-30, 30)
    x = (torch.randn(2, 40, 4, 128, generator=g) * torch.logspace(*span, 40)[None, :, None, None]).to(dtype)
    r = kv_fp8.round_fp8(x)
    codes, exps = kv_fp8.encode(r)
    assert codes.dtype == torch.float8_e4m3fn and exps.dtype == torch.int8 and exps.shape == (2, 40, 4, 1)
    assert torch.equal(kv_fp8.decode(codes, exps, dtype=dtype), r)
    assert torch.equal(kv_fp8.round_fp8(r), r)
    amax = x.float().abs().amax(-1, keepdim=True)
    assert ((r.float() - x.float()).abs() <= amax / 16).all()
    assert not torch.equal(r, x)


# ---- the cache --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return _tiny.make_model()


def _latents(model, cache, frames, device="cpu"):
    return _tiny.fast_latents(model, cache, frames, device=device)


def _streamer(model, layout, on_device, fp8=True, dtype=torch.bfloat16):
    return _tiny.streamed(model, layout, on_device, dtype=dtype, fp8=fp8)


@pytest.mark.parametrize("layout_kw,frames", [
    ({}, 9),
    ({"window_frames": 7, "sink_frames": 2}, 15),  # a ring of 5 frames turned by 3: copies wrap around its end
])
def test_the_video_does_not_depend_on_which_layers_stream(model, layout_kw, frames):
    layout = cache_layout(frames, FSL, **layout_kw)
    resident = layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16, round_kv=kv_fp8.round_fp8)
    want = _latents(model, resident, frames)
    exact = _latents(model, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16), frames)
    assert not torch.equal(want, exact)  # the lever does something ...
    assert (want - exact).norm() < 0.1 * exact.norm()  # ... and stays close
    for on_device in (0, 1):
        got, stats = _tiny.streamed_latents(model, layout, frames, on_device, dtype=torch.bfloat16, fp8=True)
        assert torch.equal(got, want)
        assert stats["streamed_layers"] == 3 - on_device and stats["written_back_bytes"] > 0
    assert model.before_block is None and model.after_block is None


def test_a_streamed_fp8_layer_holds_and_moves_about_half_the_bytes(model):
    layout = cache_layout(9, FSL)
    moved = {}
    for fp8 in (False, True):
        s = _streamer(model, layout, 1, fp8=fp8)
        try:
            _latents(model, s.cache, 9)
            moved[fp8] = (s.host_bytes, s.uploaded_bytes, s.written_back_bytes)
        finally:
            s.close()
    d = TINY.head_dim
    for bf16, fp8 in zip(moved[False], moved[True]):
        assert fp8 * 2 * d == bf16 * (d + 1)  # 128 codes + 1 exponent byte for 256 bytes of bf16


@pytest.mark.parametrize("first,second", [
    ((1, 0), (2, 0)),  # (layers on the device, of which FP8 codes): bf16 0, RAM 1-2 -> bf16 0-1, RAM 2
    ((2, 2), (3, 2)),  # codes 0-1, RAM 2 -> bf16 0, codes 1-2
])
def test_parked_fp8_layers_come_back_decoded_and_restore_the_same_video(model, first, second):
    """A state taken from a streamed FP8 cache after two chunks holds what a resident one holds; put back into a
    cache with another split, the third chunk comes out as in one uninterrupted run."""
    frames = 9
    layout = cache_layout(frames, FSL)
    whole = _latents(model, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16,
                                        round_kv=kv_fp8.round_fp8), frames)
    tiny_plan = plan_fast_memory(32, 48, TINY, layout, 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1,
                                 kv_fp8=True)

    def placed(split, **kw):
        plan = dataclasses.replace(tiny_plan, cache_layers_on_gpu=split[0], code_layers_on_gpu=split[1])
        placement = place_kv_cache(plan, model, "cpu", torch.bfloat16, **kw)
        codes = [i for i, p in enumerate(layer_places(3, split[0] - split[1], split[1])) if p == "codes"]
        assert sorted(placement.streamer.codes) == codes
        return placement

    placement = placed(first)
    run = _tiny.fast_run(model, placement.cache, frames)
    run.next_chunk()
    run.next_chunk()
    parked = park(placement)
    placement.close()
    assert isinstance(parked, ParkedKV) and all(k.dtype == torch.bfloat16 for k in parked.k)
    assert all(torch.equal(kv_fp8.round_fp8(k), k) for k in parked.k + parked.v)  # FP8 values, decoded
    placement2 = placed(second, fill=parked.fill)
    try:
        parked.restore_counters(placement2.cache)
        run.cache = placement2.cache
        third = run.next_chunk()
    finally:
        placement2.close()
    assert torch.equal(third, whole[:, :, 6:9])


# ---- the plan and the preset ------------------------------------------------------------------------------------
def test_the_plan_keeps_fp8_layers_in_half_the_ram_and_stages_their_codes():
    full = DiTConfig(causal=True)
    layout = cache_layout(21, 30 * 52, window_frames=15, sink_frames=3)
    vram, ram = int(23.5 * 1024**3), 64 * 1024**3
    bf16 = plan_fast_memory(480, 832, full, layout, vram, ram)
    fp8 = plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True)
    assert fp8.kv_fp8 and not bf16.kv_fp8 and fp8.cache == bf16.cache == "host"
    per = fp8.estimates["host_layer_bytes"]
    assert per * 2 * 128 == fp8.estimates["cache_layer_bytes"] * 129
    assert fp8.estimates["host_bytes"] == fp8.streamed_layers * per
    est = fp8.estimates  # the device bytes count the codes' staging buffer beside the two layer buffers
    assert fp8.device_cache_bytes == ((fp8.cache_layers_on_gpu - fp8.code_layers_on_gpu) * est["cache_layer_bytes"]
                                      + fp8.code_layers_on_gpu * per)
    assert est["device_bytes"] == (est["model_bytes"] + 2 * est["cache_layer_bytes"] + fp8.device_cache_bytes
                                   + per + est["text_kv_bytes"] + est["activation_bytes"] + est["headroom"]
                                   + fp8.film_blocks * est["film_block_bytes"] + est["film_buffer_bytes"])
    assert est["device_bytes"] <= bf16.estimates["device_bytes"] + per
    assert "in FP8" in fp8.reason and "FP8 staging" in fp8.reason


def test_when_ram_is_short_the_card_keeps_about_twice_the_layers_as_codes():
    """480x832, window 15 + sink 3 on a 24 GB card. With RAM to spare the card keeps bf16 layers (no decode before
    their blocks). With 12 GiB the bf16 plan's pinned layers would leave less than RAM_RESERVE, so the card keeps
    FP8 codes, half a bf16 layer's bytes, in the same room: about twice as many layers, half the RAM pinned."""
    full = DiTConfig(causal=True)
    layout = cache_layout(21, 30 * 52, window_frames=15, sink_frames=3)
    vram = int(23.5 * 1024**3)
    roomy = plan_fast_memory(480, 832, full, layout, vram, 64 * 1024**3, kv_fp8=True, film_host=False)
    never = plan_fast_memory(480, 832, full, layout, vram, 64 * 1024**3, kv_fp8=True, film_host=False,
                             kv_codes_on_gpu=False)
    assert roomy.code_layers_on_gpu == 0 and roomy.to_json() == never.to_json()
    ram = 12 * 1024**3
    codes = plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True, film_host=False)
    bf16 = plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True, film_host=False, kv_codes_on_gpu=False)
    per, layer = codes.estimates["host_layer_bytes"], codes.estimates["cache_layer_bytes"]
    assert bf16.code_layers_on_gpu == 0 and bf16.cache_layers_on_gpu == roomy.cache_layers_on_gpu
    assert bf16.estimates["host_bytes"] > ram - RAM_RESERVE  # what makes RAM short
    assert codes.code_layers_on_gpu == codes.cache_layers_on_gpu  # not all fit: every kept layer as codes
    assert 2 * bf16.cache_layers_on_gpu <= codes.cache_layers_on_gpu <= 2 * bf16.cache_layers_on_gpu + 2
    assert codes.device_cache_bytes <= bf16.device_cache_bytes + per  # the same room ...
    assert codes.device_cache_bytes + per > bf16.device_cache_bytes + layer - per  # ... filled
    assert codes.estimates["host_bytes"] == codes.streamed_layers * per < bf16.estimates["host_bytes"]
    assert f"({codes.code_layers_on_gpu} as FP8 codes)" in codes.reason and "RAM is short" in codes.reason
    hosted = codes.host_layer_indices()
    assert len(hosted) == codes.streamed_layers and hosted[-1] == 39  # spread over the blocks, the last one last
    gaps = [b - a for a, b in zip(hosted, hosted[1:])]
    assert max(gaps) - min(gaps) <= 1
    assert bf16.host_layer_indices() == tuple(range(bf16.cache_layers_on_gpu, 40))  # no codes: the last layers
    asked = plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True, cache="host", cache_layers_on_gpu=5)
    assert asked.cache_layers_on_gpu == 5 and asked.code_layers_on_gpu == 0  # a count asked for: bf16 layers
    exact = plan_fast_memory(480, 832, full, layout, vram, ram)
    assert exact.code_layers_on_gpu == 0  # a bf16 cache has no codes


def test_codes_on_the_card_let_a_video_run_whose_bf16_layers_would_not_fit_in_ram():
    full = DiTConfig(causal=True)
    layout = cache_layout(21, 30 * 52, window_frames=15, sink_frames=3)
    vram, ram = int(23.5 * 1024**3), 6 * 1024**3
    with pytest.raises(FastMemoryError, match="does not fit"):
        plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True, film_host=False, kv_codes_on_gpu=False)
    p = plan_fast_memory(480, 832, full, layout, vram, ram, kv_fp8=True, film_host=False)
    assert p.code_layers_on_gpu > 0 and p.estimates["host_bytes"] <= ram - 2 * 1024**3


def test_when_every_layer_fits_as_codes_the_room_left_keeps_some_in_bf16():
    full = DiTConfig(causal=True)
    layout = cache_layout(21, 30 * 52, window_frames=15, sink_frames=3)
    ram = int(8.1 * 1024**3)  # any layer in RAM leaves less than RAM_RESERVE
    gpu = plan_fast_memory(480, 832, full, layout, 80 * 1024**3, ram, kv_fp8=True)
    assert gpu.cache == "gpu" and gpu.code_layers_on_gpu == 0  # the whole cache in bf16 fits: nothing to decode
    for gib in range(28, 44):
        p = plan_fast_memory(480, 832, full, layout, gib * 1024**3, ram, kv_fp8=True, film_host=False)
        if p.cache == "host" and p.cache_layers_on_gpu == 40:
            break
    else:
        pytest.fail("no card size between 28 and 44 GiB keeps every layer as codes without the whole bf16 cache")
    assert 0 < p.code_layers_on_gpu < 40 and p.streamed_layers == 0 and p.host_layer_indices() == ()
    layer, per = p.estimates["cache_layer_bytes"], p.estimates["host_layer_bytes"]
    more_bf16 = p.device_cache_bytes + layer - per  # one more layer in bf16 would not have fitted
    assert p.estimates["device_bytes"] - p.device_cache_bytes + more_bf16 > gib * 1024**3 - 3 * 1024**3


@pytest.mark.parametrize("resident,codes", [(0, 1), (0, 2), (1, 1), (0, 3), (1, 2)])
@pytest.mark.parametrize("layout_kw,frames", [
    ({}, 9),
    ({"window_frames": 7, "sink_frames": 2}, 15),  # the code layers' ring turns like the host layers'
])
def test_layers_kept_as_codes_on_the_device_give_the_resident_video(model, layout_kw, frames, resident, codes):
    layout = cache_layout(frames, FSL, **layout_kw)
    want = _latents(model, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16,
                                       round_kv=kv_fp8.round_fp8), frames)
    s = _tiny.streamed(model, layout, resident, dtype=torch.bfloat16, fp8=True, code_layers=codes)
    try:
        assert sorted(s.codes) == [i for i, p in enumerate(layer_places(3, resident, codes)) if p == "codes"]
        assert all(h.kc.device.type == "cpu" and not h.link for h in s.codes.values())
        got = _latents(model, s.cache, frames)
        stats = s.stats()
    finally:
        s.close()
    assert torch.equal(got, want)
    hosted = 3 - resident - codes
    assert stats["code_layers_on_device"] == codes and stats["streamed_layers"] == hosted
    assert (stats["uploaded_bytes"] > 0) == (hosted > 0) and (stats["written_back_bytes"] > 0) == (hosted > 0)
    assert stats["code_bytes"] == codes * kv_fp8.pair_bytes(1, layout.capacity, TINY.num_heads, TINY.head_dim)


def test_code_layers_count_no_link_bytes(model):
    """Uploads and write-backs are the host layers' only: a code layer moves nothing over the link."""
    layout = cache_layout(9, FSL)
    moved = {}
    for codes in (0, 1):
        s = _tiny.streamed(model, layout, 0, dtype=torch.bfloat16, fp8=True, code_layers=codes)
        try:
            _latents(model, s.cache, 9)
            moved[codes] = (s.uploaded_bytes, s.written_back_bytes, len(s.host))
        finally:
            s.close()
    for both, fewer in zip(moved[0][:2], moved[1][:2]):
        assert fewer * 3 == both * 2  # 2 of 3 layers stream instead of 3


@pytest.mark.parametrize("env,codes,ahead", [(None, 1, True), (None, 0, False), ("0", 1, False), ("1", 0, True)])
def test_host_layers_upload_ahead_where_code_layers_sit_between_them(model, monkeypatch, env, codes, ahead):
    """The uploads start as soon as the staging buffer is free only in the layout that is for (code layers between
    the host layers); else one layer ahead, as streamed layers always did. LINGBOT_KV_UPLOAD_AHEAD overrides."""
    from lingbot_world.memory.kv_stream import UPLOAD_AHEAD_ENV

    if env is None:
        monkeypatch.delenv(UPLOAD_AHEAD_ENV, raising=False)
    else:
        monkeypatch.setenv(UPLOAD_AHEAD_ENV, env)
    layout = cache_layout(9, FSL)
    s = _tiny.streamed(model, layout, 0, dtype=torch.bfloat16, fp8=True, code_layers=codes)
    try:
        assert s.uploads.ahead is ahead
        got = _latents(model, s.cache, 9)
    finally:
        s.close()
    want = _latents(model, layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16,
                                       round_kv=kv_fp8.round_fp8), 9)
    assert torch.equal(got, want)


_CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_CUDA_MARKS)])
@pytest.mark.parametrize("ahead", ["0", "1"])
def test_code_layers_beside_a_block_swapped_model_give_the_resident_video(tmp_path, monkeypatch, device, ahead):
    """A small card short of RAM: the model's last blocks swap in from RAM and the cache keeps FP8 codes on the
    device with host layers between them. The block swap's hooks and the streamer's run in turn around each block,
    and uploads ahead (or one layer ahead) share the link with the blocks' weights: the NF4 model's video equals
    the one with the model and the whole FP8 cache on the device, bit for bit."""
    from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
    from lingbot_world.memory.kv_placement import FastPlacement
    from lingbot_world.memory.kv_stream import UPLOAD_AHEAD_ENV

    monkeypatch.setenv(UPLOAD_AHEAD_ENV, ahead)
    make_random_nf4_expert(TINY, tmp_path / "fast", device="cpu", seed=1)
    frames = 15
    layout = cache_layout(frames, FSL, window_frames=7, sink_frames=2)  # the rings wrap
    base = plan_fast_memory(32, 48, TINY, layout, 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1,
                            kv_fp8=True)

    def video(plan):
        with FastPlacement(plan, device) as fp:
            m = fp.load_model(tmp_path / "fast", compute_dtype=torch.bfloat16)
            cache = fp.make_cache(torch.bfloat16)
            streamer = fp.placement.streamer
            places = None if streamer is None else (sorted(streamer.codes), sorted(streamer.host))
            return _latents(m, cache, frames, device=device), places, fp.swapper is not None

    want, places, swapped = video(dataclasses.replace(base, cache="gpu", cache_layers_on_gpu=3))
    assert places is None and not swapped
    got, places, swapped = video(dataclasses.replace(base, cache_layers_on_gpu=2, code_layers_on_gpu=2,
                                                     blocks_on_gpu=1))
    assert places == ([0, 1], [2]) and swapped  # the host layer's upload can hide under the code layers' blocks
    assert torch.equal(got, want)


def test_layer_places_spread_the_host_layers_over_the_ring():
    assert layer_places(5, 2, 0) == ("device",) * 2 + ("host",) * 3
    assert layer_places(5, 0, 5) == ("codes",) * 5
    for n, resident, codes in ((40, 0, 26), (40, 0, 1), (40, 3, 20), (7, 1, 4), (40, 0, 39)):
        places = layer_places(n, resident, codes)
        hosted = [i for i, p in enumerate(places) if p == "host"]
        assert places[:resident] == ("device",) * resident and places.count("codes") == codes
        assert len(hosted) == n - resident - codes and hosted[-1] == n - 1
        gaps = [b - a for a, b in zip([resident - 1] + hosted, hosted)]
        assert max(gaps) - min(gaps) <= 1, (n, resident, codes, hosted)
    with pytest.raises(ValueError, match="do not fit"):
        layer_places(3, 2, 2)


def test_draft_and_fast_turn_the_fp8_cache_on_and_say_so():
    draft = PRESETS["draft"].levers
    assert draft.kv_fp8 and not draft.exact
    assert any("FP8" in d for d in draft.describe())
    assert PRESETS["fast"].levers.kv_fp8  # approximate already: the cache in FP8 takes 13 GB less RAM there
    assert not any(PRESETS[n].levers.kv_fp8 for n in ("exact", "auto"))  # the exact presets: bf16
    assert ChunkLevers(kv_fp8=True).exact is False
    assert plan_levers(None) == {"decode_dtype": "float32", "kv_fp8": False}


# ---- CUDA -------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_streamed_fp8_layers_give_the_resident_fp8_video(model):
    """On the GPU the codes go through the upload stream's staging buffer and are decoded on the copy stream, or are
    decoded there from the device (code layers); the video equals the all-resident FP8 cache's bit for bit."""
    dev = torch.device("cuda")
    m = WanDiT(TINY, device=dev, dtype=torch.bfloat16).eval()
    m.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    layout = cache_layout(15, FSL, window_frames=7, sink_frames=2)
    resident = layout.make(3, TINY.num_heads, TINY.head_dim, dtype=torch.bfloat16, device=dev,
                           round_kv=kv_fp8.round_fp8)
    want = _latents(m, resident, 15, device=dev)
    del resident
    torch.cuda.synchronize()
    for on_device, codes in ((0, 0), (2, 0), (0, 2), (0, 1), (1, 1), (0, 3)):  # codes: FP8 layers kept on the GPU
        s = KVStreamer.build(layout, 3, TINY.num_heads, TINY.head_dim, device=dev, layers_on_device=on_device,
                             code_layers=codes, dtype=torch.bfloat16, pin=True, fp8=True).install(m)
        try:
            assert all(h.buffer.pinned for h in s.host.values()) and all(h.kc.is_cuda for h in s.codes.values())
            assert (s.staging is not None and s.staging.is_cuda) == bool(s.host)
            got = _latents(m, s.cache, 15, device=dev)
        finally:
            s.close()
        assert torch.equal(got, want), (on_device, codes)


def _kernels(variant):
    from lingbot_world.speed import kv_fp8_fused

    if kv_fp8_fused.KERNELS.get() is None:
        pytest.skip("no Triton here")
    if variant == "hw" and torch.cuda.get_device_capability() < kv_fp8_fused.HW_FP8_CAPABILITY:
        pytest.skip("no hardware e4m3 conversion below Ada")
    return kv_fp8_fused, getattr(kv_fp8_fused, {"hw": "FUSED", "bits": "FUSED_BITS"}[variant])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["hw", "bits"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_the_fused_kernels_give_the_torch_ops_bits(dtype, variant):
    """Both kernels (hardware e4m3 conversion, and the integer ops an RTX 30xx runs) against the torch ops."""
    mod, ops = _kernels(variant)
    want_ops = mod.FUSED if torch.cuda.get_device_capability() >= mod.HW_FP8_CAPABILITY else mod.FUSED_BITS
    assert mod.kv_fp8_ops("cuda") is want_ops
    g = torch.Generator(device="cuda").manual_seed(5)
    scales = torch.logspace(-35, 35, 300, device="cuda")[:, None, None]
    x = torch.randn(1, 300, 8, 128, generator=g, device="cuda") * scales
    x[0, 0] = 0
    x[0, 1, 0, 0] = 448.0 * 2 ** 5 * (1 + 2 ** -20)
    x[0, 2, :, :] = 1e-39  # float32 subnormals (zero in bf16)
    x[0, 3, :, ::2] *= -1e-6  # negative values that round to -0
    x = x.to(dtype)
    r = ops.round(x)
    assert torch.equal(r, kv_fp8.round_fp8(x)) and torch.equal(r.signbit(), kv_fp8.round_fp8(x).signbit())
    codes, exps = ops.encode(r)
    want_codes, want_exps = kv_fp8.encode(r)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(exps, want_exps)
    out = torch.empty_like(x)
    assert ops.decode(codes, exps, out) is out and torch.equal(out, r)
    assert mod.KERNELS.failed is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["hw", "bits"])
def test_cuda_every_code_and_every_tie_round_as_torch_does(variant):
    """Every finite e4m3 value, the midpoints between neighbours (ties: to even) and a hair either side of them,
    both signs, in rows whose largest value is 448 (scale 2^0): the codes torch's cast gives, and back."""
    mod, ops = _kernels(variant)
    values = torch.arange(256, dtype=torch.uint8).view(kv_fp8.CODE).float()
    values = values[values.isfinite() & (values >= 0)].sort().values
    mids = (values[1:] + values[:-1]) / 2
    ulp = 2.0 ** -12 * mids
    probe = torch.cat([values, mids, mids - ulp, mids + ulp])
    probe = torch.cat([probe, -probe]).cuda()
    rows = probe.numel() // 127 + 1
    x = torch.zeros(rows * 127, device="cuda")
    x[:probe.numel()] = probe
    x = torch.cat([x.view(rows, 127), torch.full((rows, 1), 448.0, device="cuda")], dim=1).contiguous()
    codes, exps = ops.encode(x)
    assert torch.equal(exps, torch.zeros_like(exps))
    assert torch.equal(codes.view(torch.uint8), x.to(kv_fp8.CODE).view(torch.uint8))
    assert torch.equal(ops.decode(codes, exps, dtype=torch.float32), x.to(kv_fp8.CODE).float())

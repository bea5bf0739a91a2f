"""Memory modes: the auto decision from made-up free-memory numbers, size estimates, providers on tiny NF4 experts."""
import logging
import re

import pytest
import torch

from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
from lingbot_world.memory.host_buffer import HostBuffer
from lingbot_world.memory.pinned import dit_parts, tensor_slots
from lingbot_world.memory.estimates import ACTIVATION_SAFETY, VRAM_HEADROOM, estimate_activation_bytes, expert_sizes
from lingbot_world.memory.expert_plan import plan_memory
from lingbot_world.memory.placement import BlockSwapProvider, ResidentProvider, SwapProvider, make_provider
from lingbot_world.wan.dit.model import DiTConfig, pad_context

GiB = 1024**3
FULL = DiTConfig()
V480 = (81, 464, 832)
V720 = (81, 720, 1280)


# ---- sizes and estimates --------------------------------------------------------------------------------
def test_expert_sizes_match_the_spec_table():
    nf4 = expert_sizes(FULL, "nf4")
    bf16 = expert_sizes(FULL, "bf16")
    # spec §10.1: NF4 ≈ 9.58 GB per expert (codes 9.27 GB + absmax 0.29 GB + plain bf16 tensors); bf16 37.09 GB
    assert 9.55e9 < nf4.total < 9.62e9
    assert abs(bf16.total - 2 * 18_544_332_864) < 1e6
    assert nf4.total == nf4.base + 40 * nf4.block
    assert 0.23e9 < nf4.block < 0.24e9 and nf4.base < 0.2e9


def test_activation_estimate_scales_with_tokens_and_batch():
    seq = estimate_activation_bytes(*V480, FULL, False)
    bat = estimate_activation_bytes(*V480, FULL, True)
    seq_whole = estimate_activation_bytes(*V480, FULL, False, token_chunk=None)
    big_whole = estimate_activation_bytes(*V720, FULL, False, token_chunk=None)
    # 464x832x81 is 31,668 tokens and 720x1280x81 is 75,600: without chunking the estimate is linear in tokens
    assert big_whole / seq_whole == pytest.approx(75_600 / 31_668, rel=0.02)
    # batch 2 doubles the per-sample tensors; camera tokens and tables are shared
    assert 1.6 * seq < bat < 2.0 * seq
    # chunked: the full-length part is x, camera tokens, q/k/v/out (about 2.5 GB at 480p) plus one chunk's work
    assert 2e9 < seq < 4e9 < seq_whole
    no_cam = estimate_activation_bytes(*V480, FULL, False, camera=False)
    assert no_cam < seq
    with pytest.raises(ValueError, match="4n\\+1"):
        estimate_activation_bytes(80, 464, 832, FULL, False)


def test_token_chunk_bounds_the_per_token_work():
    whole = estimate_activation_bytes(*V480, FULL, False, token_chunk=None)
    chunked = estimate_activation_bytes(*V480, FULL, False, token_chunk=8192)
    smaller = estimate_activation_bytes(*V480, FULL, False, token_chunk=4096)
    assert smaller <= chunked < whole
    # chunking cannot go below the full-length tensors: x fp32 + q/k/v/out in bf16 (+ camera tokens)
    tokens, d = 31_668, FULL.dim
    assert smaller > tokens * (4 * d + 4 * 2 * d + 2 * d)
    # measured on an H100 (bench/results/pipeline_h100.json): 2.62 GB chunked, 4.88 GB unchunked
    assert 2.62e9 <= chunked < 1.15 * 2.62e9 and 0.95 * 4.88e9 < whole


# ---- the auto decision ----------------------------------------------------------------------------------
def plan(vram_gib, ram_gib=64, video=V480, **kw):
    return plan_memory(video, FULL, int(vram_gib * GiB), int(ram_gib * GiB), **kw)


def test_auto_picks_resident_on_a_big_card_and_batches_cfg():
    p = plan(75)
    assert p.mode == "resident" and p.cfg_batch and p.cfg_mode == "batch" and p.fits
    assert p.reason.startswith("auto: resident (both experts 19.2 GB")
    assert "batched CFG" in p.reason and "free VRAM" in p.reason


def test_on_the_cpu_the_plan_has_no_vram_budget_and_says_so():
    """vram_free=None: the CPU computes. Everything is resident, and the reason quotes no invented VRAM figure
    (it once said "1152921504.6 GB free VRAM")."""
    p = plan_memory(V480, FULL, None, 64 * GiB)
    assert p.mode == "resident" and p.fits and p.estimates["vram_free"] is None and p.estimates["headroom"] == 0
    assert "in host RAM (CPU run, no VRAM)" in p.reason and "VRAM " not in p.reason.replace("no VRAM", "")
    assert "headroom" not in p.reason and max(float(x) for x in re.findall(r"([0-9.]+) GB", p.reason)) < 100
    for mode in ("swap", "block_swap"):  # a mode the user asked for is kept, with every block on the "device"
        q = plan_memory(V480, FULL, None, 64 * GiB, mode=mode)
        assert q.mode == mode and q.fits and "CPU run" in q.reason
    assert plan_memory(V480, FULL, None, 64 * GiB, mode="block_swap").blocks_on_gpu == FULL.num_layers


def test_auto_falls_back_to_sequential_cfg_before_changing_mode():
    sizes = expert_sizes(FULL)
    seq = int(estimate_activation_bytes(*V480, FULL, False) * ACTIVATION_SAFETY)
    just_enough = 2 * sizes.total + seq + VRAM_HEADROOM + 1
    p = plan_memory(V480, FULL, just_enough, 64 * GiB)
    assert p.mode == "resident" and not p.cfg_batch
    p = plan_memory(V480, FULL, just_enough - 2, 64 * GiB)
    assert p.mode == "swap"


def test_auto_swap_keeps_the_released_expert_in_ram_only_when_ram_allows():
    p = plan(20, ram_gib=64)
    assert p.mode == "swap" and p.keep_in_ram
    assert "released expert kept in pinned RAM" in p.reason and "both experts would need" in p.reason
    p = plan(20, ram_gib=16)
    assert p.mode == "swap" and not p.keep_in_ram
    assert "dropped, reloaded from disk" in p.reason
    assert plan(20, ram_gib=16, keep_in_ram=True).keep_in_ram  # the user's choice wins


def test_auto_block_swap_counts_the_blocks_that_fit():
    p12 = plan(12)
    p10 = plan(10)
    assert p12.mode == p10.mode == "block_swap"
    assert 0 < p10.blocks_on_gpu < p12.blocks_on_gpu < 40
    assert f"auto: block_swap {p12.blocks_on_gpu}" in p12.reason and "stream from pinned RAM" in p12.reason
    sizes = expert_sizes(FULL)
    act = p12.estimates[f"activation_bytes_{'batched' if p12.cfg_batch else p12.cfg_mode}"]
    used = sizes.base + (p12.blocks_on_gpu + 2) * sizes.block + act + VRAM_HEADROOM
    assert used <= 12 * GiB < used + sizes.block  # exactly as many as fit
    assert p12.fits


def test_layered_footprint_is_sequential_plus_one_fp32_residual_stream():
    seq = estimate_activation_bytes(*V480, FULL, False)
    lay = estimate_activation_bytes(*V480, FULL, False, layered=True)
    bat = estimate_activation_bytes(*V480, FULL, True)
    tokens, d = 31_668, FULL.dim
    text = FULL.text_len * (FULL.text_dim * 4 + 4 * d * 2)  # the second sample's text context
    assert lay - seq == tokens * 4 * d + text
    assert 0.64e9 < tokens * 4 * d < 0.66e9  # "0.65 GB at 464x832x81"
    assert seq < lay < bat
    with pytest.raises(ValueError, match="cfg_batch=False"):
        estimate_activation_bytes(*V480, FULL, True, layered=True)


def _resident_budget(cfg_mode):
    sizes = expert_sizes(FULL)
    key = {"batch": True, "layered": False, "sequential": False}[cfg_mode]
    act = int(estimate_activation_bytes(*V480, FULL, key, layered=cfg_mode == "layered") * ACTIVATION_SAFETY)
    return 2 * sizes.total + act + VRAM_HEADROOM


def test_auto_cfg_is_batch_then_layered_then_sequential():
    p = plan_memory(V480, FULL, _resident_budget("batch"), 64 * GiB)
    assert p.mode == "resident" and p.cfg_mode == "batch"
    p = plan_memory(V480, FULL, _resident_budget("batch") - 1, 64 * GiB)
    assert p.mode == "resident" and p.cfg_mode == "layered" and not p.cfg_batch and p.cfg_layered
    assert "layered CFG" in p.reason and p.to_json()["cfg_mode"] == "layered"
    p = plan_memory(V480, FULL, _resident_budget("layered") - 1, 64 * GiB)
    assert p.mode == "resident" and p.cfg_mode == "sequential" and "sequential CFG" in p.reason
    assert p.estimates["activation_bytes_layered"] == int(
        estimate_activation_bytes(*V480, FULL, False, layered=True) * ACTIVATION_SAFETY)
    # a requested mode is kept (and named in the reason) even where another would be chosen
    p = plan_memory(V480, FULL, _resident_budget("batch"), 64 * GiB, cfg_mode="layered")
    assert p.cfg_mode == "layered" and "layered CFG" in p.reason


def test_block_swap_prefers_layered_which_streams_each_block_once_per_step():
    p = plan(12)
    assert p.mode == "block_swap" and p.cfg_mode == "layered"
    seq = plan(12, cfg_mode="sequential")
    assert seq.blocks_on_gpu >= p.blocks_on_gpu  # sequential keeps at least as many blocks...
    assert 40 - p.blocks_on_gpu <= 2 * (40 - seq.blocks_on_gpu)  # ...but streams the others twice per step
    assert "block uploads per step: layered" in p.reason
    # every block fits next to layered activations: no streaming, layered (it shares the FiLM) over sequential
    sizes = expert_sizes(FULL)
    lay = int(estimate_activation_bytes(*V480, FULL, False, layered=True) * ACTIVATION_SAFETY)
    budget = sizes.base + 42 * sizes.block + lay + VRAM_HEADROOM
    q = plan_memory(V480, FULL, budget, 8 * GiB, mode="block_swap")
    assert q.blocks_on_gpu == 40 and q.cfg_mode == "layered"
    # the user's block count: layered streams them once, so it wins when it fits
    r = plan(12, mode="block_swap", blocks_on_gpu=5)
    assert r.blocks_on_gpu == 5 and r.cfg_mode == "layered"


def test_auto_on_a_tiny_card_warns_and_uses_the_least_memory():
    p = plan(4)
    assert p.mode == "block_swap" and p.blocks_on_gpu == 0 and not p.cfg_batch and not p.fits
    assert "WARNING" in p.reason
    p = plan(6)  # an 8 GB-class card: a few blocks stay resident, the rest stream
    assert p.mode == "block_swap" and 0 < p.blocks_on_gpu < 40 and p.fits


def test_720p_needs_more_than_480p():
    assert plan(24, video=V720).mode in ("swap", "block_swap")
    assert plan(24, video=V720).estimates["activation_bytes_sequential"] > plan(24).estimates["activation_bytes_sequential"]


def test_requested_modes_are_kept_and_completed():
    p = plan(75, mode="swap")
    assert p.mode == "swap" and p.reason.startswith("requested: swap")
    p = plan(75, mode="swap_pinned")
    assert p.mode == "swap" and p.keep_in_ram
    p = plan(75, mode="block_swap", blocks_on_gpu=7)
    assert p.mode == "block_swap" and p.blocks_on_gpu == 7
    p = plan(75, mode="block_swap")
    assert p.blocks_on_gpu == 40  # everything fits
    p = plan(75, cfg_mode="sequential")
    assert not p.cfg_batch
    p = plan(20, mode="resident")
    assert p.mode == "resident" and not p.fits and ">" in p.reason


def test_bad_options_name_the_choices():
    with pytest.raises(ValueError, match="memory mode 'gpu'"):
        plan(24, mode="gpu")
    with pytest.raises(ValueError, match="cfg mode"):
        plan(24, cfg_mode="both")
    with pytest.raises(ValueError, match="weights"):
        plan(24, weights="int4")  # (fp8 is a weight format now: tests/test_fp8_weights.py)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_free_vram_reads_the_card():
    from lingbot_world.memory.estimates import available_ram_bytes, free_vram_bytes

    total = torch.cuda.get_device_properties(0).total_memory
    for dev in ("cuda", "cuda:0", torch.device("cuda")):
        assert 0 < free_vram_bytes(dev) <= total
    assert available_ram_bytes() > 0


def test_bf16_weights_are_planned_with_bf16_sizes():
    p = plan(70, weights="bf16")
    assert p.mode == "swap"  # 2 x 37 GB does not fit 70 GiB, one does
    assert plan(70).mode == "resident"  # the same card holds both NF4 experts
    assert p.estimates["expert_bytes"] > 37e9


# ---- pinned parts and providers on tiny NF4 experts ------------------------------------------------------
TINY = DiTConfig.tiny(num_layers=3)
F, H, W = 1, 2, 4


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    make_random_nf4_expert(TINY, root / "high", device="cpu", seed=1)
    make_random_nf4_expert(TINY, root / "low", device="cpu", seed=2)
    return root / "high", root / "low"


def inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, F, H, W, generator=g)
    ctx = pad_context([torch.randn(3, TINY.text_dim, generator=g)], TINY.text_len)
    y = torch.randn(1, 20, F, H, W, generator=g)
    cam = torch.randn(1, 384, F, H, W, generator=g)
    return x, torch.tensor([900]), ctx, y, cam


def forward(model):
    x, t, ctx, y, cam = inputs()
    with torch.no_grad():
        return model(x, t, ctx, y, camera=cam)


def test_slots_cover_every_quant_state_tensor(experts):
    model = load_expert(experts[0], device="cpu")
    slots = tensor_slots(model)
    labels = {s.label for s in slots}
    for name in ("blocks.0.ffn.0", "head.head", "time_projection.1"):
        for piece in ("weight", "bias", "weight.quant_state.absmax", "weight.quant_state.code",
                      "weight.quant_state.offset", "weight.quant_state.state2.absmax", "weight.quant_state.state2.code"):
            assert f"{name}.{piece}" in labels, f"{name}.{piece}"
    assert len(slots) == len(labels)  # no tensor twice (weight.quant_state is also module.quant_state)
    parts = dit_parts(model)
    assert sum(len(p.slots) for p in parts) == len(slots)
    assert len({p.signature() for p in parts[1:]}) == 1  # blocks share one layout


def test_parts_round_trip_through_a_host_copy_bit_exactly(experts):
    model = load_expert(experts[0], device="cpu")
    ref = forward(model)
    parts = dit_parts(model)
    before = [s.get().clone() for p in parts for s in p.slots]
    for p in parts:
        p.to_host(pin=True)  # no CUDA here: a plain host buffer
        assert p.has_host_copy and p.host.nbytes == p.nbytes
    assert torch.equal(forward(model), ref)
    for p in parts:
        p.to_device("cpu")
        assert p.device_buffer is not None
    after = [s.get() for p in parts for s in p.slots]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(forward(model), ref)
    buf = HostBuffer(1000, pin=True)
    assert buf.how in ("pageable", "registered", "pinned") and buf.tensor.numel() == 1000
    buf.close()
    assert buf.tensor.numel() == 0


def test_park_and_unpark_keep_the_output(experts):
    from lingbot_world.memory.pinned import park_on_host, unpark

    model = load_expert(experts[1], device="cpu")
    ref = forward(model)
    with pytest.raises(ValueError, match="not parked"):
        unpark(model, "cpu")
    for _ in range(2):  # the second park reuses the host copies
        park_on_host(model)
        assert all(p.has_host_copy and p.device_buffer is None for p in model._weight_parts)
        unpark(model, "cpu")
        assert torch.equal(forward(model), ref)


def test_make_provider_builds_the_planned_provider(experts, caplog):
    high, low = experts
    lines = []
    p = make_provider("auto", high, low, device="cpu", video=(5, 32, 32), vram_free=64 * GiB, ram_free=64 * GiB, log=lines.append)
    assert isinstance(p, ResidentProvider) and p.plan.mode == "resident"
    assert lines and lines[0].startswith("memory plan: auto: resident")
    p = make_provider("auto", high, low, device="cpu", video=(5, 32, 32), vram_free=1, ram_free=64 * GiB, log=lines.append)
    assert isinstance(p, BlockSwapProvider) and p.blocks_on_gpu == 0
    p = make_provider("swap_pinned", high, low, device="cpu", log=lines.append)
    assert isinstance(p, SwapProvider) and p.keep_in_ram
    lines.clear()
    p = make_provider("auto", high, low, device="cpu", video=(5, 32, 32), ram_free=64 * GiB, log=lines.append)
    assert p.plan.mode == "resident" and "CPU run" in lines[0] and "free VRAM" not in lines[0]  # measured: no budget
    p = make_provider("block_swap", high, low, device="cpu", blocks_on_gpu=2, log=lines.append)
    assert isinstance(p, BlockSwapProvider) and p.blocks_on_gpu == 2
    with caplog.at_level(logging.INFO, logger="lingbot_world.memory.placement"):
        make_provider("resident", high, low, device="cpu")
    assert "memory plan: requested: resident" in caplog.text
    with pytest.raises(ValueError, match="needs video"):
        make_provider("auto", high, low, device="cpu")
    with pytest.raises(ValueError, match="needs video"):
        make_provider("block_swap", high, low, device="cpu")
    with pytest.raises(FileNotFoundError):
        make_provider("swap", high.parent / "missing", low, device="cpu")


def test_swap_holds_one_expert_and_restores_from_ram(experts):
    high, low = experts
    ref_high = forward(load_expert(high, device="cpu"))
    prov = make_provider("swap_pinned", high, low, device="cpu", log=lambda s: None)
    m = prov.acquire("high")
    assert torch.equal(forward(m), ref_high)
    prov.acquire("low")  # without a release: the provider releases "high" itself
    assert prov.active == "low" and set(prov.kept) == {"high"}
    prov.release("low")
    m = prov.acquire("high")
    assert [(e["op"], e["name"], e["source"]) for e in prov.events] == [
        ("acquire", "high", "disk"), ("release", "high", "to_ram"), ("acquire", "low", "disk"),
        ("release", "low", "to_ram"), ("acquire", "high", "ram"),
    ]
    assert torch.equal(forward(m), ref_high)
    prov.close()
    assert not prov.kept and prov.active is None
    assert all(t.numel() == 0 for t in (s.get() for s in tensor_slots(m)))  # nothing left behind


def test_swap_drop_cuts_the_model_loose(experts):
    high, low = experts
    prov = make_provider("swap", high, low, device="cpu", keep_in_ram=False, log=lambda s: None)
    m = prov.acquire("high")
    prov.release("high")
    # a caller that kept a reference to the module does not keep its weights alive
    assert all(t.numel() == 0 for t in (s.get() for s in tensor_slots(m)))
    assert not prov.kept


def test_block_swap_warns_when_ram_cannot_hold_the_streamed_blocks():
    from lingbot_world.memory.expert_plan import plan_memory
    from lingbot_world.wan.dit.model import DiTConfig

    cfg = DiTConfig()  # the released size: 40 blocks of ~236 MB
    plan = plan_memory((81, 464, 832), cfg, vram_free=6 << 30, ram_free=2 << 30, mode="block_swap")
    assert plan.blocks_on_gpu < cfg.num_layers
    assert "RAM free; the streamed blocks need about" in plan.reason and "close other programs" in plan.reason
    roomy = plan_memory((81, 464, 832), cfg, vram_free=6 << 30, ram_free=64 << 30, mode="block_swap")
    assert "RAM free;" not in roomy.reason


def test_a_ulysses_rank_plans_room_for_nccl():
    """Every planner keeps the same room for NCCL on a sequence-parallel rank (memory.estimates.vram_headroom)."""
    from lingbot_world.memory.estimates import SEQ_PARALLEL_VRAM, vram_headroom

    one, two = plan(24), plan(24, seq_parallel=2)
    assert one.estimates["headroom"] == VRAM_HEADROOM == vram_headroom(1)
    assert two.estimates["headroom"] == VRAM_HEADROOM + SEQ_PARALLEL_VRAM == vram_headroom(2)
    assert plan_memory(V480, FULL, None, 64 * GiB, seq_parallel=2).estimates["headroom"] == 0  # CPU: no device

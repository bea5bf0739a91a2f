"""'Layered' CFG (issue 15): the cond and uncond samples one after the other inside each block.

Everything is checked against plain forwards of one sample each (what sequential CFG runs), bit for bit
(torch.equal), on tiny float32 configs on the CPU; the CUDA test repeats it in bf16 on an NF4 expert.
"""
import pytest
import torch

from lingbot_world.wan.dit import blocks as blocks_mod
from lingbot_world.wan.dit.blocks import WanBlock, weights_held
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, make_noise, sample

F, H, W = 2, 4, 6
TOKENS = F * (H // 2) * (W // 2)  # 12


@pytest.fixture(scope="module")
def setup():
    cfg = DiTConfig.tiny(num_layers=3)
    torch.manual_seed(3)
    model = WanDiT(cfg).eval()
    g = torch.Generator().manual_seed(5)
    pos = pad_context([torch.randn(5, cfg.text_dim, generator=g)], cfg.text_len)
    neg = pad_context([torch.randn(9, cfg.text_dim, generator=g)], cfg.text_len)
    x = torch.randn(1, 16, F, H, W, generator=g)
    y = torch.randn(1, 20, F, H, W, generator=g)
    cam = torch.randn(1, 384, F, H, W, generator=g)
    return cfg, model, pos, neg, x, y, cam


def _sequential(model, x, t, pos, neg, y, cam):
    return torch.cat([model(x, t, pos, y, camera=cam), model(x, t, neg, y, camera=cam)])


def _layered(model, x, t, pos, neg, y, cam, shared=True):
    return model(x.expand(2, *x.shape[1:]), t.expand(2), torch.cat([pos, neg]), y, camera=cam,
                 layered=True, shared_input=shared)


@pytest.mark.parametrize("camera", [True, False])
@pytest.mark.parametrize("chunk", [None, 5])  # 5 < 12 tokens: three chunks, the last one short
@pytest.mark.parametrize("shared", [True, False])
def test_layered_equals_sequential_bit_for_bit(setup, camera, chunk, shared):
    cfg, model, pos, neg, x, y, cam = setup
    model.set_token_chunk(chunk)
    try:
        cam = cam if camera else None
        t = torch.tensor([870])
        with torch.no_grad():
            ref = _sequential(model, x, t, pos, neg, y, cam)
            got = _layered(model, x, t, pos, neg, y, cam, shared)
    finally:
        model.set_token_chunk(blocks_mod.DEFAULT_TOKEN_CHUNK)
    assert got.shape == (2, 16, F, H, W)
    assert torch.equal(got, ref)
    assert not torch.equal(got[0], got[1])  # the texts differ, so do the samples


def test_layered_samples_with_their_own_latents_equal_their_own_forwards(setup):
    cfg, model, pos, neg, x, y, cam = setup
    x2 = torch.cat([x, torch.randn_like(x)])
    t2 = torch.tensor([870, 400])
    y2 = torch.cat([y, torch.randn_like(y)])
    with torch.no_grad():
        ref = torch.cat([model(x2[i:i + 1], t2[i:i + 1], c, y2[i:i + 1], camera=cam) for i, c in enumerate((pos, neg))])
        got = model(x2, t2, torch.cat([pos, neg]), y2, camera=cam, layered=True)
    assert torch.equal(got, ref)


def test_layered_single_sample_equals_plain_forward(setup):
    cfg, model, pos, neg, x, y, cam = setup
    with torch.no_grad():
        assert torch.equal(model(x, torch.tensor([500]), pos, y, camera=cam, layered=True),
                           model(x, torch.tensor([500]), pos, y, camera=cam))


def _count(monkeypatch, cls, name):
    calls = []
    original = getattr(cls, name)

    def spy(self, *a, **k):
        calls.append(self)
        return original(self, *a, **k)

    monkeypatch.setattr(cls, name, spy)
    return calls


@pytest.mark.parametrize("chunk,chunks", [(None, 1), (5, 3)])
def test_camera_film_once_per_block_and_chunk(setup, monkeypatch, chunk, chunks):
    cfg, model, pos, neg, x, y, cam = setup
    film = _count(monkeypatch, WanBlock, "camera_film")
    model.set_token_chunk(chunk)
    try:
        with torch.no_grad():
            _layered(model, x, torch.tensor([870]), pos, neg, y, cam)
            layered = len(film)
            film.clear()
            _sequential(model, x, torch.tensor([870]), pos, neg, y, cam)
    finally:
        model.set_token_chunk(blocks_mod.DEFAULT_TOKEN_CHUNK)
    assert layered == cfg.num_layers * chunks
    assert len(film) == 2 * cfg.num_layers * chunks


def test_hooks_fire_once_per_block(setup):
    cfg, model, pos, neg, x, y, cam = setup
    seen = []
    model.before_block = lambda i: seen.append(("before", i))
    model.after_block = lambda i: seen.append(("after", i))
    try:
        with torch.no_grad():
            _layered(model, x, torch.tensor([870]), pos, neg, y, cam)
    finally:
        model.before_block = model.after_block = None
    assert seen == [(w, i) for i in range(cfg.num_layers) for w in ("before", "after")]


@pytest.mark.parametrize("shared,block0", [(True, 1), (False, 2)])
def test_block0_self_attention_shared_only_when_flagged(setup, monkeypatch, shared, block0):
    cfg, model, pos, neg, x, y, cam = setup
    qkv = _count(monkeypatch, type(model.blocks[0].self_attn), "qkv")
    embed = _count(monkeypatch, torch.nn.Conv3d, "forward")
    with torch.no_grad():
        _layered(model, x, torch.tensor([870]), pos, neg, y, cam, shared)
    per_block = [sum(c is b.self_attn for c in qkv) for b in model.blocks]
    assert per_block == [block0] + [2] * (cfg.num_layers - 1)
    assert len(embed) == block0  # the patch embedding likewise


class CountingLinear(torch.nn.Linear):
    """A linear that, like NF4Linear, prepares its weight per call unless held; counts the preparations."""

    def __init__(self, lin):
        super().__init__(lin.in_features, lin.out_features, bias=lin.bias is not None)
        self.load_state_dict(lin.state_dict())
        self.held, self.prepared = None, 0

    def hold_weight(self):
        self.held = {}

    def release_weight(self):
        self.held = None

    def forward(self, x):
        if self.held is None or "w" not in self.held:
            self.prepared += 1
            if self.held is not None:
                self.held["w"] = True
        return super().forward(x)


def _counting_block(block):
    names = [n for n, m in block.named_modules() if type(m) is torch.nn.Linear]
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = block.get_submodule(parent) if parent else block
        setattr(owner, leaf, CountingLinear(getattr(owner, leaf)))
    return {n: block.get_submodule(n) for n in names}


def test_each_layer_prepared_once_per_step_for_both_samples(setup):
    cfg, model, pos, neg, x, y, cam = setup
    torch.manual_seed(0)
    block = WanBlock(cfg.dim, cfg.ffn_dim, cfg.num_heads, cfg.eps).eval()
    block.token_chunk = 5
    lins = _counting_block(block)
    rope = model.rope.get((F, H // 2, W // 2), "cpu")
    h = torch.randn(1, TOKENS, cfg.dim)
    e0 = torch.randn(1, 6, cfg.dim)
    ctxs = [torch.randn(1, 512, cfg.dim) for _ in range(2)]
    c = torch.randn(1, TOKENS, cfg.dim)
    with torch.no_grad():
        out = block.forward_layered([h, h.clone()], [e0, e0], ctxs, c, rope, torch.float32)
        prepared = {n: m.prepared for n, m in lins.items()}
        ref = [block(h, e0, ctx, c, rope, torch.float32) for ctx in ctxs]
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert prepared == {n: 1 for n in lins}, prepared  # q/k/v/o, FiLM, cross-attention and FFN: once each
    # two plain forwards prepare each layer twice
    assert all(m.prepared == 3 for m in lins.values())


def test_nested_holds_release_once():
    lin = CountingLinear(torch.nn.Linear(4, 4))
    with weights_held(lin):
        held = lin.held
        with weights_held(lin):
            assert lin.held is held  # the inner hold neither resets...
        assert lin.held is held  # ...nor releases the outer one
    assert lin.held is None


def test_layered_refusals_name_the_problem(setup):
    cfg, model, pos, neg, x, y, cam = setup
    t = torch.tensor([870])
    x2 = x.expand(2, *x.shape[1:])
    with torch.no_grad():
        with pytest.raises(ValueError, match="camera tensor with batch 1"):
            model(x2, t, torch.cat([pos, neg]), y, camera=cam.expand(2, -1, -1, -1, -1), layered=True)
        with pytest.raises(ValueError, match="shared_input=True needs layered=True"):
            model(x2, t, torch.cat([pos, neg]), y, camera=cam, shared_input=True)
        kv = [torch.zeros(2, TOKENS, cfg.num_heads, cfg.head_dim) for _ in range(cfg.num_layers)]
        cache = KVCache(kv, [a.clone() for a in kv])
        with pytest.raises(ValueError, match="K/V cache path runs one pass"):
            model(x2, t, torch.cat([pos, neg]), y, camera=cam, layered=True, kv_cache=cache)
    with pytest.raises(ValueError, match="a K/V cache takes one sample"):
        model.blocks[0].forward_layered([x], [None, None], [pos, neg], None, None, torch.float32, kv=object())


@pytest.mark.parametrize("camera", [True, False])
def test_sampling_run_layered_equals_sequential(setup, camera):
    cfg, model, pos, neg, x, y, cam = setup
    torch.manual_seed(9)
    low = WanDiT(cfg).eval()
    noise = make_noise((1, 16, F, H, W), 11)
    runs = {}
    for mode in ("sequential", "layered"):
        s = SamplingSettings(steps=4, boundary=0.9, guide_high=3.0, guide_low=4.0, cfg_mode=mode)
        runs[mode] = sample(ResidentExperts(model, low), noise, pos, neg, y, cam if camera else None, s)
    assert torch.equal(runs["layered"], runs["sequential"])


def test_guide_one_skips_the_uncond_pass_in_layered_mode(setup, monkeypatch):
    cfg, model, pos, neg, x, y, cam = setup
    calls = []
    original = WanDiT.forward

    def spy(self, x, *a, **k):
        calls.append((x.shape[0], k.get("layered", False)))
        return original(self, x, *a, **k)

    monkeypatch.setattr(WanDiT, "forward", spy)
    s = SamplingSettings(steps=2, guide_high=1.0, guide_low=1.0, cfg_mode="layered")
    sample(ResidentExperts(model, model), make_noise((1, 16, F, H, W), 1), pos, neg, y, cam, s)
    assert calls == [(1, False)] * 2
    calls.clear()
    s = SamplingSettings(steps=2, guide_high=2.0, guide_low=2.0, cfg_mode="layered")
    sample(ResidentExperts(model, model), make_noise((1, 16, F, H, W), 1), pos, neg, y, cam, s)
    assert calls == [(2, True)] * 2


def test_settings_accept_layered_and_name_the_modes():
    SamplingSettings(cfg_mode="layered").validate()
    with pytest.raises(ValueError, match="auto, batch, layered, sequential"):
        SamplingSettings(cfg_mode="stacked").validate()


# ---- plumbing: CLI, node, parallel layouts -------------------------------------------------------------------
def test_cli_offers_layered_and_maps_it_where_a_layout_decides(caplog):
    import logging

    from lingbot_world.cli import build_parser
    from lingbot_world.parallel.ranks import planned_cfg_mode, sampling_cfg_mode

    assert build_parser().parse_args(["generate", "--cfg-mode", "layered"]).cfg_mode == "layered"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--cfg-mode", "stacked"])
    log = logging.getLogger("test-layered")
    with caplog.at_level(logging.INFO, logger="test-layered"):
        assert planned_cfg_mode("layered", False, False, log) == "layered"  # one process: as asked
        assert not caplog.records
        assert planned_cfg_mode("layered", True, False, log) == "sequential"  # Ulysses ranks
        assert planned_cfg_mode("layered", True, True, log) == "sequential"  # CFG-parallel: one pass per rank
    assert [r.getMessage() for r in caplog.records] == [
        "--cfg-mode layered runs as sequential with --parallel ulysses (each rank: two forwards per step)",
        "--cfg-mode layered does not apply: each rank runs one guidance pass"]
    assert planned_cfg_mode("auto", True, False, log) == "auto"
    # the sampler's mode: auto follows the plan on one process (layered included), the agreement across ranks
    assert sampling_cfg_mode("auto", False, False, "layered", False) == "layered"
    assert sampling_cfg_mode("layered", False, False, "sequential", False) == "layered"
    assert sampling_cfg_mode("auto", True, False, "layered", False) == "sequential"
    assert sampling_cfg_mode("auto", True, False, "batch", True) == "batch"
    assert sampling_cfg_mode("sequential", True, True, "sequential", False) == "sequential"


def test_sampler_node_offers_layered_and_the_plan_names_its_activations():
    from lingbot_world.memory.expert_plan import CFG_MODES as PLANNER_MODES, MemoryPlan
    from lingbot_world.nodes.adapters.memory import activation_bytes
    from lingbot_world.nodes.sampler import LingBotSampler, plan_summary

    widget = LingBotSampler.INPUT_TYPES()["required"]["cfg_mode"]
    assert widget[0] == ["auto", "batch", "layered", "sequential"] and "layered" in widget[1]["tooltip"]
    assert tuple(widget[0]) == PLANNER_MODES
    plan = MemoryPlan("resident", False, None, False, "...", estimates={"activation_bytes_layered": 7,
                                                                      "activation_bytes_sequential": 5},
                      cfg_layered=True)
    assert plan.cfg_mode == "layered" and activation_bytes(plan) == 7
    assert plan_summary(plan, SamplingSettings(steps=4, cfg_mode=plan.cfg_mode), None) == \
        "4 steps, unipc, layered CFG; memory: resident"


# ---- an NF4 expert in bf16 (the real formats): CPU here, CUDA where there is a GPU --------------------------------
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason="needs a CUDA GPU")])])
def test_nf4_bf16_layered_equals_sequential_bit_for_bit(tmp_path, device):
    from lingbot_world.loaders.expert_loader import load_expert
    from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert

    cfg = DiTConfig.tiny(dim=128, ffn_dim=256, num_heads=2, num_layers=2)
    write_official_expert(random_expert_state(cfg, "cpu", seed=4, dtype=torch.bfloat16), cfg, tmp_path,
                          dtype=torch.bfloat16)
    model = load_expert(tmp_path, device=device, mode="nf4", compute_dtype=torch.bfloat16)
    model.set_token_chunk(5)  # several chunks: the held weights serve every chunk of both samples
    g = torch.Generator().manual_seed(2)
    pos, neg = (pad_context([torch.randn(n, cfg.text_dim, generator=g)], cfg.text_len).to(device) for n in (4, 8))
    x, y = torch.randn(1, 16, F, H, W, generator=g).to(device), torch.randn(1, 20, F, H, W, generator=g).to(device)
    cam = torch.randn(1, 384, F, H, W, generator=g).to(device)
    t = torch.tensor([930], device=device)
    with torch.inference_mode():
        ref = _sequential(model, x, t, pos, neg, y, cam)
        got = _layered(model, x, t, pos, neg, y, cam)
    assert torch.isfinite(got).all() and torch.equal(got, ref)


def test_block_swap_streams_each_block_once_per_layered_step(tmp_path):
    """Through the real block-swap provider: the same latent as sequential CFG on resident experts, and each
    streamed block copied to the "device" once per step (sequential copies it twice)."""
    from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
    from lingbot_world.memory.placement import make_provider

    cfg = DiTConfig.tiny(num_layers=4)
    high, low = tmp_path / "high", tmp_path / "low"
    make_random_nf4_expert(cfg, high, device="cpu", seed=11)
    make_random_nf4_expert(cfg, low, device="cpu", seed=12)
    g = torch.Generator().manual_seed(3)
    pos, neg = (pad_context([torch.randn(n, cfg.text_dim, generator=g)], cfg.text_len) for n in (4, 6))
    y, cam = torch.randn(1, 20, 1, 2, 4, generator=g), torch.randn(1, 384, 1, 2, 4, generator=g)
    noise = make_noise((1, 16, 1, 2, 4), 7)

    def run(mode, cfg_mode, **kw):
        with make_provider(mode, high, low, device="cpu", log=lambda s: None, **kw) as prov:
            s = SamplingSettings(steps=3, boundary=0.5, cfg_mode=cfg_mode)  # every step on the high-noise expert
            copies = []
            out = sample(prov, noise, pos, neg, y, cam, s, device="cpu",
                         callback=lambda info: copies.append(prov.swapper.ring.copies) if kw else None)
        return out, copies

    ref, _ = run("resident", "sequential")
    layered, copies_l = run("block_swap", "layered", blocks_on_gpu=1)
    sequential, copies_s = run("block_swap", "sequential", blocks_on_gpu=1)
    assert torch.equal(layered, ref) and torch.equal(sequential, ref)
    steps = [b - a for a, b in zip(copies_l, copies_l[1:])]
    assert steps == [3, 3]  # blocks 1..3 streamed once per step (layered)
    assert [b - a for a, b in zip(copies_s, copies_s[1:])] == [6, 6]  # twice per step (sequential)

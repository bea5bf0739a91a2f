"""Resident GEMM weights (NF4Linear.keep_weight, memory/resident_weights.py): a kept prepared weight is the one a call
would prepare, so every output is the same bit for bit; it goes whenever what it was made from changes (compute mode,
LoRA, a new or moved weight, block swap, an unload); the CUDA graphs re-capture a block whose kept weights were made
again; and the memory plan keeps them where the card has room after everything else (the v2 1.3B on 24 GB, never the
14B there). CPU, bf16 compute (FP8 through its float32 emulation, INT8 through torch's own _int_mm)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
from lingbot_world.memory.block_swap import BlockSwapper
from lingbot_world.memory.fast_planner import cache_vram_spare, plan_fast_memory
from lingbot_world.memory.resident_weights import (RESIDENT_LINEARS, apply_resident_weights, kept_bytes,
                                                   resident_weight_bytes)
from lingbot_world.quant.lora import LinearLora, LowRank, apply_lora
from lingbot_world.quant.nf4 import NF4Linear
from lingbot_world.quant.nf4_format import prepared_weight_bytes
from lingbot_world.speed.block_graphs import block_fingerprint
from lingbot_world.wan.dit.blocks import weights_held
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig
from lingbot_world.wan.sampling.fast_state import FastSettings
from lingbot_world.wan.vae.model import VAEConfig
from lingbot_world.wan.vae.streaming import streaming_decode_bytes
from lingbot_world.wan.vae.tiny import TinyConfig, tiny_decode_bytes
from lingbot_world.world.models import V1_FAST, V2_14B, V2_1_3B
from lingbot_world.world.plan import play_layout, plan_world_memory

MODES = ("bf16", "fp8", "int8", "fp16acc")
KEEP = SimpleNamespace(resident_weights=True)
DROP = SimpleNamespace(resident_weights=False)


# ---- one linear ----------------------------------------------------------------------------------------------------
def _linear(mode: str = "bf16", seed: int = 0, out_f: int = 96, in_f: int = 64) -> NF4Linear:
    g = torch.Generator().manual_seed(seed)
    lin = NF4Linear(in_f, out_f, compute_dtype=torch.bfloat16)
    lin.load_float_weight(torch.randn(out_f, in_f, generator=g) / in_f**0.5)
    lin.bias = torch.nn.Parameter((0.1 * torch.randn(out_f, generator=g)).bfloat16(), requires_grad=False)
    lin.set_compute(mode, min_rows=1)
    return lin


def _x(rows: int = 40, in_f: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, in_f, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _no_preparing(lin: NF4Linear, monkeypatch) -> None:
    def refuse(*a):
        raise AssertionError("prepared again although a kept weight serves")

    monkeypatch.setattr(lin, "_make", refuse)


@pytest.mark.parametrize("mode", MODES)
def test_a_kept_weight_is_what_a_call_prepares_and_serves_every_call(mode, monkeypatch):
    lin = _linear(mode)
    x = _x()
    want = lin(x)
    made = lin._make(*lin._token_key())
    n = lin.keep_weight()
    assert n == prepared_weight_bytes(96, 64, mode, 2) == sum(t.numel() * t.element_size() for t in lin.kept_tensors())
    made = list(made) if isinstance(made, tuple) else [made]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(lin.kept_tensors(), made))
    _no_preparing(lin, monkeypatch)
    assert torch.equal(lin(x), want)
    with weights_held(lin):  # a block phase's hold and release leave it kept
        assert torch.equal(lin(x), want)
    assert torch.equal(lin(x), want) and lin.kept_tensors()
    assert lin.keep_weight() == n  # kept already: nothing made again


def test_gemms_of_another_kind_still_prepare_their_own():
    """FP8 keeps FP8 rows for the token-wise GEMMs; a few-row GEMM (the text rows) runs in bf16 as before."""
    lin = _linear("fp8")
    lin.set_compute("fp8")  # the default 1024 rows
    few = _x(rows=40)
    want = lin(few)
    lin.keep_weight()
    assert lin.kept_tensors()[0].dtype == torch.float8_e4m3fn
    assert torch.equal(lin(few), want) and lin.kept_tensors()[0].dtype == torch.float8_e4m3fn


def test_whatever_changes_the_weight_drops_it():
    x = _x()
    lin = _linear("bf16")
    lin.keep_weight()
    lin.set_compute("fp8", min_rows=1)  # another GEMM mode
    assert lin.kept_tensors() == []
    lin.keep_weight()
    lin.load_float_weight(torch.randn(96, 64) / 8)  # a new weight (a merged LoRA, a reload)
    assert lin.kept_tensors() == []
    lin.keep_weight()
    lin.to("cpu")  # moved (or cast) by .to()
    assert lin.kept_tensors() == []

    # a LoRA that patches the weight: put on, the kept weight goes; kept under it, it is the patched one
    lin = _linear("bf16")
    plain = lin(x)
    lin.keep_weight()
    applied = apply_lora(lin, {"": LinearLora(weight_patches=[lambda w: w * 1.5])})
    assert lin.kept_tensors() == []
    patched = lin(x)
    assert not torch.equal(patched, plain)
    lin.keep_weight()
    assert lin.kept_tensors() and torch.equal(lin(x), patched)
    applied.remove()
    assert lin.kept_tensors() == [] and torch.equal(lin(x), plain)
    # low-rank terms only: the weight is the same, but the hook changed
    lin.keep_weight()
    g = torch.Generator().manual_seed(3)
    apply_lora(lin, {"": LinearLora([LowRank(torch.randn(96, 2, generator=g), torch.randn(2, 64, generator=g), 0.5)])})
    assert lin.kept_tensors() == []


def test_a_weight_moved_without_a_word_is_not_read_from_the_kept_copy():
    lin = _linear("bf16")
    x = _x()
    lin.keep_weight()
    codes = lin.weight.data
    lin.weight.data = torch.zeros_like(codes)  # block swap points the module at other memory
    moved = lin(x)
    assert lin.kept_tensors() == []  # dropped on sight
    fresh = _linear("bf16")
    fresh.weight.data = torch.zeros_like(codes)
    assert torch.equal(moved, fresh(x))


# ---- a whole NF4 causal model ------------------------------------------------------------------------------------
CFG = DiTConfig.tiny(causal=True)
LAT_H, LAT_W = 8, 12  # 24 tokens per latent frame: enough rows for the FP8 / INT8 GEMMs (17+)


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    out = tmp_path_factory.mktemp("resident") / "expert"
    make_random_nf4_expert(CFG, out, device="cpu", seed=5)
    return out


def _model(expert, mode: str = "bf16"):
    model = load_expert(expert, "cpu", compute_dtype=torch.bfloat16)
    for m in model.modules():
        if hasattr(m, "set_compute"):
            m.set_compute(mode, min_rows=1)
    return model


def _play(model, chunks: int = 3) -> list[torch.Tensor]:
    """Causal chunks of 2 latent frames through a windowed K/V cache (it evicts from the second chunk on), each with
    two denoising calls and the context pass."""
    g = torch.Generator().manual_seed(7)
    frames = 2 * chunks
    x = torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g)
    y = torch.randn(1, CFG.in_dim - 16, frames, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g)
    ctx = torch.randn(1, 5, CFG.text_dim, generator=g)
    tokens = LAT_H * LAT_W // 4
    cache = KVCache.allocate(CFG.num_layers, 3 * tokens, CFG.num_heads, CFG.head_dim, evict=True)
    outs = []
    with torch.inference_mode():
        for s in range(0, frames, 2):
            sl = slice(s, s + 2)
            for t in (999, 500, 0):
                outs.append(model(x[:, :, sl], torch.tensor([t]), ctx, y[:, :, sl], camera=cam[:, :, sl],
                                  kv_cache=cache, start_frame=s, cache_final=t == 0))
    return outs


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_kept_weights_give_the_models_outputs_bit_for_bit(expert, mode):
    model = _model(expert, mode)
    want = _play(model)
    kept = apply_resident_weights(model, KEEP)
    assert kept == kept_bytes(model) == resident_weight_bytes(CFG, mode, 2)  # the planner counts what is kept
    for block in model.blocks:
        for name, lin in block.named_modules():
            if isinstance(lin, NF4Linear):
                assert bool(lin.kept_tensors()) == (name in RESIDENT_LINEARS)  # not the text rows' k / v
    assert not any(m.kept_tensors() for n, m in model.named_modules() if isinstance(m, NF4Linear)
                   and not n.startswith("blocks."))
    got = _play(model)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert apply_resident_weights(model, KEEP) == kept  # the next part: nothing made again
    apply_resident_weights(model, DROP)  # a plan without them (another session on the model)
    assert kept_bytes(model) == 0


def test_the_graphs_fingerprint_follows_the_kept_weights(expert):
    model = _model(expert)
    block = model.blocks[0]
    before = block_fingerprint(block)
    apply_resident_weights(model, KEEP)
    kept = block_fingerprint(block)
    assert kept != before  # a graph captured without them prepares the weights itself: not replayed now
    apply_resident_weights(model, KEEP)
    assert block_fingerprint(block) == kept  # kept as they were: the graph replays
    apply_resident_weights(model, DROP)
    assert block_fingerprint(block) == before


def test_block_swap_keeps_none_for_the_blocks_it_streams(expert):
    model = _model(expert)
    apply_resident_weights(model, KEEP)
    swapper = BlockSwapper(model, "cpu", 1, pin=False).install()
    assert kept_bytes(model) == kept_bytes(model.blocks[0])  # the streamed block's went before it moved
    apply_resident_weights(model, KEEP)
    assert kept_bytes(model.blocks[0]) > 0 and kept_bytes(model.blocks[1]) == 0
    swapper.remove(keep_host=True)  # unloaded to host memory: every device cache goes
    assert kept_bytes(model) == 0 and not hasattr(model, "streamed_blocks")


# ---- the session ---------------------------------------------------------------------------------------------------
def test_a_session_keeps_them_as_its_plan_says_and_plays_the_same_frames(demo_ckpt, tmp_path):
    import numpy as np

    from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, open_session

    files = WorldFiles.demo(demo_ckpt)
    settings = WorldSettings(size="64*112", window=6, sink=3,
                             text=TextSettings(device="cpu", cache_dir=tmp_path.parent / "world_text_cache"))
    keys = ["w-8", "a-12", None]

    def play(resident: bool):
        with open_session(files, settings, device="cpu") as s:
            assert not s.placement.plan.resident_weights  # a CPU run keeps none: the plan says so
            s.placement.plan = replace(s.placement.plan, resident_weights=resident)
            s.start("assets/examples/00/image.jpg", "a lake with a lone tree")
            frames = np.concatenate([b.frames for k in keys for b in s.step(k)])
            model, kept = s.model, kept_bytes(s.model)
        return frames, kept, model

    kept_frames, kept, model = play(True)
    assert kept > 0 and kept_bytes(model) == 0  # gone with the session
    plain_frames, none, _ = play(False)
    assert none == 0 and np.array_equal(kept_frames, plain_frames)


# ---- the plan ------------------------------------------------------------------------------------------------------
GiB = 1024**3
CONTEXT_GIB = 0.85  # a card's CUDA context and libraries outside torch (as tests/test_v2_memory.py)


def _plan(entry, h, w, card_gib, decoder, *, window=None, graphs=None, **kw):
    video = FastSettings(h, w, 42, "cuda", "continuable", window=window or entry.play_window, sink=entry.play_sink,
                         recipe=entry.recipe)
    decode = {"vae": streaming_decode_bytes(VAEConfig(), h, w, half=False),
              "tiny": tiny_decode_bytes(TinyConfig(), h, w, 2)}[decoder]
    graphs = entry.dit.dim < 5120 if graphs is None else graphs  # speed.options.graphs_enabled's default on a GPU
    return plan_fast_memory(h, w, entry.dit, play_layout(video), int((card_gib - CONTEXT_GIB) * GiB), 48 * GiB,
                            extra_vram=decode, compute_bytes=2, graphs=graphs, **kw)


def _same_but_kept(on, off) -> None:
    """`on` keeps the GEMM weights, `off` is the same plan without them: everything else as it was, the device total
    grown by their bytes."""
    assert on.resident_weights and not off.resident_weights and on.resident_weight_bytes > 0
    assert on.film_blocks == on.num_layers  # after every block's FiLM: the camera layers run once per chunk
    assert (on.cache, on.cache_layers_on_gpu, on.blocks_on_gpu, on.film_blocks, on.cache_text) == \
        (off.cache, off.cache_layers_on_gpu, off.blocks_on_gpu, off.film_blocks, off.cache_text)
    assert on.estimates["device_bytes"] == off.estimates["device_bytes"] + on.resident_weight_bytes


def _within_card(plan, card_gib) -> None:
    est = plan.estimates
    used = est["device_bytes"] + est["extra_vram"] + est.get("graph_pool_bytes", 0)
    assert used + cache_vram_spare(V2_1_3B.dit) <= est["vram_free"] < card_gib * GiB


def test_the_bytes_per_compute_mode():
    cfg = V2_1_3B.dit
    d, f = cfg.dim, cfg.ffn_dim
    weights = 6 * d * d + 2 * d * f  # q, k, v, o, cross q, o and the FFN: not the text k / v, nor the camera layers
    rows = 7 * d + f
    assert resident_weight_bytes(cfg, "bf16") == cfg.num_layers * 2 * weights == 2_500_853_760
    assert resident_weight_bytes(cfg, "fp16acc") == cfg.num_layers * 2 * weights
    assert resident_weight_bytes(cfg, "fp8") == resident_weight_bytes(cfg, "int8") == cfg.num_layers * (weights + 4 * rows)
    assert resident_weight_bytes(cfg, "fp8", compute_bytes=4) == cfg.num_layers * 4 * weights  # float32: no FP8 GEMMs


def test_the_1_3b_keeps_them_on_a_24_gb_card():
    on = _plan(V2_1_3B, 480, 832, 24, "vae")
    off = _plan(V2_1_3B, 480, 832, 24, "vae", resident_weights=False)
    _same_but_kept(on, off)
    assert on.resident_weight_bytes == resident_weight_bytes(V2_1_3B.dit, "bf16")
    assert "GEMM weights kept in bf16 2.5 GB" in on.reason and "prepared from NF4" not in on.reason
    _within_card(on, 24)
    fp8 = _plan(V2_1_3B, 480, 832, 24, "vae", compute="fp8")
    assert fp8.resident_weights and "GEMM weights kept in FP8 1.3 GB" in fp8.reason


@pytest.mark.parametrize("entry", [V1_FAST, V2_14B], ids=["v1-14b", "v2-14b"])
@pytest.mark.parametrize("compute", ["bf16", "fp8"])
def test_the_14b_never_keeps_them_on_a_24_gb_card(entry, compute):
    on = _plan(entry, 480, 832, 24, "vae", compute=compute)
    off = _plan(entry, 480, 832, 24, "vae", compute=compute, resident_weights=False)
    assert not on.resident_weights and on.resident_weight_bytes == 0
    assert on.estimates["device_bytes"] == off.estimates["device_bytes"]
    assert "GEMM weights are prepared from NF4 at every call" in on.reason


def test_the_1_3b_draft_with_the_tiny_decoder_keeps_fp8_rows_on_a_12_gb_card():
    kw = dict(window=15, kv_fp8=True, compute="fp8")  # the draft preset: its window cap, FP8 cache and GEMMs
    on = _plan(V2_1_3B, 480, 832, 12, "tiny", **kw)
    _same_but_kept(on, _plan(V2_1_3B, 480, 832, 12, "tiny", resident_weights=False, **kw))
    assert on.cache == "gpu" and on.resident_weight_bytes == resident_weight_bytes(V2_1_3B.dit, "fp8")
    _within_card(on, 12)


def test_the_1_3b_at_304x528_on_an_8_gb_card_keeps_fp8_rows_with_draft_only():
    assert not _plan(V2_1_3B, 304, 528, 8, "tiny").resident_weights  # 2.5 GB in bf16: no room
    draft = _plan(V2_1_3B, 304, 528, 8, "tiny", window=15, kv_fp8=True, compute="fp8")
    assert draft.resident_weights
    _within_card(draft, 8)


def test_never_with_block_swap_on_the_cpu_or_for_stored_weights():
    swapped = _plan(V2_14B, 480, 832, 8, "tiny", compute="fp8")
    assert swapped.blocks_on_gpu is not None and not swapped.resident_weights
    video = FastSettings(480, 832, 42, "cuda", "continuable", window=18, sink=6, recipe=V2_1_3B.recipe)
    cpu = plan_fast_memory(480, 832, V2_1_3B.dit, play_layout(video), None, 64 * GiB)
    assert not cpu.resident_weights
    stored = _plan(V2_1_3B, 480, 832, 24, "vae", weights="fp8")  # the GEMMs read the stored weights as they are
    assert not stored.resident_weights and stored.estimates["resident_weight_bytes"] == 0
    assert "GEMM weights" not in stored.reason


def test_the_world_plan_counts_the_speed_plans_gemm_mode():
    """world/plan.py plans a CUDA device's bf16 compute with the GEMM mode it is given (no GPU is touched: the free
    VRAM is given and the decoder left out)."""
    video = FastSettings(480, 832, 42, "cuda", "continuable", window=18, sink=6, recipe=V2_1_3B.recipe)
    kw = dict(vram=int(23 * GiB), stream_decode="off")
    plan, _ = plan_world_memory(V2_1_3B.dit, play_layout(video), torch.device("cuda"), 480, 832, compute="int8", **kw)
    assert plan.resident_weights and "GEMM weights kept in INT8" in plan.reason
    assert plan.resident_weight_bytes == resident_weight_bytes(V2_1_3B.dit, "int8")
    plan, _ = plan_world_memory(V2_1_3B.dit, play_layout(video), torch.device("cuda"), 480, 832,
                                resident_weights=False, **kw)
    assert not plan.resident_weights

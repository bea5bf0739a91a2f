"""`--compute fp16acc` runs the DiT in fp16 end to end (speed/options.apply_speed -> WanDiT.set_compute_dtype).

The CPU refuses fp16acc at resolve time (no CUDA), so these tests apply a hand-made SpeedPlan to a tiny random NF4
causal model loaded as the CLI loads it (FastPlacement: block swap, a K/V cache layer streamed from host RAM): the
NF4 linears take fp16 in and give fp16 out (fp16acc.linear casts nothing), attention sees fp16, the K/V and camera
FiLM caches made after the plan are fp16, the result is close to the float32 model's, and a bf16 plan gives back
the load's dtypes and the load's output bit for bit (no weight was cast)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lingbot_world.memory.fast_planner import plan_fast_memory
from lingbot_world.memory.kv_placement import FastPlacement
from lingbot_world.quant import nf4 as nf4_mod
from lingbot_world.quant.nf4 import NF4Linear
from lingbot_world.speed.options import SpeedPlan, activation_dtype, apply_speed
from lingbot_world.wan.dit import attention as attn
from lingbot_world.wan.dit.film_cache import FilmCache
from lingbot_world.wan.dit.kv_cache import cache_layout

from tests.conftest import load_sibling

_tiny = load_sibling("fast_tiny")
TINY, FSL = _tiny.TINY, _tiny.FSL
FRAMES = 6  # two chunks of the v1 recipe


def plan_for(compute: str) -> SpeedPlan:
    return SpeedPlan(compile="off", compute=compute, attention="sdpa", device="cpu")


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    from lingbot_world.loaders.nf4_writer import make_random_nf4_expert

    path = tmp_path_factory.mktemp("fp16") / "fast"
    make_random_nf4_expert(TINY, path, device="cpu", seed=1)
    return path


@pytest.fixture(autouse=True)
def _fp16acc_on_few_rows(monkeypatch):
    # the tiny model's GEMMs have fewer rows than the low-precision paths' minimum: let fp16acc run on them
    monkeypatch.setattr(NF4Linear, "lowp_min_rows", 1)
    yield
    attn.set_backend("sdpa", torch.device("cpu"))


def placed(expert, load_dtype):
    """A FastPlacement of the tiny expert: block 0 resident, the others block swapped; one K/V cache layer on the
    "device", the others streamed from host RAM (the CPU runs the same schedule with synchronous copies)."""
    layout = cache_layout(FRAMES, FSL)
    plan = plan_fast_memory(32, 48, TINY, layout, 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1)
    fp = FastPlacement(dataclasses.replace(plan, blocks_on_gpu=1), "cpu")
    model = fp.load_model(expert, compute_dtype=load_dtype)
    assert fp.swapper is not None
    return fp, model


def video(fp, model, film=None):
    """The tiny video's latents through a cache made now (after the plan, as the session makes it)."""
    cache = fp.make_cache()
    host = fp.placement.streamer.host
    assert len(host) == TINY.num_layers - 1 and {h.k.dtype for h in host.values()} == {cache.dtype}
    try:
        return cache.dtype, _tiny.fast_latents(model, cache, FRAMES, film=film)
    finally:
        fp.release_cache()


class Seen:
    """Dtypes reaching the NF4 linears, fp16acc's GEMM and attention during a run."""

    def __init__(self, model, monkeypatch):
        self.linears, self.gemms, self.attention = [], [], []
        self.handles = [m.register_forward_hook(self._linear) for m in model.modules() if isinstance(m, NF4Linear)]
        gemm, sdpa = nf4_mod.fp16acc.linear, attn.sdpa

        def spy_gemm(x, w16, bias, out_dtype):
            y = gemm(x, w16, bias, out_dtype)
            self.gemms.append((x.dtype, w16.dtype, out_dtype, y.dtype))
            return y

        def spy_sdpa(q, k, v, *a, **kw):
            self.attention.append((q.dtype, k.dtype, v.dtype))
            return sdpa(q, k, v, *a, **kw)

        monkeypatch.setattr(nf4_mod.fp16acc, "linear", spy_gemm)
        monkeypatch.setattr(attn, "sdpa", spy_sdpa)

    def _linear(self, module, args, out):
        self.linears.append((args[0].dtype, out.dtype))

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("load_dtype", [torch.float32, torch.bfloat16])
def test_fp16acc_runs_the_model_in_fp16_with_no_cast_around_a_gemm(expert, load_dtype, monkeypatch):
    fp, model = placed(expert, load_dtype)
    try:
        plain = {n: p.dtype for n, p in model.named_parameters()}
        apply_speed(model, plan_for("fp16acc"))
        linears = [m for m in model.modules() if isinstance(m, NF4Linear)]
        assert model.dtype_for_compute() == torch.float16
        assert all(m.compute_dtype == torch.float16 and m.compute_mode == "fp16acc" for m in linears)
        # no weight is cast (block swap's flat buffers keep their layout): the small ones are cast where used
        assert {n: p.dtype for n, p in model.named_parameters()} == plain
        seen = Seen(model, monkeypatch)
        film = FilmCache.on_device(TINY.num_layers)
        try:
            cache_dtype, latents = video(fp, model, film)
            stored = [t.dtype for pair in film.stores["device"].values.values() for t in pair]
        finally:
            seen.close()
            film.close()
        assert latents.isfinite().all()
        assert cache_dtype == torch.float16  # the K/V cache, its streamed layers included
        assert stored and set(stored) == {torch.float16}  # the camera FiLM's cached (1 + scale, shift)
        assert len(seen.linears) > 50 and set(seen.linears) == {(torch.float16, torch.float16)}
        # fp16acc's GEMM got fp16 activations and weight and returned fp16 for fp16: nothing to cast
        assert len(seen.gemms) > 50
        assert set(seen.gemms) == {(torch.float16, torch.float16, torch.float16, torch.float16)}
        assert seen.attention and set(seen.attention) == {(torch.float16,) * 3}
    finally:
        fp.close()


def test_fp16_activations_stay_close_to_the_float32_model(expert):
    """The same NF4 weights computing in float32 (the CPU's load dtype) and in fp16: only the activations' rounding
    differs, so the video differs by fp16's precision (a forward closer to float32 than bf16 activations are)."""
    fp, model = placed(expert, torch.float32)
    try:
        _, exact = video(fp, model)
        g = torch.Generator().manual_seed(0)
        x, y, cam = (torch.randn(1, c, 3, _tiny.LH, _tiny.LW, generator=g) for c in (16, 20, 384))
        ctx = torch.randn(1, TINY.text_len, TINY.text_dim, generator=g)
        with torch.no_grad():
            one = model(x, torch.tensor([700]), ctx, y, camera=cam)
            apply_speed(model, plan_for("fp16acc"))
            half = model(x, torch.tensor([700]), ctx, y, camera=cam)
            _, fp16 = video(fp, model)
            model.set_compute_dtype(torch.bfloat16)
            bf16 = model(x, torch.tensor([700]), ctx, y, camera=cam)
    finally:
        fp.close()
    assert one.dtype == half.dtype == torch.float32  # the head is float32 either way
    assert 1e-5 < rel_err(half, one) < 5e-3  # one forward: fp16 rounding (2^-11), not a bug
    assert rel_err(half, one) < rel_err(bf16, one) / 2  # fp16's 3 more mantissa bits: really computed in fp16
    assert 1e-5 < rel_err(fp16, exact) < 2e-2  # two chunks of sampling, K/V cache in fp16


@pytest.mark.parametrize("load_dtype", [torch.float32, torch.bfloat16])
def test_another_plan_restores_the_load_dtype_and_output_bit_for_bit(expert, load_dtype):
    fp, model = placed(expert, load_dtype)
    try:
        apply_speed(model, plan_for("bf16"))
        dtype_before, before = video(fp, model)
        apply_speed(model, plan_for("fp16acc"))
        assert video(fp, model)[0] == torch.float16
        apply_speed(model, plan_for("bf16"))
        dtype_after, after = video(fp, model)
        linears = [m for m in model.modules() if isinstance(m, NF4Linear)]
        assert model.dtype_for_compute() == load_dtype == dtype_before == dtype_after
        assert all(m.compute_dtype == load_dtype and m.compute_mode == "bf16" for m in linears)
        assert torch.equal(after, before)
    finally:
        fp.close()


def test_bf16_norm_gains_meet_fp16_activations_in_fp16():
    """A q/k RMSNorm whose gain stayed bf16 (the load's) gives fp16 for fp16 input, not a float32 product."""
    from lingbot_world.wan.dit.blocks import WanRMSNorm

    norm = WanRMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2, 64))
    norm.to(torch.bfloat16)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    out = norm(x.half())
    assert out.dtype == torch.float16
    assert rel_err(out, norm(x)) < 2e-3  # float32 input: the float32 product


def test_a_bf16_bias_is_cast_once_per_held_phase():
    import torch.nn as nn

    lin = NF4Linear(64, 32, compute_dtype=torch.float16)
    lin.load_float_weight(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) / 8)
    lin.bias = nn.Parameter(torch.linspace(-1, 1, 32).to(torch.bfloat16), requires_grad=False)
    lin.set_compute("fp16acc", min_rows=1)
    x = torch.randn(2, 20, 64, generator=torch.Generator().manual_seed(1)).half()
    with torch.no_grad():
        alone = [lin(x[:, :10]), lin(x[:, 10:])]
        lin.hold_weight()
        held = [lin(x[:, :10]), lin(x[:, 10:])]
        bias16 = lin._held[("bias", torch.float16)]
        lin.release_weight()
    assert all(a.dtype == torch.float16 and torch.equal(a, b) for a, b in zip(alone, held))
    assert bias16.dtype == torch.float16 and torch.equal(bias16.float(), lin.bias.float())


def test_an_fp8_cache_of_an_fp16_model_gives_the_same_video_wherever_its_layers_are(expert):
    """The FP8 K/V cache (draft / fast presets) quantizes fp16 K/V: a layer streamed from RAM as codes gives the bits
    a layer kept on the device holds, as in bf16 (tests/test_kv_fp8.py)."""
    from lingbot_world.loaders.expert_loader import load_expert
    from lingbot_world.wan.dit import kv_fp8

    model = load_expert(expert, "cpu", "nf4")
    apply_speed(model, plan_for("fp16acc"))
    layout = cache_layout(FRAMES, FSL)
    resident = layout.make(TINY.num_layers, TINY.num_heads, TINY.head_dim, dtype=model.dtype_for_compute(),
                           round_kv=kv_fp8.round_fp8)
    assert resident.dtype == torch.float16
    want = _tiny.fast_latents(model, resident, FRAMES)
    for on_device in (0, 1):
        got, stats = _tiny.streamed_latents(model, layout, FRAMES, on_device, dtype=torch.float16, fp8=True)
        assert torch.equal(got, want) and stats["streamed_layers"] == TINY.num_layers - on_device


def test_only_a_model_with_quantized_linears_changes_its_compute_dtype():
    model = _tiny.make_model()  # float32 nn.Linear weights
    with pytest.raises(ValueError, match=r"float linear holding torch.float32 weights"):
        model.set_compute_dtype(torch.float16)
    model.set_compute_dtype(None)  # the load's: nothing to change
    assert model.dtype_for_compute() == torch.float32
    apply_speed(model, plan_for("bf16"))  # every plan but fp16acc keeps the load's dtype
    assert model.compute_dtype is None and model.dtype_for_compute() == torch.float32


def test_the_video_settings_record_the_fp16_cache():
    from lingbot_world.world.plan import cache_dtype

    cpu = torch.device("cpu")
    assert activation_dtype("fp16acc") == torch.float16
    assert all(activation_dtype(c) is None for c in ("bf16", "fp8", "int8"))
    assert cache_dtype("nf4", cpu, plan_for("fp16acc")) == torch.float16
    assert cache_dtype("nf4", cpu, plan_for("bf16")) == cache_dtype("nf4", cpu) == torch.float32
    assert cache_dtype("bf16", cpu, None) == torch.bfloat16


def test_a_state_made_in_bf16_is_not_continued_in_fp16():
    from lingbot_world.wan.sampling.fast_state import FastSettings, StateMismatchError
    from lingbot_world.world.models import V1_FAST

    made = FastSettings(64, 96, 1, "cpu", cache_dtype="bfloat16", recipe=V1_FAST.recipe)
    with pytest.raises(StateMismatchError, match=r"cache_dtype bfloat16, this run uses float16.*--compute"):
        made.check_continue(dataclasses.replace(made, cache_dtype="float16"))

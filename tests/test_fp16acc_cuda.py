"""`--compute fp16acc` on a CUDA GPU: the DiT runs in fp16 end to end (no cast around any GEMM) and stays close to
bf16 compute; its CUDA graphs, compiled phases and cuDNN FP8 attention take fp16. Skipped without a GPU (the CPU
refuses fp16acc; tests/test_fp16_activations.py checks the dtype switch there)."""
from __future__ import annotations

import pytest
import torch

from lingbot_world.world.models import V1_FAST
from tests.conftest import load_sibling

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")
LAT_H, LAT_W = 8, 12  # 4 x 6 = 24 tokens per latent frame, 72 per chunk
V1_RUN = {"schedule": V1_FAST.recipe.schedule(), "chunk_frames": V1_FAST.recipe.chunk_frames}


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    from lingbot_world.quant.nf4 import NF4Linear

    monkeypatch.setattr(NF4Linear, "lowp_min_rows", 1)  # the tiny chunk's rows take fp16acc's GEMM
    yield
    from lingbot_world.wan.dit import attention as attn

    attn.set_backend("sdpa", CUDA)


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def plan(compute: str, **kw):
    from lingbot_world.speed.options import SpeedOptions, resolve_speed

    return resolve_speed(SpeedOptions(compile=kw.pop("compile", "off"), compute=compute,
                                      attention=kw.pop("attention", "sdpa")), CUDA)


def causal_nf4_model(seed=0):
    """A 3-block causal model, 256 wide with head dim 128, NF4 linears and bf16 weights as a CUDA load makes (the
    GPU speed tests' model)."""
    return load_sibling("test_fast_speed_cuda")._causal_nf4_model(seed)


def run(model, cfg, speed, frames=6, window=None, seed=3):
    """(the first model call's output, the latents, the cache dtype) of a FastRun under `speed` (None: the plan
    applied already), the cache made after the plan from the model's compute dtype as the session makes it (same
    seeds and inputs each time)."""
    from lingbot_world.speed.options import apply_speed
    from lingbot_world.wan.dit.kv_cache import cache_layout
    from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator

    if speed is not None:
        apply_speed(model, speed)
    g = torch.Generator(device=CUDA).manual_seed(seed)
    y = torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g, device=CUDA)
    cam = torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g, device=CUDA).bfloat16()
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, device=CUDA).bfloat16()
    layout = cache_layout(frames, (LAT_H // 2) * (LAT_W // 2), window_frames=window, sink_frames=1 if window else 0)
    cache = layout.make(cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype=model.dtype_for_compute(), device=CUDA)
    gen = make_generator(11, "cuda")
    noise = draw(gen, (1, 16, frames, LAT_H, LAT_W), CUDA)
    first = []
    hook = model.register_forward_hook(lambda m, a, out: first.append(out.float()) if not first else None)
    try:
        with torch.inference_mode():
            latent = FastRun(model, noise, ctx, y, cam, cache, gen, **V1_RUN).run()
    finally:
        hook.remove()
    return first[0], latent, cache.dtype


def test_fp16acc_runs_in_fp16_within_5_percent_of_bf16(monkeypatch):
    from lingbot_world.quant import nf4 as nf4_mod
    from lingbot_world.quant.nf4 import NF4Linear

    cfg, model = causal_nf4_model()
    first_bf16, bf16, dtype = run(model, cfg, plan("bf16"))
    assert dtype == torch.bfloat16
    speed = plan("fp16acc")  # before the spy: resolving runs a bf16 test GEMM through fp16acc.linear
    assert speed.compute == "fp16acc"
    seen, gemms = [], []
    gemm = nf4_mod.fp16acc.linear

    def spy(x, w16, bias, out_dtype):
        y = gemm(x, w16, bias, out_dtype)
        gemms.append((x.dtype, out_dtype, y.dtype))
        return y

    monkeypatch.setattr(nf4_mod.fp16acc, "linear", spy)
    hooks = [m.register_forward_hook(lambda m, a, out: seen.append((a[0].dtype, out.dtype)))
             for m in model.modules() if isinstance(m, NF4Linear)]
    try:
        first_fp16, fp16, dtype = run(model, cfg, speed)
    finally:
        for h in hooks:
            h.remove()
    assert dtype == torch.float16 and model.dtype_for_compute() == torch.float16
    assert seen and set(seen) == {(torch.float16, torch.float16)}  # an NF4 linear: fp16 in, fp16 out
    assert gemms and set(gemms) == {(torch.float16,) * 3}  # fp16acc's GEMM casts nothing
    assert torch.isfinite(fp16).all()
    assert 0 < rel_err(first_fp16, first_bf16) <= 0.05  # one forward
    for c in range(0, bf16.shape[2], 3):  # every chunk, through the fp16 cache
        assert rel_err(fp16[:, :, c:c + 3], bf16[:, :, c:c + 3]) <= 0.05
    _, again, dtype = run(model, cfg, plan("bf16"))  # the bf16 plan gives back the bf16 model
    assert dtype == torch.bfloat16 and torch.equal(again, bf16)


def test_fp16_cuda_graphs_replay_the_eager_fp16_blocks(monkeypatch):
    """A rolling window replays the blocks from CUDA graphs whose statics are made after the plan: fp16, the same
    bits as the eager fp16 run."""
    from lingbot_world.speed.options import GRAPHS_ENV

    cfg, model = causal_nf4_model(1)
    monkeypatch.setenv(GRAPHS_ENV, "0")
    _, eager, _ = run(model, cfg, plan("fp16acc"), frames=18, window=6)
    assert model.block_runner is None
    monkeypatch.setenv(GRAPHS_ENV, "1")
    _, graphed, dtype = run(model, cfg, plan("fp16acc"), frames=18, window=6)
    runner = model.block_runner
    assert dtype == torch.float16 and runner is not None and runner.disabled is None and runner.replays > 0
    assert runner.statics.x.dtype == torch.float16
    assert torch.equal(graphed, eager)


def test_fp16_compiled_phases_match_eager():
    from lingbot_world.speed import compile as compile_mod

    if compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = causal_nf4_model(2)
    first_eager, eager, _ = run(model, cfg, plan("fp16acc"))
    compiled = plan("fp16acc", compile="blocks")
    compiled.strict_compile = True
    first_compiled, latents, _ = run(model, cfg, compiled)
    assert rel_err(first_compiled, first_eager) < 1e-3
    assert rel_err(latents, eager) < 1e-2


def test_compile_graphs_builds_the_fp16_phases_at_load(monkeypatch):
    """compile="graphs" (the v2 1.3B's `auto`): the model is fp16 before BlockGraphs.build compiles the graphs'
    phases, so the rolled chunks compile nothing more; the graphs' fp16 results stay within 1e-3 of eager fp16."""
    from lingbot_world.speed import compile as compile_mod
    from lingbot_world.speed.options import GRAPHS_ENV, SpeedPlan, apply_speed

    if compile_mod.unavailable_reason(CUDA):
        pytest.skip(compile_mod.unavailable_reason(CUDA))
    cfg, model = causal_nf4_model(4)
    monkeypatch.setenv(GRAPHS_ENV, "1")
    _, eager, _ = run(model, cfg, SpeedPlan("off", "fp16acc", "sdpa", "cuda"), frames=18, window=6)
    apply_speed(model, SpeedPlan("graphs", "fp16acc", "sdpa", "cuda", strict_compile=True))
    before = compile_mod.STATS.compiling_calls
    _, graphed, dtype = run(model, cfg, None, frames=18, window=6)
    runner = model.block_runner
    assert dtype == torch.float16 and runner.ops is not None and runner.disabled is None
    assert runner.captures == cfg.num_layers and runner.statics.x.dtype == torch.float16
    assert compile_mod.STATS.compiling_calls == before  # built for fp16 at load
    assert rel_err(graphed, eager) < 1e-3


def _fp8_attention_problem():
    from lingbot_world.wan.dit import attention_fp8

    return attention_fp8.unavailable_reason(CUDA) or attention_fp8.probe(CUDA)


def test_fp8_attention_takes_fp16_inputs():
    from lingbot_world.wan.dit import attention_fp8

    problem = _fp8_attention_problem()
    if problem:
        pytest.skip(problem)
    g = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(1, 1508, 4, 128, generator=g, device=CUDA) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).double() for t in (q, k, v)))
    ref = ref.transpose(1, 2)
    kernel = attention_fp8.FP8Attention()
    out16 = kernel(q.half(), k.half(), v.half())
    out_bf16 = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out16.dtype == torch.float16 and torch.isfinite(out16).all()
    # FP8's rounding dominates both (0.058 from float64 with fp16 inputs on an H200): fp16 is no worse than bf16
    assert rel_err(out16, ref) < 0.1 and rel_err(out16, ref) <= 1.1 * rel_err(out_bf16.float(), ref)
    q16 = q.half().contiguous()
    into = kernel(q16, k.half(), v.half(), reuse_q=True)
    assert into.data_ptr() == q16.data_ptr() and torch.equal(into, out16)


def test_fp16acc_with_fp8_attention_stays_close_to_bf16():
    problem = _fp8_attention_problem()
    if problem:
        pytest.skip(problem)
    cfg, model = causal_nf4_model(3)
    g = torch.Generator(device=CUDA).manual_seed(4)
    x = torch.randn(1, 16, 8, LAT_H, LAT_W, generator=g, device=CUDA)  # 192 video tokens, no cache
    y = torch.randn(1, 20, 8, LAT_H, LAT_W, generator=g, device=CUDA)
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g, device=CUDA)
    from lingbot_world.speed.options import apply_speed
    from lingbot_world.wan.dit import attention as attn

    with torch.no_grad():
        apply_speed(model, plan("bf16"))
        ref = model(x, torch.tensor([500.0], device=CUDA), ctx, y)
        apply_speed(model, plan("fp16acc", attention="fp8"))
        out = model(x, torch.tensor([500.0], device=CUDA), ctx, y)
    assert attn.get_backend() == "fp8" and model.dtype_for_compute() == torch.float16
    assert torch.isfinite(out).all() and 0 < rel_err(out, ref) < 0.08

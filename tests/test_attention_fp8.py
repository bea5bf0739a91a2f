"""FP8 self-attention (issue 15): cuDNN's fused FP8 flash attention through cudnn-frontend.

CPU: the per-tensor quantization maths, the option (refused in one line where it cannot run, what `auto` picks),
that only the video self-attention takes it (the text cross-attention stays on SDPA). CUDA (Hopper and newer
with nvidia-cudnn-frontend; skipped otherwise): the kernel against float32 attention, shapes of the base and the
Fast model (queries fewer than keys, a batch of two, slices of a cache), the compiled quantizers, a whole block."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lingbot_world.speed.options import SpeedOptionError, SpeedOptions, resolve_speed
from lingbot_world.wan.dit import attention as attn
from lingbot_world.wan.dit import attention_fp8

CPU = torch.device("cpu")
E4M3_MAX = 448.0


@pytest.fixture(autouse=True)
def _restore_attention():
    yield
    attn.set_backend("sdpa", CPU)
    attn.CHECKS.clear()


def reference_attention(q, k, v):
    """Float64 softmax(q k^T / sqrt(d)) v on [B, L, H, D] tensors, written out."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.double())


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---- the quantization maths (CPU) --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_fills_the_e4m3_range_and_its_descale_inverts_it(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 300, 3, 128, generator=g) * 7.0).to(dtype)
    q8, descale = attention_fp8.quantize(x)
    assert q8.dtype == torch.float8_e4m3fn and q8.shape == x.shape and descale.shape == (1, 1, 1, 1)
    assert descale.dtype == torch.float32
    back = q8.float() * descale.reshape(())
    # the largest magnitude lands at the top of the range; e4m3 keeps 3 mantissa bits: <= 2^-4 relative per value
    assert q8.float().abs().max().item() == pytest.approx(E4M3_MAX, rel=2 ** -4)
    big = x.float().abs() > x.float().abs().max() * 2 ** -6  # normal numbers (subnormals round coarser)
    assert ((back - x.float()).abs()[big] <= x.float().abs()[big] * 2 ** -4 * 1.01).all()
    assert 0.01 < rel_err(back, x.float()) < 0.04  # ~2.5 % rms: FP8's rounding, not a bug and not exactness


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_of_zeros_is_finite(dtype):
    q8, descale = attention_fp8.quantize(torch.zeros(1, 4, 1, 128, dtype=dtype))
    assert torch.isfinite(descale).all() and (q8.float() == 0).all()


def test_an_fp16_tensor_of_tiny_values_keeps_a_finite_scale():
    """448 / amax would overflow fp16 (65504) for amax below 0.0068 (an fp16 model's v): the scale stops there."""
    x = torch.full((1, 4, 1, 128), 1e-4, dtype=torch.float16)
    q8, descale = attention_fp8.quantize(x)
    assert torch.isfinite(descale).all() and torch.isfinite(q8.float()).all()
    assert rel_err(q8.float() * descale.reshape(()), x.float()) < 0.07


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_undoes_the_output_scale(dtype):
    g = torch.Generator().manual_seed(1)
    o = torch.randn(1, 50, 2, 128, generator=g) * 0.3
    scale = torch.tensor([[[[200.0]]]])
    o8 = (o * scale).to(torch.float8_e4m3fn)
    out = attention_fp8.dequantize(o8, scale, dtype=dtype)
    assert out.dtype == dtype
    assert rel_err(out.float(), o) < 0.04
    into = attention_fp8.dequantize(o8, scale, out=torch.empty(o8.shape, dtype=dtype))  # an fp16 q reused
    assert into.dtype == dtype and torch.equal(into, out)


# ---- the option -------------------------------------------------------------------------------------------------
def test_fp8_attention_is_refused_in_one_line_without_a_hopper_gpu():
    assert "CUDA GPU" in attention_fp8.unavailable_reason(CPU)
    with pytest.raises(SpeedOptionError, match=r"^--attention fp8: FP8 attention needs a CUDA GPU; use --attention auto$"):
        resolve_speed(SpeedOptions(attention="fp8"), CPU)


def test_auto_picks_fp8_attention_only_with_fp8_compute(monkeypatch):
    monkeypatch.setattr(attention_fp8, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(attention_fp8, "probe", lambda device: None)
    from lingbot_world.quant import compute as qcompute

    monkeypatch.setattr(qcompute, "unavailable_reason", lambda mode, device: None)
    exact = resolve_speed(SpeedOptions(compute="bf16", attention="auto"), CPU)
    assert exact.attention == "sdpa"  # exact maths unless the user chose approximate compute
    fp8 = resolve_speed(SpeedOptions(compute="fp8", attention="auto"), CPU)
    assert fp8.attention == "fp8" and any(n.startswith("attention auto: fp8") for n in fp8.notes)
    kept = resolve_speed(SpeedOptions(compute="fp8", attention="sdpa"), CPU)
    assert kept.attention == "sdpa"
    monkeypatch.setattr(attention_fp8, "probe", lambda device: "cuDNN FP8 attention failed on a test input (X: y)")
    fallback = resolve_speed(SpeedOptions(compute="fp8", attention="auto"), CPU)
    assert fallback.attention == "sdpa" and any("not FP8 (cuDNN FP8 attention failed" in n for n in fallback.notes)
    with pytest.raises(SpeedOptionError, match="--attention fp8: cuDNN FP8 attention failed"):
        resolve_speed(SpeedOptions(attention="fp8"), CPU)


def _tiny_model_and_inputs(device="cpu", frames=2):
    """A tiny DiT with head dim 128 (what the FP8 kernel takes) and its inputs: 2 x 3 tokens per latent frame."""
    from lingbot_world.wan.dit.model import DiTConfig, WanDiT

    cfg = DiTConfig.tiny(dim=256, num_heads=2, ffn_dim=256, text_dim=16, text_len=8)
    torch.manual_seed(0)
    model = WanDiT(cfg).to(device).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, frames, 4, 6, generator=g).to(device)
    y = torch.randn(1, 20, frames, 4, 6, generator=g).to(device)
    ctx = torch.randn(1, 5, cfg.text_dim, generator=g).to(device)
    return model, (x, torch.tensor([500.0], device=device), ctx, y)


def test_only_the_video_self_attention_takes_the_fp8_kernel(monkeypatch):
    """With the backend on fp8, self_attention goes to the checked FP8 kernel and attention() (the text
    cross-attention) stays on SDPA: one FP8 call per block, with the video tokens as queries and keys."""
    calls = []

    def fake_checked(q, k, v, reuse_q=False):
        calls.append((tuple(q.shape), tuple(k.shape)))
        reused.append(reuse_q)
        return attn.sdpa(q, k, v)

    reused = []
    model, inputs = _tiny_model_and_inputs()
    with torch.no_grad():
        ref = model(*inputs)
        monkeypatch.setattr(attn, "_checked", fake_checked)
        monkeypatch.setattr(attn, "_backend", "fp8")
        monkeypatch.setattr(attn, "_uses_frontend", lambda q: q.shape[-1] == attention_fp8.HEAD_DIM)
        out = model(*inputs)
    assert calls == [((1, 12, 2, 128), (1, 12, 2, 128))] * model.cfg.num_layers
    assert reused == [True] * model.cfg.num_layers  # the block hands over q's buffer for the output
    torch.testing.assert_close(out, ref)


def test_self_attention_falls_back_to_sdpa_where_fp8_cannot_run(monkeypatch):
    monkeypatch.setattr(attn, "_backend", "fp8")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 20, 2, 64, generator=g) for _ in range(3))  # CPU tensors, head dim 64
    torch.testing.assert_close(attn.self_attention(q, k, v), reference_attention(q, k, v).float(),
                               rtol=1e-5, atol=1e-5)


# ---- the kernel (CUDA, Hopper+) ----------------------------------------------------------------------------------
def _fp8_ready() -> bool:
    return torch.cuda.is_available() and attention_fp8.unavailable_reason(torch.device("cuda")) is None


def _qkv(b, lq, lk, heads, spread=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, lq, heads, 128, generator=g, device="cuda", dtype=torch.bfloat16) * spread
    k = torch.randn(b, lk, heads, 128, generator=g, device="cuda", dtype=torch.bfloat16) * spread
    v = torch.randn(b, lk, heads, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    return q, k, v


@pytest.mark.cuda
@pytest.mark.parametrize("b,lq,lk,spread", [(1, 2048, 2048, 1.0), (1, 1508, 4524, 2.5), (2, 700, 1900, 1.0)])
def test_fp8_kernel_against_float_attention(b, lq, lk, spread):
    _skip_without_fp8()
    q, k, v = _qkv(b, lq, lk, 4, spread)
    kernel = attention_fp8.FP8Attention()
    out = kernel(q, k, v)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and torch.isfinite(out).all()
    ref = reference_attention(q, k, v)
    err, err_bf16 = rel_err(out, ref), rel_err(attn.sdpa(q, k, v), ref)
    assert err_bf16 < 5e-3 < err < (0.1 if spread == 1.0 else 0.2)  # FP8's rounding, far from a wrong result
    assert len(kernel.graphs._graphs) == 1
    kernel(q, k, v)
    assert len(kernel.graphs._graphs) == 1  # the graph is reused for the same shapes
    q_copy = q.clone()
    into = kernel(q_copy, k, v, reuse_q=True)  # the output written over q, the caller's spare buffer
    assert into.data_ptr() == q_copy.data_ptr() and torch.equal(into, kernel(q, k, v))


def _skip_without_fp8():
    if not _fp8_ready():
        pytest.skip("needs a Hopper-or-newer CUDA GPU with nvidia-cudnn-frontend")


@pytest.mark.cuda
def test_fp8_kernel_takes_slices_of_a_cache():
    _skip_without_fp8()
    q, k, v = _qkv(1, 600, 3000, 4, seed=1)
    cache_k = torch.zeros(1, 5000, 4, 128, device="cuda", dtype=torch.bfloat16)
    cache_v = torch.zeros_like(cache_k)
    cache_k[:, 1000:4000], cache_v[:, 1000:4000] = k, v
    kernel = attention_fp8.FP8Attention()
    torch.testing.assert_close(kernel(q, cache_k[:, 1000:4000], cache_v[:, 1000:4000]), kernel(q, k, v))


@pytest.mark.cuda
def test_compiled_quantizers_match_eager():
    _skip_without_fp8()
    from lingbot_world.speed import compile as compile_mod

    q, k, v = _qkv(1, 1024, 1024, 4, seed=2)
    eager = attention_fp8.FP8Attention()
    compiled = attention_fp8.FP8Attention(compile_mod.compiled(attention_fp8.cast, strict=True),
                                          compile_mod.compiled(attention_fp8.dequantize, strict=True))
    assert rel_err(compiled(q, k, v), eager(q, k, v)) < 1e-2


@pytest.mark.cuda
def test_a_model_with_fp8_attention_stays_close_to_sdpa():
    _skip_without_fp8()
    from lingbot_world.speed.options import apply_speed

    model, inputs = _tiny_model_and_inputs("cuda", frames=8)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        attn.set_backend("sdpa", torch.device("cuda"))
        ref = model(*inputs)
        apply_speed(model, resolve_speed(SpeedOptions(compile="off", compute="bf16", attention="fp8"), "cuda"))
        out = model(*inputs)
    assert attn.get_backend() == "fp8" and 0 < attn.CHECKS["fp8"] < attn.FP8_MAX_REL_ERROR
    assert 0 < rel_err(out, ref) < 0.05


# ---- cudnn-frontend's plans and the exact `cudnn` backend --------------------------------------------------------
class _FakeGraph:
    """Stands in for a built cudnn-frontend graph: records which plan ran ("default": execute())."""

    def __init__(self):
        self.ran = []

    def execute(self, variant, workspace, handle=None):
        self.ran.append("default")

    def get_workspace_size_plan_at_index(self, i):
        return 16 * (i + 1)

    def execute_plan_at_index(self, variant, workspace, i, handle=None):
        self.ran.append(i)


def test_the_fastest_plan_is_chosen_once_and_a_failing_one_skipped(monkeypatch):
    from lingbot_world.wan.dit.attention_cudnn import Built

    times = {0: 3.0, 1: RuntimeError("not supported\nmore"), 2: 1.5, 3: 2.0}

    def fake_time(self, variant, handle, i, runs=2):
        if isinstance(times[i], Exception):
            raise times[i]
        return times[i]

    monkeypatch.setattr(Built, "_time", fake_time)
    g = _FakeGraph()
    built = Built(g, {"q": "Q"}, torch.empty(1, dtype=torch.uint8), plans=4)
    built.execute({"q": torch.zeros(1)}, handle=None)
    assert built.plan == 2 and g.ran == [2]
    assert built.plan_ms[1].startswith("RuntimeError: not supported") and built.plan_ms[2] == 1.5
    built.execute({"q": torch.zeros(1)}, handle=None)
    assert g.ran == [2, 2]  # chosen once
    monkeypatch.setenv("LINGBOT_CUDNN_TUNE", "0")
    untuned = Built(_FakeGraph(), {"q": "Q"}, torch.empty(1, dtype=torch.uint8), plans=4)
    untuned.execute({"q": torch.zeros(1)}, handle=None)
    assert untuned.plan == -1 and untuned.plan_ms == {} and untuned.graph.ran == ["default"]
    monkeypatch.delenv("LINGBOT_CUDNN_TUNE")
    times.update({0: RuntimeError("x"), 1: RuntimeError("y"), 2: RuntimeError("z"), 3: RuntimeError("w")})
    none_timed = Built(_FakeGraph(), {"q": "Q"}, torch.empty(1, dtype=torch.uint8), plans=4)
    none_timed.execute({"q": torch.zeros(1)}, handle=None)
    assert none_timed.plan == -1 and none_timed.graph.ran == ["default"]  # cuDNN's own choice still runs


def test_cudnn_attention_is_refused_in_one_line_without_a_gpu():
    with pytest.raises(SpeedOptionError, match=r"^--attention cudnn: cuDNN attention needs a CUDA GPU; "
                                               r"use --attention auto$"):
        resolve_speed(SpeedOptions(attention="cudnn"), CPU)


def test_the_exact_cudnn_backend_takes_the_self_attention_only(monkeypatch):
    calls = []
    monkeypatch.setattr(attn, "_checked", lambda q, k, v, reuse_q=False: calls.append(attn.get_backend()) or attn.sdpa(q, k, v))
    monkeypatch.setattr(attn, "_backend", "cudnn")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 16, 2, 128, generator=g) for _ in range(3))
    attn.attention(q, k, v)
    assert calls == []  # the text cross-attention path: SDPA
    monkeypatch.setattr(attn, "_uses_frontend", lambda q: True)
    attn.self_attention(q, k, v)
    assert calls == ["cudnn"]


@pytest.mark.cuda
def test_cudnn_frontend_attention_is_exact_on_cache_slices():
    from lingbot_world.wan.dit.attention_cudnn import CudnnAttention, unavailable_reason

    if not torch.cuda.is_available() or unavailable_reason(torch.device("cuda")):
        pytest.skip("needs a CUDA GPU with nvidia-cudnn-frontend")
    q, k, v = _qkv(1, 600, 3000, 4, seed=3)
    cache_k = torch.zeros(1, 5000, 4, 128, device="cuda", dtype=torch.bfloat16)
    cache_v = torch.zeros_like(cache_k)
    cache_k[:, 1000:4000], cache_v[:, 1000:4000] = k, v
    kernel = CudnnAttention()
    out = kernel(q, cache_k[:, 1000:4000], cache_v[:, 1000:4000])
    ref = reference_attention(q, k, v)
    assert rel_err(out, ref) < 5e-3  # bf16 rounding, as SDPA
    assert rel_err(kernel(q, k, v), ref) < 5e-3  # contiguous k/v: another graph (other strides), same maths
    report = kernel.graphs.plan_report()
    assert report and all(r["plan"] is not None for r in report.values())


def test_few_queries_over_many_keys_stay_on_sdpa(monkeypatch):
    """A Fast chunk attending to a long cache: quantizing the whole cache would cost more than FP8 saves."""
    calls = []
    monkeypatch.setattr(attn, "_checked", lambda q, k, v, reuse_q=False: calls.append(k.shape[1]) or attn.sdpa(q, k, v))
    monkeypatch.setattr(attn, "_backend", "fp8")
    monkeypatch.setattr(attn, "_uses_frontend", lambda q: True)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 10, 2, 64, generator=g)
    for keys in (10, 40, 41, 200):
        k = v = torch.randn(1, keys, 2, 64, generator=g)
        attn.self_attention(q, k, v)
    assert calls == [10, 40]  # FP8 up to 4 keys per query, SDPA beyond

"""FP8 / INT8 compute of the NF4 linears (issue 15) on the CPU: the quantization maths against their formulas,
the `_scaled_mm` emulation, the int8 GEMM, the NF4Linear compute modes (error bounds, exact few-row layers, the
dequantize step shared by every mode, weights held across chunks)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lingbot_world.quant import fp8, int8
from lingbot_world.quant.nf4 import NF4Linear


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def rows_with_outliers(r: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(r, k, generator=g)
    t[:, 3] *= 30  # an outlier channel, as activations have
    t[2] = 0  # an all-zero row keeps a finite scale
    return t.to(torch.bfloat16)


def test_fp8_rows_follow_the_formula():
    t = rows_with_outliers(8, 64, 0)
    t8, scale = fp8.quantize_rows(t)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (8, 1) and scale.dtype == torch.float32
    amax = t.float().abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(scale[amax > 0], (amax / 448.0)[amax > 0])
    assert torch.isfinite(t8.float()).all() and t8.float().abs().max() <= 448
    assert (t8.float().abs().amax(dim=1)[amax[:, 0] > 0] == 448).all()  # each row's largest value hits the top
    assert (t8[2].float() == 0).all()
    # e4m3 keeps 3 mantissa bits: each value within 2^-4 relative (half a step), plus the subnormal floor.
    back = t8.float() * scale
    assert ((back - t.float()).abs() <= t.float().abs() * 2**-4 + scale * 2**-9).all()


def test_int8_rows_follow_the_formula():
    t = rows_with_outliers(8, 64, 1)
    q, scale = int8.quantize_rows(t)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    amax = t.float().abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(scale[amax > 0], (amax / 127.0)[amax > 0])
    assert ((q.float() * scale - t.float()).abs() <= scale / 2 + 1e-6).all()  # round to nearest


def test_scaled_mm_emulation_is_the_scaled_product():
    x, w = rows_with_outliers(32, 64, 2), rows_with_outliers(48, 64, 3)
    x8, sx = fp8.quantize_rows(x)
    w8, sw = fp8.quantize_weight(w)
    assert sw.shape == (1, 48)
    bias = torch.linspace(-1, 1, 48).to(torch.bfloat16)
    out = fp8.emulated_scaled_mm(x8, w8.t(), sx, sw, bias, torch.bfloat16)
    expected = (x8.double() * sx.double()) @ (w8.double() * sw.t().double()).t() + bias.double()
    assert out.dtype == torch.bfloat16
    assert rel_err(out, expected) < 4e-3  # the bf16 output rounding
    if hasattr(torch, "_scaled_mm"):  # torch's own CPU kernel agrees where this build has one
        try:
            ref = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=torch.bfloat16)
        except (RuntimeError, NotImplementedError):
            return
        assert rel_err(out, ref) < 4e-3


def test_int8_linear_is_exact_integer_maths():
    x, w = rows_with_outliers(32, 64, 4), rows_with_outliers(24, 64, 5)
    w8, sw = int8.quantize_weight(w)
    bias = torch.linspace(-1, 1, 24).to(torch.bfloat16)
    out = int8.linear(x, w8, sw, bias, torch.bfloat16)
    x8, sx = int8.quantize_rows(x)
    expected = (x8.double() @ w8.double().t()) * sx.double() * sw.double() + bias.double()
    assert rel_err(out, expected) < 4e-3
    assert rel_err(out, x.float() @ w.float().t() + bias.float()) < 0.03  # quantization error, bounded


def nf4_layer(out_f=96, in_f=128, seed=0) -> NF4Linear:
    g = torch.Generator().manual_seed(seed)
    lin = NF4Linear(in_f, out_f, compute_dtype=torch.bfloat16)
    lin.load_float_weight(torch.randn(out_f, in_f, generator=g) / in_f**0.5)
    lin.bias = nn.Parameter((0.1 * torch.randn(out_f, generator=g)).to(torch.bfloat16), requires_grad=False)
    return lin


@pytest.mark.parametrize("mode,bound", [("fp8", 0.06), ("int8", 0.02), ("fp16acc", 0.01)])
def test_nf4_linear_compute_modes(mode, bound):
    lin = nf4_layer()
    x = torch.randn(4, 300, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        exact = lin(x)
        lin.set_compute(mode, min_rows=1)
        low = lin(x)
        assert low.dtype == torch.bfloat16 and low.shape == exact.shape
        assert 1e-4 < rel_err(low, exact) < bound  # really the low-precision path, and close
        lin.set_compute(mode, min_rows=10_000)  # few rows (text, time embedding) stay exact
        assert torch.equal(lin(x), exact)
        lin.set_compute("bf16")
        assert torch.equal(lin(x), exact)
    with pytest.raises(ValueError, match="compute mode"):
        lin.set_compute("fp4")


@pytest.mark.parametrize("mode", ["bf16", "fp8", "int8", "fp16acc"])
def test_every_mode_starts_from_the_dequantize_step(mode, monkeypatch):
    # Contract with LoRA (issue 16): a patch of the dequantized weight must reach every compute path.
    lin = nf4_layer(seed=2)
    lin.set_compute(mode, min_rows=1)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        before = lin(x)
        original = NF4Linear.dequantized_weight
        monkeypatch.setattr(NF4Linear, "dequantized_weight", lambda self, dtype=None: 2 * original(self, dtype))
        after = lin(x)
    bias = lin.bias.float()
    assert rel_err(after.float() - bias, 2 * (before.float() - bias)) < 0.02


def test_held_weight_is_prepared_once(monkeypatch):
    lin = nf4_layer(seed=3)
    lin.set_compute("fp8", min_rows=1)
    calls = []
    original = NF4Linear.dequantized_weight
    monkeypatch.setattr(NF4Linear, "dequantized_weight", lambda self, dtype=None: calls.append(1) or original(self, dtype))
    x = torch.randn(3, 40, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        lin.hold_weight()
        chunks = [lin(x[:, i:i + 10]) for i in range(0, 40, 10)]
        lin.release_weight()
        assert len(calls) == 1
        assert lin._held is None  # nothing stays allocated after the phase
        whole = lin(x)
    assert len(calls) == 2
    assert torch.equal(torch.cat(chunks, dim=1), whole)


@pytest.mark.parametrize("mode", ["fp8", "int8"])
def test_an_input_is_quantized_once_for_the_linears_reading_it(mode):
    """Inside quantize_once() (q/k/v, the FiLM's scale/shift) linears share the quantized input; the results are
    the same as quantizing it for each; another input, or outside the scope, is quantized again."""
    from lingbot_world.quant import shared_inputs

    mod = fp8 if mode == "fp8" else int8
    calls = []

    def counting(t):
        calls.append(t.data_ptr())
        return mod.quantize_rows(t)

    layers = [nf4_layer(seed=s) for s in (4, 5, 6)]
    for lin in layers:
        lin.set_compute(mode, min_rows=1, ops={mode: counting})
    g = torch.Generator().manual_seed(4)
    x, other = (torch.randn(2, 30, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        separate = [lin(x) for lin in layers]
        assert len(calls) == 3
        calls.clear()
        with shared_inputs.quantize_once():
            shared = [lin(x) for lin in layers]
            assert len(calls) == 1
            layers[0](other)
            assert len(calls) == 2
        assert shared_inputs._local.memo is None  # nothing kept after the scope
        layers[0](x)
        assert len(calls) == 3
    assert all(torch.equal(a, b) for a, b in zip(shared, separate))


def test_the_compiled_weight_quantizer_is_used_when_given():
    lin = nf4_layer(seed=7)
    used = []

    def weight_quantizer(w):
        used.append(tuple(w.shape))
        return fp8.quantize_weight(w)

    lin.set_compute("fp8", min_rows=1, ops={"fp8_weight": weight_quantizer})
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    with torch.no_grad():
        y = lin(x)
        lin.set_compute("fp8", min_rows=1)
        assert torch.equal(lin(x), y)
    assert used == [(lin.out_features, 128)]


def test_the_gelu_epilogue_is_only_offered_on_a_gpu_with_bf16_gemms(monkeypatch):
    """On the CPU (and for FP8/INT8 compute, or a LoRA adding terms) forward_gelu declines and the block's FFN runs
    the GEMM then the GELU phase, exactly as before; the block asks for it only when its phases do (gelu_in_gemm)."""
    from lingbot_world.wan.dit import blocks, token_ops

    lin = nf4_layer(seed=9)
    x = torch.randn(2, 20, 128, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    with torch.no_grad():
        assert lin.forward_gelu(x) is None
        expected = torch.nn.functional.gelu(lin(x), approximate="tanh")
        assert torch.equal(blocks.linear_gelu(lin, x, token_ops.EAGER), expected)
        assert torch.equal(blocks.linear_gelu(lin, x, token_ops.TokenOps(gelu_in_gemm=True)), expected)  # declined
        monkeypatch.setattr(lin, "forward_gelu", lambda t: torch.zeros(1))
        assert torch.equal(blocks.linear_gelu(lin, x, token_ops.EAGER), expected)  # eager ops never ask
        assert torch.equal(blocks.linear_gelu(lin, x, token_ops.TokenOps(gelu_in_gemm=True)), torch.zeros(1))


def test_compiled_phases_ask_for_the_gelu_epilogue_unless_switched_off(monkeypatch):
    """The eager phases keep the reference's separate GELU (its bits); the compiled ones, which round in another
    order already, take the GEMM's epilogue where it is offered; LINGBOT_GELU_EPILOGUE=0 keeps it a phase."""
    from lingbot_world.speed import options
    from lingbot_world.wan.dit import token_ops

    assert token_ops.EAGER.gelu_in_gemm is False
    monkeypatch.delenv(options.GELU_EPILOGUE_ENV, raising=False)
    assert options.compiled_token_ops().gelu_in_gemm is True
    monkeypatch.setenv(options.GELU_EPILOGUE_ENV, "0")
    assert options.compiled_token_ops().gelu_in_gemm is False

"""NF4 weight -> FP8 / INT8 rows in one pass (quant/nf4_rows.py): the recipe equals bitsandbytes' dequantize
followed by the row quantizer bit for bit, and the NF4 linears use the one-pass op where it is offered. The
Triton kernel itself runs on a GPU only (tests/test_speed_cuda.py checks it against both)."""
import pytest
import torch
import torch.nn as nn

import bitsandbytes.functional as bnbf

from lingbot_world.quant import fp8, int8, nf4_rows
from lingbot_world.quant.nf4 import NF4Linear, quantize_nf4

from tests.conftest import load_sibling

recipe = load_sibling("nf4_recipe")

QUANTIZERS = {"fp8": fp8.quantize_weight, "int8": int8.quantize_weight}


def _weight(out_f, in_f, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    w[1] = 0  # an all-zero row keeps a finite scale
    w[2, 5] = 3.0  # an outlier block
    return w


def _single_level(w):
    """bnb NF4 without double quant: float32 block scales (files may store either)."""
    return bnbf.quantize_4bit(w.to(torch.bfloat16).contiguous(), blocksize=64, compress_statistics=False,
                              quant_type="nf4")


def _equal(a, b):
    return torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                       b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("shape", [(96, 320), (17, 16384 // 64 * 64)])
def test_the_recipe_dequantizes_as_bitsandbytes_then_quantizes_the_rows(kind, dtype, nested, shape):
    packed, state = quantize_nf4(_weight(*shape)) if nested else _single_level(_weight(*shape))
    assert bool(state.nested) is nested
    state.dtype = dtype
    w_bnb = bnbf.dequantize_4bit(packed, state)
    assert w_bnb.dtype == dtype and torch.equal(recipe.dequantized(packed, state, dtype), w_bnb)
    q_ref, s_ref = QUANTIZERS[kind](w_bnb)
    q, s = recipe.reference(packed, state, dtype, kind)
    assert q.dtype == q_ref.dtype and q.shape == shape and s.shape == (1, shape[0])
    assert torch.equal(s, s_ref), f"{(s != s_ref).sum().item()} of {s.numel()} scales differ"
    assert _equal(q, q_ref), "codes differ"


def test_the_kernel_is_not_offered_on_the_cpu_or_when_switched_off(monkeypatch):
    packed, state = quantize_nf4(_weight(64, 128))
    assert not nf4_rows.usable(packed, state, torch.bfloat16)  # a CPU weight: bnb's dequantize + the quantizer
    assert nf4_rows.preferring_kernel("fp8")(packed, state, torch.bfloat16) is None
    assert nf4_rows.unavailable_reason(torch.device("cpu")) is not None
    monkeypatch.setenv("LINGBOT_NF4_ROWS", "0")
    assert not nf4_rows.enabled() and nf4_rows.unavailable_reason() == "LINGBOT_NF4_ROWS=0"


def _layer(seed=0):
    lin = NF4Linear(128, 96, compute_dtype=torch.bfloat16)
    lin.load_float_weight(_weight(96, 128, seed))
    lin.bias = nn.Parameter(torch.linspace(-0.1, 0.1, 96).to(torch.bfloat16), requires_grad=False)
    return lin


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_the_linear_prepares_its_weight_in_one_pass_where_offered(kind):
    lin = _layer()
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    calls = []

    def one_pass(packed, state, dtype):
        calls.append((packed.data_ptr(), dtype))
        return recipe.reference(packed, state, dtype, kind)

    with torch.no_grad():
        lin.set_compute(kind, min_rows=1)
        two_passes = lin(x)
        lin.set_compute(kind, min_rows=1, ops={"nf4_" + kind: one_pass})
        fused = lin(x)
        assert calls == [(lin.weight.data.data_ptr(), torch.bfloat16)]
        lin.hold_weight()
        lin(x[:20]), lin(x[20:])
        lin.release_weight()
        assert len(calls) == 2  # once per held phase, like the two passes
        lin.set_compute(kind, min_rows=1, ops={"nf4_" + kind: lambda *a: None})  # declined: the two passes run
        declined = lin(x)
    assert torch.equal(fused, two_passes) and torch.equal(declined, two_passes)


def test_a_lora_that_patches_the_weight_keeps_the_dequantize_step():
    lin = _layer(seed=2)
    offered = []
    lin.set_compute("fp8", min_rows=1, ops={"nf4_fp8": lambda *a: offered.append(1)})

    class Patching:  # the LoRA hook's contract (quant/lora.py): patches go between dequantize and the GEMM
        patches_weight = True
        up = bias = None

        @staticmethod
        def patch_weight(w):
            return 2 * w

        @staticmethod
        def add_terms(x, y):
            return y

    lin.lora = Patching()
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        patched = lin(x)
        lin.lora = None
        plain = lin(x)
    assert offered == [1]  # asked only without the patch (and declined there: None)
    bias = lin.bias.float()
    rel = ((patched.float() - bias) - 2 * (plain.float() - bias)).norm() / (2 * (plain.float() - bias)).norm()
    assert rel < 0.02


def test_the_speed_plan_offers_the_one_pass_ops():
    from lingbot_world.speed.options import eager_quantizers

    ops = eager_quantizers()
    assert ops["nf4_fp8"].__name__ == "nf4_rows_fp8" and ops["nf4_int8"].__name__ == "nf4_rows_int8"


def test_the_first_result_is_checked_against_the_two_passes_and_a_mismatch_gives_the_kernel_up(monkeypatch):
    """The kernel ran on Hopper in the tests; on another GPU its first result per dtype is compared with bnb's
    dequantize + the row quantizer, and one differing code stops it for the session (the two passes serve)."""
    from lingbot_world.quant.lazy_triton import TritonKernel

    packed, state = quantize_nf4(_weight(64, 128))
    kernel = TritonKernel(lambda: None, "test kernel")
    monkeypatch.setattr(nf4_rows, "KERNEL", kernel)
    monkeypatch.setattr(nf4_rows, "_checked", set())
    monkeypatch.setattr(nf4_rows, "usable", lambda *a: nf4_rows.enabled())  # as on a GPU, until given up
    runs = []

    def exact(p, s, d, k):
        runs.append("exact")
        return recipe.reference(p, s, d, k)

    monkeypatch.setattr(nf4_rows, "prepare", exact)
    fp8_rows = nf4_rows.preferring_kernel("fp8")
    got = fp8_rows(packed, state, torch.bfloat16)
    assert got is not None and ("fp8", torch.bfloat16) in nf4_rows._checked and kernel.failed is None
    assert _equal(got[0], nf4_rows.two_passes(packed, state, torch.bfloat16, "fp8")[0])

    def one_code_off(p, s, d, k):
        runs.append("off")
        q, scale = recipe.reference(p, s, d, k)
        q = q.clone()
        q.view(torch.uint8)[0, 0] ^= 1
        return q, scale

    monkeypatch.setattr(nf4_rows, "prepare", one_code_off)
    int8_rows = nf4_rows.preferring_kernel("int8")
    assert int8_rows(packed, state, torch.bfloat16) is None  # its first int8 result: checked, refused
    assert "differ from bitsandbytes' dequantize" in kernel.failed
    assert fp8_rows(packed, state, torch.bfloat16) is None and runs == ["exact", "off"]  # not tried again

"""Which quantizer the low-precision linears get (speed/options.py, quant/rowwise_triton.py). The kernel itself is
checked bit for bit against the torch quantizers on a GPU (tests/test_speed_cuda.py); here, on the CPU, the torch
quantizers must serve wherever the kernel cannot run."""
from __future__ import annotations

import torch

from lingbot_world.quant import fp8, int8, rowwise_triton
from lingbot_world.speed import options


def test_the_kernel_is_not_used_on_cpu_or_for_layouts_it_does_not_take(monkeypatch):
    x = torch.randn(8, 64)
    assert not rowwise_triton.usable(x)  # a CPU tensor
    assert rowwise_triton.unavailable_reason(torch.device("cpu")) in ("not a CUDA device", "LINGBOT_TRITON_QUANT=0")
    monkeypatch.setenv("LINGBOT_TRITON_QUANT", "0")
    assert rowwise_triton.unavailable_reason() == "LINGBOT_TRITON_QUANT=0" and not rowwise_triton.enabled()


def test_the_quantizers_fall_back_to_torch_with_the_same_results():
    quantizers = options.eager_quantizers()
    x = torch.randn(40, 96, dtype=torch.bfloat16) * 3
    for kind, module in (("fp8", fp8), ("int8", int8)):
        q, s = quantizers[kind](x)
        q_ref, s_ref = module.quantize_rows(x)
        assert torch.equal(s, s_ref) and torch.equal(q.float(), q_ref.float())
        qw, sw = quantizers[f"{kind}_weight"](x)
        qw_ref, sw_ref = module.quantize_weight(x)
        assert sw.shape == (1, 40) and torch.equal(sw, sw_ref) and torch.equal(qw.float(), qw_ref.float())
    assert quantizers["int8_rescale"] is int8.rescale


def test_every_low_precision_linear_of_a_model_shares_one_set_of_quantizers():
    from lingbot_world.quant.nf4 import NF4Linear, replace_linears_with_nf4
    from lingbot_world.wan.dit.model import DiTConfig, WanDiT

    cfg = DiTConfig.tiny()
    model = WanDiT(cfg, device="meta")
    replace_linears_with_nf4(model, cfg.num_layers, torch.bfloat16)
    options.apply_speed(model, options.SpeedPlan(compile="off", compute="fp8", attention="sdpa", device="cpu"))
    ops = {id(m._lowp_ops) for m in model.modules() if isinstance(m, NF4Linear)}
    assert len(ops) == 1  # one dict: quantize_once() shares a quantized input between q, k and v by identity


def test_a_kernel_that_fails_to_build_hands_over_to_torch_for_the_session(monkeypatch, caplog):
    x = torch.randn(6, 32)
    monkeypatch.setattr(rowwise_triton, "usable", lambda t: True)
    monkeypatch.setattr(rowwise_triton.KERNEL, "failed", None)

    def broken(t, kind):
        raise RuntimeError("PTX assembly failed\ndetails")

    monkeypatch.setattr(rowwise_triton, "quantize_rows", broken)
    q, s = rowwise_triton.preferring_kernel("int8", int8.quantize_rows)(x)
    assert torch.equal(q, int8.quantize_rows(x)[0]) and "PTX assembly failed" in caplog.text
    assert rowwise_triton.unavailable_reason() == "the kernel failed here (RuntimeError: PTX assembly failed)"
    assert not rowwise_triton.enabled()


def test_a_lazy_triton_kernel_that_cannot_load_is_none_and_a_failure_is_kept(caplog):
    from lingbot_world.quant.lazy_triton import TritonKernel

    calls = []

    def load():
        calls.append(1)
        raise ImportError("no kernel module")

    k = TritonKernel(load, "test kernel")
    assert k.get() is None and k.get() is None and len(calls) <= 1  # tried once (not at all without Triton)
    assert k.failed is None
    k.give_up(RuntimeError("launch failed\nmore"))
    assert k.failed == "RuntimeError: launch failed" and "the test kernel failed" in caplog.text

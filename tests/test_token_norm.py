"""The compiled phases' LayerNorm kernel (speed/token_norm.py): on the CPU through Triton's interpreter against
LayerNorm written out in float64 here, and the phases it stands in for where it cannot serve (the GPU check is
tests/test_speed_cuda.py, which also checks bf16 outputs: the interpreter casts float32 to bf16 by truncation,
not to nearest like the GPU, so here the outputs are float32 and fp16). Each interpreted check runs in a child:
the interpreter is chosen when Triton is imported."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

CHILD = r"""
import json, torch
from lingbot_world.speed import token_norm
from lingbot_world.wan.dit.blocks import WanLayerNorm

torch.set_grad_enabled(False)

def reference(x, eps, w=None, b=None, round_to=None, shift=None, scale1=None):
    # LayerNorm over the last dim in float64, the affine, the rounding to x's dtype, the modulation
    x = x.double()
    y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    if w is not None:
        y = y * w.double() + b.double()
    if round_to is not None:
        y = y.to(round_to).double()
    if shift is not None:
        y = shift.double() + y * scale1.double()
    return y

def ulps(got, want):
    # |got - want| in units of got's dtype at want's magnitude
    eps = torch.finfo(got.dtype).eps
    scale = torch.clamp(want.abs(), min=torch.finfo(got.dtype).tiny) * eps
    return ((got.double() - want) / scale).abs()

g = torch.Generator().manual_seed(5)
out = {}
# the modulate phase: float32 rows of a longer residual stream (strided), shift a view with stride 6*width
# (unbind of the modulation), scale1 contiguous; out float32, against float64
width = 1536
stream = torch.randn(2, 11, width, generator=g) * 3 + 0.5
x = stream[:, 2:9]
mods = torch.randn(2, 6, 1, width, generator=g)
shift, scale1 = mods[:, 0], 1 + mods[:, 1].contiguous()
norm = WanLayerNorm(width, 1e-6, elementwise_affine=False)
got = torch.empty(2, 7, width, dtype=torch.float32)
token_norm.launch(norm, x, got, shift, scale1)
want = reference(x, 1e-6, shift=shift, scale1=scale1)
out["modulate"] = float((got.double() - want).abs().max() / want.pow(2).mean().sqrt())
# norm3's form: affine, fp16 input (rounded to fp16 after the norm, as WanLayerNorm's .to(x.dtype)), a width that
# is not a power of two, fp16 out: to the last bit but for an output a rounding boundary apart
width = 100
x = (torch.randn(3, 5, width, generator=g) * 2).to(torch.float16)
norm = WanLayerNorm(width, 1e-5, elementwise_affine=True)
with torch.no_grad():
    norm.weight.copy_(torch.randn(width, generator=g))
    norm.bias.copy_(torch.randn(width, generator=g))
got = torch.empty(3, 5, width, dtype=torch.float16)
token_norm.launch(norm, x, got)
u = ulps(got, reference(x, 1e-5, norm.weight, norm.bias, round_to=torch.float16))
out["affine"] = [float(u.max()), float((u > 0.5).float().mean())]
# one shift row broadcast over a batch of 3
shift1 = torch.randn(1, 1, width, generator=g)
scale11 = torch.randn(1, 1, width, generator=g)
norm = WanLayerNorm(width, 1e-6, elementwise_affine=False)
x = x.float()
got = torch.empty(3, 5, width, dtype=torch.float32)
token_norm.launch(norm, x, got, shift1, scale11)
want = reference(x, 1e-6, shift=shift1, scale1=scale11)
out["broadcast"] = float((got.double() - want).abs().max() / want.pow(2).mean().sqrt())
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="needs the triton package (.ci/run installs it; its CPU interpreter runs here)")
def test_the_kernel_is_layer_norm_and_modulation_to_the_last_bit_of_its_output_dtype():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["modulate"] < 1e-5 and found["broadcast"] < 1e-5, found  # float32 against float64
    worst, share_off = found["affine"]  # an fp16 output a rounding boundary apart may land one ulp away
    assert worst <= 1.0 and share_off < 0.02, found


def test_where_the_kernel_cannot_serve_the_phases_are_the_wrapped_ones():
    """On the CPU (and for shapes the kernel does not take) with_fused_norms hands the call to the phases it
    wraps, so the result is theirs bit for bit."""
    from lingbot_world.speed.token_norm import layer_norm_rows, with_fused_norms
    from lingbot_world.wan.dit import token_ops
    from lingbot_world.wan.dit.blocks import WanLayerNorm

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 9, 64, generator=g)
    shift, scale1 = torch.randn(2, 1, 64, generator=g), torch.randn(2, 1, 64, generator=g)
    norm = WanLayerNorm(64, 1e-6, elementwise_affine=False)
    affine = WanLayerNorm(64, 1e-6, elementwise_affine=True)
    assert layer_norm_rows(norm, x, torch.bfloat16, shift, scale1) is None  # a CPU tensor
    ops = with_fused_norms(token_ops.TokenOps(name="wrapped"))
    with torch.no_grad():
        assert torch.equal(ops.modulate(norm, x, shift, scale1, torch.bfloat16),
                           token_ops.modulate(norm, x, shift, scale1, torch.bfloat16))
        assert torch.equal(ops.norm_to(affine, x, torch.bfloat16), token_ops.norm_to(affine, x, torch.bfloat16))
    assert token_ops.EAGER.modulate is token_ops.modulate  # the eager phases are never the kernel's


def test_compiled_phases_take_the_kernel_when_switched_on(monkeypatch):
    from lingbot_world.speed import options

    monkeypatch.delenv(options.TOKEN_NORM_ENV, raising=False)
    assert options.compiled_token_ops().modulate.__name__ != "fused_modulate"  # off until measured in the model
    monkeypatch.setenv(options.TOKEN_NORM_ENV, "1")
    assert options.compiled_token_ops().modulate.__name__ == "fused_modulate"

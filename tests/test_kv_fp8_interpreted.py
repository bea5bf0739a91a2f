"""The FP8 cache's Triton kernels on the CPU, through Triton's interpreter (TRITON_INTERPRET=1): the integer-op
variant an RTX 30xx runs (no hardware e4m3 conversion there) against the torch ops of wan/dit/kv_fp8.py, bit for
bit. The interpreter's own float8 cast is not the hardware's, so the hardware variant is checked on a GPU only
(tests/test_kv_fp8.py). Each check runs in a child: the interpreter is chosen when Triton is imported.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs the triton package (.ci/run installs it; its CPU interpreter runs here)")

CHILD = r"""
import json, torch
import triton
from lingbot_world.speed import kv_fp8_kernel as k
from lingbot_world.wan.dit import kv_fp8

def every_code_and_tie():
    values = torch.arange(256, dtype=torch.uint8).view(kv_fp8.CODE).float()
    values = values[values.isfinite() & (values >= 0)].sort().values
    mids = (values[1:] + values[:-1]) / 2
    probe = torch.cat([values, mids, mids * (1 - 2.0 ** -12), mids * (1 + 2.0 ** -12)])
    probe = torch.cat([probe, -probe])
    rows = probe.numel() // 127 + 1
    x = torch.zeros(rows * 127)
    x[:probe.numel()] = probe
    return torch.cat([x.view(rows, 127), torch.full((rows, 1), 448.0)], dim=1)

def wide_rows(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 128, generator=g) * torch.logspace(-35, 35, 300)[:, None]
    x[0] = 0
    x[1, 0] = 448.0 * 2 ** 5 * (1 + 2 ** -20)
    if dtype == torch.float32:  # the interpreter widens bf16 subnormals wrongly (the GPU test covers them)
        x[2] = 1e-39
    x[3, ::2] *= -1e-6
    return x.to(dtype)

out = {}
for name, x in (("codes", every_code_and_tie()), ("wide_bf16", wide_rows(torch.bfloat16)),
                ("wide_f32", wide_rows(torch.float32))):
    x = x.contiguous()
    rows, d = x.shape
    codes = torch.empty(rows, d, dtype=torch.uint8)
    exps = torch.empty(rows, 1, dtype=torch.int8)
    rounded = torch.empty_like(x)
    grid = (triton.cdiv(rows, 16),)
    k.encode_kernel[grid](x, rounded, codes, exps, rows, d, BLOCK_R=16, BLOCK_D=128, WRITE_OUT=True,
                          WRITE_CODES=True, HW_FP8=False)
    decoded = torch.empty_like(x)
    k.decode_kernel[grid](codes, exps, decoded, rows, d, BLOCK_R=16, BLOCK_D=128, HW_FP8=False)
    want_codes, want_exps = kv_fp8.encode(x)
    want = kv_fp8.round_fp8(x)
    out[name] = {
        "codes": torch.equal(codes, want_codes.view(torch.uint8)),
        "exps": torch.equal(exps, want_exps),
        "rounded": torch.equal(rounded, want) and torch.equal(rounded.signbit(), want.signbit()),
        "decoded": torch.equal(decoded, want) and torch.equal(decoded.signbit(), want.signbit()),
        "negative_zeros": int(((want == 0) & want.signbit()).sum()),
    }
print(json.dumps(out))
"""


def test_the_integer_kernels_give_the_torch_ops_bits_for_every_code_tie_and_scale():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == {"codes", "wide_bf16", "wide_f32"}
    for name, checks in found.items():
        assert checks.pop("negative_zeros") > 0, name  # the sign of a value rounded to zero is kept too
        assert all(checks.values()), (name, checks)

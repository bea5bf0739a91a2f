"""Several GPUs (skipped without two CUDA GPUs): the gloo tests' scenarios over NCCL, the two-GPU CFG of ComfyUI, and
`torchrun ... generate --parallel` on the demo checkpoint.

    python -m pytest tests/test_parallel_cuda.py -q        # on a machine with 2+ GPUs (about a minute)

The tiny models run in float32 here (their weights are float32), so NCCL runs are compared with one GPU to float32
rounding; the demo CLI run computes in bf16 and is compared loosely (the frames of a 4-step noise video).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import load_sibling

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _helpers():
    return load_sibling("dist_launch"), load_sibling("dist_worker")


def _frames(folder: Path) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(f)).astype(np.int16) for f in sorted(folder.glob("frame_*.png"))])


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_nccl_cfg_and_ulysses_equal_one_gpu(tmp_path):
    dl, dw = _helpers()
    out = tmp_path / "r.safetensors"
    with dl.Ranks([[str(Path(__file__).with_name("dist_worker.py")), "cfg,ulysses", str(out), "cuda"]] * 2,
                  tmp_path) as ranks:
        assert ranks.wait(300) == [0, 0], ranks.err(0)[-3000:] + ranks.err(1)[-3000:]
    got = load_file(str(out))
    dev = torch.device("cuda", 0)
    high, low = dw.model(dw.CFG, 1, dev), dw.model(dw.CFG, 2, dev)
    ref = dict(dw.forwards(high))
    ref["sample_batch"] = dw.sampling(high, low, "batch")
    ref["sample_sequential"] = dw.sampling(high, low, "sequential")
    fast = dw.model(dw.FAST, 3, dev)
    for name, kw in dw.FAST_LAYOUTS.items():
        ref[name] = dw.fast_run(fast, dw.FAST.num_heads, **kw)
    for key, value in got.items():
        name = key.split("/", 1)[1]
        assert _rel(value, ref[name].cpu()) <= 1e-4, (key, _rel(value, ref[name].cpu()))


def test_two_gpu_cfg_in_one_process_equals_one_gpu():
    import copy

    from lingbot_world.parallel.local_cfg import TwoDeviceCFG
    from lingbot_world.wan.sampling.sampler import ResidentExperts, SamplingSettings, sample

    _, dw = _helpers()
    a, b = torch.device("cuda", 0), torch.device("cuda", 1)
    high, low = dw.model(dw.CFG, 1, a), dw.model(dw.CFG, 2, a)
    i = dw.inputs(dw.CFG, dw.LAT, seed=1, device=a)
    s = SamplingSettings(steps=4, boundary=0.9, guide_high=5.0, guide_low=3.5, cfg_mode="sequential")
    kw = dict(noise=i["x"], context=i["ctx"], negative_context=i["neg"], y=i["y"], camera=i["camera"], settings=s)
    with torch.inference_mode():
        ref = sample(ResidentExperts(high, low), **kw)
        pair = TwoDeviceCFG(ResidentExperts(high, low),
                            ResidentExperts(copy.deepcopy(high).to(b), copy.deepcopy(low).to(b)), b)
        try:
            got = sample(pair, velocity=pair.velocity, **kw)
        finally:
            pair.close()
    assert _rel(got, ref) <= 1e-5


def test_torchrun_generate_parallel_on_two_gpus(tmp_path):
    from lingbot_world.cli import main
    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint

    demo = tmp_path / "demo"
    build_demo_checkpoint(demo)
    base = ["generate", "--demo", "--demo-dir", str(demo), "--device", "cuda", "--steps", "4", "--seed", "3",
            "--compile", "off"]
    assert main([*base, "--out", str(tmp_path / "one"), "--cfg-mode", "sequential", "--quiet"]) == 0
    one = _frames(tmp_path / "one")
    for mode in ("cfg", "ulysses"):
        out = tmp_path / mode
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               "-m", "lingbot_world.cli", *base, "--out", str(out), "--parallel", mode,
                               "--cfg-mode", "sequential"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        two = _frames(out)
        assert two.shape == one.shape and np.abs(two - one).mean() < 2.0, (mode, np.abs(two - one).mean())

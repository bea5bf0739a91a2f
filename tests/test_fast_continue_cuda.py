"""On a CUDA GPU (skipped without one): the tiny Fast demo continued through a state file equals one run of the
concatenated keys with the cache on the GPU and in pinned host RAM (the park / restore paths of memory/kv_park.py
on a real device, the CUDA generator's state saved and restored)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))]).astype(np.int16)


@pytest.mark.parametrize("kv_cache", ["gpu", "host"])
def test_cuda_chain_equals_one_run(tmp_path_factory, kv_cache):
    d = tmp_path_factory.mktemp(f"fast_cuda_{kv_cache}")

    def gen(*extra, fresh=True):
        # a continuation takes the noise (and the image, size, seed, rule) from its state: --noise only starts
        return main(["generate", "--demo", "--model", "fast", "--demo-dir", str(d / "ckpt"), "--quiet",
                     "--cache-dir", str(d / "text_cache"), "--device", "cuda", "--kv-cache", kv_cache,
                     *(["--noise", "cuda"] if fresh else []), *extra])

    assert gen("--actions", "w-10,l-10,a-12", "--rule", "continuable", "--out", str(d / "one")) == 0
    assert gen("--actions", "w-10,l-10", "--rule", "continuable", "--out", str(d / "p1"),
               "--save-state", str(d / "s1.state")) == 0
    assert gen("--continue-from", str(d / "s1.state"), "--actions", "a-12", "--out", str(d / "p2"),
               "--whole-video", str(d / "whole"), fresh=False) == 0
    one, whole = _frames(d / "one"), _frames(d / "whole")
    assert one.shape == whole.shape and one.shape[0] == 33
    diff = int(np.abs(one - whole).max())
    print(f"\ncuda chain vs one run ({kv_cache} cache): max |diff| {diff} (uint8 frames)")
    assert diff <= 1  # exact on the CPU; GPU kernels may pick other algorithms for other shapes
    assert np.abs(_frames(d / "p2") - whole[21:]).max() <= 1

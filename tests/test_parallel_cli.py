"""`generate --parallel` on the CPU with gloo: real processes started as torchrun starts them (and once by torchrun
itself), the tiny demo checkpoint, against one process; and the bad launches: one clear line on every rank, no
hang (a rank killed mid-run, a rank that stops answering, a rank-specific bad flag, different checkpoints per
rank, an odd head split)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main

from tests.conftest import load_sibling

pytestmark = pytest.mark.slow
TIMEOUT = 240  # seconds for a whole launch on a busy 2-core machine (an idle one needs 10-20)


DL = load_sibling("dist_launch")


@pytest.fixture(scope="module")
def demo(demo_ckpt, demo_text_cache, tmp_path_factory):
    """A private copy of the demo checkpoint (it also holds the tiny Fast model) with its prompt cache."""
    root = tmp_path_factory.mktemp("pdemo") / "ckpt"
    shutil.copytree(demo_ckpt, root)
    return root


def _args(demo: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "--demo", "--demo-dir", str(demo), "--out", str(out), "--cache-dir",
            str(demo / "text_cache"), "--seed", "3", *extra]


def _cli(demo: Path, out: Path, *extra: str) -> list[str]:
    return ["-m", "lingbot_world.cli", *_args(demo, out, *extra)]


def _frames(folder: Path) -> np.ndarray:
    files = sorted(folder.glob("frame_*.png"))
    assert files, f"no frames in {folder}"
    return np.stack([np.asarray(Image.open(f)).astype(np.int16) for f in files])


def _one_process(demo: Path, out: Path, *extra: str) -> np.ndarray:
    assert main(_args(demo, out, "--quiet", *extra)) == 0
    return _frames(out)


def _same_video(a: np.ndarray, b: np.ndarray) -> None:
    # the latents agree to float32 rounding (tests/test_parallel.py); the 8-bit frames are identical or 1 apart
    assert a.shape == b.shape and np.abs(a - b).max() <= 1


# ---- the same video on several ranks -----------------------------------------------------------------------
def test_torchrun_cfg_parallel_writes_the_one_process_video(demo, tmp_path):
    ref = _one_process(demo, tmp_path / "one", "--steps", "4", "--cfg-mode", "sequential")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *_cli(demo, tmp_path / "two", "--steps", "4", "--parallel", "cfg")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CFG-parallel" in proc.stderr and proc.stdout.count("wrote ") == 1  # rank 0 alone writes
    _same_video(_frames(tmp_path / "two"), ref)


@pytest.mark.parametrize("model", ["base", "fast"])
def test_ulysses_writes_the_one_process_video(model, demo, tmp_path):
    extra = ["--steps", "4", "--cfg-mode", "sequential"] if model == "base" else ["--model", "fast", "--frames", "25"]
    ref = _one_process(demo, tmp_path / "one", *extra)
    with DL.Ranks([_cli(demo, tmp_path / "two", *extra, "--parallel", "ulysses")] * 2, tmp_path / "logs") as ranks:
        assert ranks.wait(TIMEOUT) == [0, 0], ranks.err(0)[-3000:] + ranks.err(1)[-3000:]
        assert "Ulysses sequence parallel over 2 ranks" in ranks.err(0)
        assert "wrote" in ranks.out(0) and "wrote" not in ranks.out(1)
    _same_video(_frames(tmp_path / "two"), ref)


# ---- bad launches: one line on every rank, no hang ---------------------------------------------------------------
def _refused(ranks, n: int, code: int, text: str) -> None:
    codes = ranks.wait(TIMEOUT)
    assert codes == [code] * n, [ranks.err(r)[-1500:] for r in range(n)]
    for r in range(n):
        last = ranks.err(r).strip().splitlines()[-1]
        assert f"[rank {r}]" in last and text in last, (r, last)


@pytest.mark.parametrize("model", ["base", "fast"])
def test_an_odd_head_split_is_refused_on_every_rank_before_joining(model, demo, tmp_path):
    """Each rank refuses on its own, before any process group exists: none to tear down (a rank leaving a gloo
    group right after a collective could abort another rank still finishing it: the rare teardown abort)."""
    extra = ["--model", "fast"] if model == "fast" else []
    with DL.Ranks([_cli(demo, tmp_path / "x", *extra, "--parallel", "ulysses")] * 3, tmp_path / "logs") as ranks:
        _refused(ranks, 3, 2, "4 attention heads do not split evenly over 3 ranks; use 2, 4 ranks per pass")
        assert not any("backend" in ranks.err(r) for r in range(3))  # no rank joined a group


def test_a_bad_flag_on_one_rank_is_named_on_every_rank(demo, tmp_path):
    good = _cli(demo, tmp_path / "x", "--steps", "2")
    with DL.Ranks([good, good + ["--frames", "10"]], tmp_path / "logs") as ranks:
        _refused(ranks, 2, 2, "frame count 10")
    assert "rank 1: --frames" in ranks.err(0)


def test_different_checkpoints_per_rank_are_refused(demo, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(demo, other)
    low = other / "low_noise_model_bnb_nf4" / "model.safetensors"
    data = bytearray(low.read_bytes())
    data[-16:] = bytes(16)  # same header and size, different weights
    low.write_bytes(bytes(data))
    with DL.Ranks([_cli(demo, tmp_path / "x", "--steps", "2"), _cli(other, tmp_path / "x", "--steps", "2")],
                  tmp_path / "logs") as ranks:
        _refused(ranks, 2, 2, "the ranks load different low-noise expert files")


def test_different_loras_per_rank_are_refused(demo, tmp_path):
    from safetensors.torch import save_file

    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        save_file({"lora_unet_blocks_0_self_attn_q.lora_down.weight": torch.randn(2, 64, generator=g),
                   "lora_unet_blocks_0_self_attn_q.lora_up.weight": torch.randn(64, 2, generator=g)},
                  str(tmp_path / f"style{seed}.safetensors"))
    (tmp_path / "other").mkdir()
    shutil.copy(tmp_path / "style1.safetensors", tmp_path / "other" / "style0.safetensors")  # same name, other bytes
    first = _cli(demo, tmp_path / "x", "--steps", "2", "--lora", str(tmp_path / "style0.safetensors"))
    second = _cli(demo, tmp_path / "x", "--steps", "2", "--lora", str(tmp_path / "other" / "style0.safetensors"))
    with DL.Ranks([first, second], tmp_path / "logs") as ranks:
        _refused(ranks, 2, 2, "the ranks load different LoRA files: rank 0 has --lora style0.safetensors:1")


def _run_until_sampling(demo, tmp_path, *extra):
    ranks = DL.Ranks([_cli(demo, tmp_path / "x", "--steps", "400", *extra)] * 2, tmp_path / "logs")
    assert ranks.wait_for(0, lambda text: "step 3/400" in text, TIMEOUT), ranks.err(0)[-2000:]
    return ranks


def test_a_rank_killed_mid_run_stops_the_others_at_once(demo, tmp_path):
    with _run_until_sampling(demo, tmp_path) as ranks:
        t0 = time.monotonic()
        ranks.signal(1, signal.SIGKILL)
        code = ranks.wait(TIMEOUT)[0]
        waited = time.monotonic() - t0
        assert code == 1, ranks.err(0)[-2000:]
        last = ranks.err(0).strip().splitlines()[-1]
        assert "another rank stopped or crashed" in last and "[rank 0]" in last
        assert waited < 60  # noticed when the socket closed, not after the timeout


def test_a_rank_that_stops_answering_times_out(demo, tmp_path):
    with _run_until_sampling(demo, tmp_path, "--parallel-timeout", "15") as ranks:
        t0 = time.monotonic()
        ranks.signal(1, signal.SIGSTOP)  # alive but silent: only the timeout can tell
        code = ranks.procs[0].wait(timeout=TIMEOUT)
        waited = time.monotonic() - t0
        assert code == 1, ranks.err(0)[-2000:]
        assert "did not answer within --parallel-timeout" in ranks.err(0).strip().splitlines()[-1]
        assert 10 < waited < 15 + 60


# ---- without torchrun -----------------------------------------------------------------------------------------
def test_parallel_flags_without_torchrun(demo, tmp_path, capsys, monkeypatch):
    assert main(_args(demo, tmp_path / "x", "--parallel", "cfg")) == 2
    assert "needs several processes, one per GPU: launch with torchrun" in capsys.readouterr().err
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    assert main(_args(demo, tmp_path / "x", "--parallel", "off")) == 2
    assert "--parallel is off" in capsys.readouterr().err
    assert main(_args(demo, tmp_path / "x", "--device", "cuda:1")) == 2
    assert "every process takes the GPU of its local rank" in capsys.readouterr().err

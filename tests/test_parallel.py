"""CFG-parallel and Ulysses sequence parallel on the CPU with gloo: N real processes (tests/dist_worker.py, joined
through parallel/group.py as the CLI does) against the same computation in this process.

- 2 ranks: CFG-parallel (sampling) and Ulysses 2 (base forwards with and without camera and with a CFG batch of
  2, the dual-expert sampler batched and sequential, the Fast chunk loop with its K/V cache split by heads: whole
  video, window + sink with evictions, max_attention);
- 4 ranks: CFG x Ulysses 2 (sampling) and Ulysses 4 (everything above).
27 tokens per forward and 18 per Fast chunk: not multiples of 2 or 4, so the padding is exercised. Measured on the
CPU in float32 with one thread per process: CFG-parallel and the base model under Ulysses are bit-identical to one
process, the Fast chunk loop within 1.1e-7 (relative L2; GEMMs over fewer rows round differently).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import load_sibling


def _helpers():
    return load_sibling("dist_launch"), load_sibling("dist_worker")


def _launch(world: int, folder: Path) -> tuple[dict, dict]:
    dl, _ = _helpers()
    out = folder / "results.safetensors"
    worker = str(Path(__file__).with_name("dist_worker.py"))
    with dl.Ranks([[worker, "cfg,ulysses", str(out)]] * world, folder) as ranks:
        codes = ranks.wait(240)
        assert codes == [0] * world, f"ranks exited {codes}:\n{ranks.err(0)[-3000:]}"
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    return load_file(str(out)), meta


@pytest.fixture(scope="module")
def reference() -> dict:
    """The worker's scenarios in this process (one thread, like each rank)."""
    _, dw = _helpers()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        high, low = dw.model(dw.CFG, 1), dw.model(dw.CFG, 2)
        ref = dict(dw.forwards(high))
        ref["sample_batch"] = dw.sampling(high, low, "batch")
        ref["sample_sequential"] = dw.sampling(high, low, "sequential")
        fast = dw.model(dw.FAST, 3)
        for name, kw in dw.FAST_LAYOUTS.items():
            ref[name] = dw.fast_run(fast, dw.FAST.num_heads, **kw)
    finally:
        torch.set_num_threads(threads)
    return ref


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _launch(2, tmp_path_factory.mktemp("ranks2"))


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _launch(4, tmp_path_factory.mktemp("ranks4"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_cfg_parallel_equals_one_process_bit_for_bit(world, two, four, reference):
    results, meta = two if world == 2 else four
    assert json.loads(meta["same_on_every_rank"])
    # 2 ranks: one pass each; 4 ranks: each pass split over 2 ranks (Ulysses) as well
    torch.testing.assert_close(results["cfg/sample_sequential"], reference["sample_sequential"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_base_model_equals_one_process(world, two, four, reference):
    results, _ = two if world == 2 else four
    for name in ("forward", "forward_batch2", "forward_no_camera", "sample_batch", "sample_sequential"):
        got, ref = results[f"ulysses/{name}"], reference[name]
        assert got.shape == ref.shape
        assert _rel(got, ref) <= 1e-6, (name, _rel(got, ref))  # measured: 0 (bit-identical) on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_fast_chunk_loop_with_a_head_split_cache(world, two, four, reference):
    results, _ = two if world == 2 else four
    for name in ("fast", "fast_window", "fast_max_attention", "fast_window_film", "fast_v2_window"):
        got, ref = results[f"ulysses/{name}"], reference[name]
        assert got.shape == ref.shape and torch.isfinite(got).all()
        assert _rel(got, ref) <= 1e-6, (name, _rel(got, ref))  # measured: <= 1.1e-7
    # each rank keeps the camera FiLM of its share of a chunk's tokens: the same bits as computing it every call
    assert torch.equal(results["ulysses/fast_window_film"], results["ulysses/fast_window"])
    assert torch.equal(reference["fast_window_film"], reference["fast_window"])
    # the window and max_attention runs really differ from the whole-video cache (the evictions happened)
    assert _rel(reference["fast_window"], reference["fast"]) > 1e-3
    assert _rel(reference["fast_max_attention"], reference["fast"]) > 1e-3
    assert reference["fast_v2_window"].shape[2] == 12  # three chunks of 4 latent frames

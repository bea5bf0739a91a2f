"""CUDA graphs for the Fast model's blocks (speed/block_graphs.py): when they are used, what they read, and that a
forward through them equals the eager forward.

The real capture needs a GPU (tests/test_speed_cuda.py replays torch.cuda graphs and compares bits). Here a CPU
stand-in "captures" by running the block and "replays" by running the same closure again, on the tensors bound at
capture time, as a graph replays on the addresses it recorded. So these tests check the bookkeeping a graph relies
on: the per-forward inputs copied into the statics every forward, block 0's residual chaining the later blocks, a
changed address recapturing that block, which forwards may use graphs at all, and the eager fallback.
"""
from __future__ import annotations

import logging

import pytest
import torch

from lingbot_world.speed import block_graphs
from lingbot_world.speed.block_graphs import BlockGraphs
from lingbot_world.speed.options import GRAPHS_ENV, graphs_enabled
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

CFG = DiTConfig.tiny(num_layers=3, text_dim=16, text_len=8)
LAT_H, LAT_W = 4, 6
FSL = (LAT_H // 2) * (LAT_W // 2)
STEPS = (999, 947, 825, 0)  # three denoising calls and the context pass, as a chunk runs them


class StandInCapture:
    """Runs the block at capture; a replay runs the recorded closure again and leaves its result in the tensor the
    capture returned (a graph writes its output to the address it recorded)."""

    executes = True

    def __init__(self, fail_at_capture: int | None = None):
        self.calls = 0
        self.fail_at_capture = fail_at_capture

    def capture(self, fn):
        self.calls += 1
        if self.fail_at_capture == self.calls:
            raise RuntimeError("operation not permitted when stream is capturing\nsecond line")
        out = fn()

        def replay():
            res = fn()
            if res.data_ptr() != out.data_ptr():
                out.copy_(res)

        return replay, out


@pytest.fixture
def model(randomise_dit):
    m = WanDiT(CFG).eval()
    randomise_dit(m, torch.Generator().manual_seed(11))
    return m


def video(frames: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g), torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g),
            torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g), torch.randn(1, 5, CFG.text_dim, generator=g))


def window_cache(window_frames: int = 6, sink_frames: int = 0) -> KVCache:
    return KVCache.allocate(CFG.num_layers, window_frames * FSL, CFG.num_heads, CFG.head_dim, dtype=torch.float32,
                            sink_tokens=sink_frames * FSL, evict=True)


def play(model, cache, frames: int = 18, seed: int = 0, between=None, film=None) -> list[torch.Tensor]:
    """Chunk after chunk, each with its denoising calls and the context pass; every model output, in order.
    film: a camera FiLM cache handed to every call (a chunk's calls share one camera tensor, as the sampler's)."""
    x, y, cam, ctx = video(frames, seed)
    outs = []
    with torch.inference_mode():
        for chunk, s in enumerate(range(0, frames, 3)):
            sl = slice(s, s + 3)
            camera = cam[:, :, sl]
            for j, t in enumerate(STEPS):
                outs.append(model(x[:, :, sl] * (1 + j), torch.tensor([t]), ctx, y[:, :, sl], camera=camera,
                                  kv_cache=cache, start_frame=s, cache_final=t == 0,
                                  **({} if film is None else {"film": film})))
            if between is not None:
                between(chunk, cache)
    return outs


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert torch.equal(u, v), f"output {i} differs: max |diff| {(u - v).abs().max().item():.3g}"


def test_graphed_forwards_equal_eager_ones_and_start_once_the_window_is_full(model):
    eager = play(model, window_cache())
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    graphed = play(model, window_cache())
    assert_same(graphed, eager)
    # 6 chunks x 4 calls. Chunks 0 and 1 fill the window (other slots each: eager); from chunk 2 on it rolls and
    # every call has one shape: its first call warms up eagerly, the second captures the 3 blocks, the rest replay.
    assert runner.graphed_forwards == 4 * 4 - 1
    assert runner.captures == CFG.num_layers
    assert runner.replays == (runner.graphed_forwards - 1) * CFG.num_layers


def test_a_video_its_window_covers_never_uses_graphs(model):
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    play(model, window_cache(window_frames=18), frames=18)  # the cache holds the whole video: it never evicts
    assert runner.graphed_forwards == 0 and runner.captures == 0


def test_a_sink_keeps_its_slots_and_graphs_still_match(model):
    eager = play(model, window_cache(window_frames=9, sink_frames=3), frames=21, seed=3)
    model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    assert_same(play(model, window_cache(window_frames=9, sink_frames=3), frames=21, seed=3), eager)
    assert model.block_runner.captures == CFG.num_layers


def test_a_moved_cache_layer_recaptures_that_block_only(model):
    def move_layer_1(chunk, cache):  # a placement re-pointing a layer at another buffer, same contents
        if chunk == 3:
            cache.k[1] = cache.k[1].clone()

    eager = play(model, window_cache(), between=move_layer_1)
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    assert_same(play(model, window_cache(), between=move_layer_1), eager)
    assert runner.captures == CFG.num_layers + 1


def test_a_layer_alternating_between_two_buffers_keeps_a_graph_for_each(model):
    spare = {}

    def alternate_layer_2(chunk, cache):  # what the K/V ring does with an odd number of streamed layers
        other = spare.setdefault(id(cache), torch.empty_like(cache.v[2]))
        other.copy_(cache.v[2])
        spare[id(cache)], cache.v[2] = cache.v[2], other

    eager = play(model, window_cache(), between=alternate_layer_2)
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    assert_same(play(model, window_cache(), between=alternate_layer_2), eager)
    assert runner.captures == CFG.num_layers + 1  # block 2 once per buffer, then every forward replays
    assert len(runner.graphs[2]) == 2 and len(runner.graphs[1]) == 1


def test_moved_weights_recapture_the_block(model):
    def move_block_2(chunk, cache):
        if chunk == 4:
            w = model.blocks[2].ffn[0].weight
            w.data = w.data.clone()

    eager = play(model, window_cache(), between=move_block_2)
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    assert_same(play(model, window_cache(), between=move_block_2), eager)
    assert runner.captures == CFG.num_layers + 1


def test_a_failed_capture_turns_graphs_off_and_the_forward_runs_eagerly(model, caplog):
    eager = play(model, window_cache())
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture(fail_at_capture=2))
    with caplog.at_level(logging.WARNING, logger=block_graphs.__name__):
        assert_same(play(model, window_cache()), eager)
    assert runner.disabled and "capturing block 1 failed: RuntimeError: operation not permitted" in runner.disabled
    assert runner.graphs == {} and runner.graphed_forwards == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "CUDA graphs off for this model" in warnings[0] and "second line" not in warnings[0]


def test_no_graphs_with_grad_a_lora_or_a_batch_of_two(model):
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    x, y, cam, ctx = video(3)
    cache = window_cache(window_frames=3)
    with torch.no_grad():  # warm the text K/V, so only the conditions below keep the graphs away
        model(x, torch.tensor([0]), ctx, y, camera=cam, kv_cache=cache)
    with torch.enable_grad():
        for _ in range(3):
            model(x, torch.tensor([0]), ctx, y, camera=cam, kv_cache=cache)
    assert runner.graphed_forwards == 0
    model.blocks[1].self_attn.q.lora = object()  # anything hung there: its terms are outside the block's tensors
    with torch.inference_mode():
        for _ in range(3):
            model(x, torch.tensor([0]), ctx, y, camera=cam, kv_cache=cache)
    assert runner.graphed_forwards == 0


def test_graphs_are_on_by_default_for_narrow_models_and_switched_by_the_environment(monkeypatch):
    from lingbot_world.world.models import V1_FAST, V2_1_3B

    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    assert not graphs_enabled("cuda:0")  # no model named: off
    assert not graphs_enabled("cuda:0", V1_FAST.dit)  # the 14B: 2-3 % on an H100 for 0.9 GB of VRAM
    assert graphs_enabled("cuda:0", V2_1_3B.dit) and not graphs_enabled("cpu", V2_1_3B.dit)  # the 1.3B: 40 %
    monkeypatch.setenv(GRAPHS_ENV, "1")
    assert graphs_enabled("cuda:0") and graphs_enabled("cuda:0", V1_FAST.dit) and not graphs_enabled("cpu")
    monkeypatch.setenv(GRAPHS_ENV, " True ")  # what people write for a switch
    assert graphs_enabled("cuda:0")
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert not graphs_enabled(torch.device("cuda", 0)) and not graphs_enabled("cuda:0", V2_1_3B.dit)


class CountingOps:
    """Stand-in for the compiled phases (BlockGraphs.ops): the eager functions, counted."""

    def __init__(self):
        from lingbot_world.wan.dit import token_ops

        self.calls = 0
        self.gelu_in_gemm = False  # TokenOps' switch (the epilogue exists on a GPU only)
        for phase in token_ops.PHASES:
            setattr(self, phase, self._counted(getattr(token_ops.EAGER, phase)))

    def _counted(self, fn):
        def call(*args, **kw):
            self.calls += 1
            return fn(*args, **kw)

        return call


def test_the_graphs_own_phases_run_every_rolled_forward_and_none_before(model):
    """compile="graphs": the forwards before the window rolls launch the blocks' own (eager) phases; the first
    forward of the rolled shape runs the graphs' phases uncaptured (so they compile before a capture), and the
    captures record them; every output is the eager one (the stand-in phases are the eager functions)."""
    from lingbot_world.wan.dit import token_ops

    eager = play(model, window_cache())
    ops = CountingOps()
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture(), ops=ops)
    seen = []

    def after_chunk(chunk, cache):
        seen.append(ops.calls)

    graphed = play(model, window_cache(), between=after_chunk)
    assert_same(graphed, eager)
    assert seen[0] == seen[1] == 0  # chunks 0 and 1 fill the window: the blocks' own phases
    assert seen[2] > 0 and all(b.ops is token_ops.EAGER for b in model.blocks)  # handed back after each block
    assert runner.captures == CFG.num_layers and runner.graphed_forwards == 4 * 4 - 1


def test_build_runs_the_graphs_phases_once_at_load_and_leaves_the_model_as_it_was(model):
    """BlockGraphs.build: one small causal forward with the graphs' phases (they compile at load, not at the first
    rolled chunk of a played video), on a scratch cache; the blocks' own phases and the runner are handed back and
    the video is the one without it."""
    from lingbot_world.wan.dit import token_ops

    eager = play(model, window_cache())
    ops = CountingOps()
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture(), ops=ops)
    runner.build(model)
    assert ops.calls > 0 and model.block_runner is runner
    assert all(b.ops is token_ops.EAGER for b in model.blocks)
    assert runner.graphed_forwards == runner.captures == 0
    assert_same(play(model, window_cache()), eager)
    streamed = BlockGraphs("cpu", capture=StandInCapture(), ops=CountingOps())
    model.before_block = lambda i: None  # blocks moved by hooks (block swap): no build
    try:
        streamed.build(model)
    finally:
        model.before_block = None
    assert streamed.ops.calls == 0


def test_a_kept_camera_film_gives_each_block_a_graph_that_keeps_it_and_one_that_reads_it(model):
    """With the camera FiLM kept on the device (its store's tensors the same every chunk), a chunk's first call
    replays a graph that computes and keeps each block's FiLM, its later calls one that reads it: two graphs per
    block, captured once, and the outputs of the run that computes the FiLM at every call, bit for bit. The block
    without a place keeps computing its own from the camera tokens (one graph)."""
    from lingbot_world.wan.dit.film_cache import DeviceFilmStore, FilmCache

    eager = play(model, window_cache())
    store = DeviceFilmStore()
    film = FilmCache(device_blocks=range(CFG.num_layers - 1), device_store=store)
    runner = model.block_runner = BlockGraphs("cpu", capture=StandInCapture())
    graphed = play(model, window_cache(), film=film)
    assert_same(graphed, eager)
    assert runner.disabled is None and runner.graphed_forwards == 4 * 4 - 1
    assert [len(runner.graphs[i]) for i in range(CFG.num_layers)] == [2, 2, 1]
    assert runner.captures == 2 * (CFG.num_layers - 1) + 1
    addresses = {i: (a.data_ptr(), b.data_ptr()) for i, (a, b) in store.values.items()}
    film.close()
    # a given store outlives the cache: the next cache's graphs still replay over the same tensors
    assert {i: (a.data_ptr(), b.data_ptr()) for i, (a, b) in store.values.items()} == addresses

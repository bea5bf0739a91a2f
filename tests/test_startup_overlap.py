"""The Fast run's start-up side by side: the planner (VRAM and RAM, made-up numbers), the K/V cache's host memory
allocated in the background and freed on a thread, the model's load beside the VAE encode, and the CLI giving the
same latents and video with every overlap on or off. Injected errors are reported once, and leave nothing
allocated and no thread running."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.world.model_load import LoadStopped, ModelLoad
from lingbot_world.memory import kv_host_alloc
from lingbot_world.memory.fast_planner import plan_fast_memory
from lingbot_world.memory.kv_placement import FastPlacement
from lingbot_world.memory.kv_host_alloc import HostLayers, KVHostMemoryError, release_host_layers
from lingbot_world.memory.overlap import Step, plan_overlap
from lingbot_world.memory.host_buffer import discard_host_pages
from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.world.models import V1_FAST

GB = 10**9
WORKERS = ("kv-host-alloc", "kv-host-release", "lingbot-model-load")


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(WORKERS)]


@pytest.fixture(autouse=True)
def _no_thread_left():
    yield
    assert _workers() == []


# ---- the planner --------------------------------------------------------------------------------------------------
# 480x832x81 on a 24 GB card (25.2 GB free): the VAE encode's estimate (10.7 GB untiled, 2.5 GB tiled), the NF4 model
ENCODE = Step("encode", int(10.7 * GB), 0)
TILED = Step("encode", int(2.5 * GB), 0)
LOAD = Step("load", int(9.8 * GB), int(9.6 * GB), with_previous=True)
CARD24, CARD16, CHILD = int(25.2 * GB), int(16.6 * GB), int(10.3 * GB)


def test_24gb_a_cached_prompt_encodes_and_loads_at_once():
    plan = plan_overlap(CARD24, 0, [ENCODE, LOAD], headroom=GB)
    assert plan.runs_with_previous("load") and "load at the same time as encode" in plan.reason


def test_24gb_with_the_text_encoder_the_steps_run_beside_it_one_after_the_other():
    plan = plan_overlap(CARD24, CHILD, [ENCODE, LOAD], headroom=GB)
    assert plan.beside == ("encode", "load") and plan.together == ()  # 10.3 + 1 + 10.7 + 9.8 > 25.2
    assert "load after encode" in plan.reason
    tiled = plan_overlap(CARD24, CHILD, [TILED, LOAD], headroom=GB)  # 10.3 + 1 + 2.5 + 9.8 <= 25.2
    assert tiled.beside == ("encode", "load") and tiled.together == ("load",)


def test_16gb_keeps_todays_order():
    plan = plan_overlap(CARD16, CHILD, [ENCODE, LOAD], headroom=GB)
    assert plan.beside == () and plan.together == ()
    assert plan_overlap(CARD16, 0, [ENCODE, LOAD], headroom=GB).together == ()  # 1 + 10.7 + 9.8 > 16.6


def test_a_pair_stays_on_one_side_of_the_text_encoder():
    # the encode fits beside the child, the load only after it: they cannot run at the same time
    plan = plan_overlap(int(20 * GB), CHILD, [TILED, LOAD], headroom=GB)
    assert plan.beside == ("encode",) and plan.together == ()


def test_cpu_runs_and_overlap_off():
    assert plan_overlap(None, 0, [ENCODE, LOAD]).together == ("load",)  # no device budget
    off = plan_overlap(None, 0, [ENCODE, LOAD], allow=False, host_bytes=GB, ram_free=100 * GB)
    assert off.beside == off.together == () and not off.host_early and "--overlap off" in off.reason


def test_host_memory_early_only_when_ram_holds_it_beside_the_text_encoder():
    kw = dict(host_bytes=int(15.4 * GB), child_ram=2 * 1024**3)
    assert plan_overlap(None, 0, [], ram_free=int(21 * GB), **kw).host_early
    late = plan_overlap(None, 0, [], ram_free=int(19 * GB), **kw)
    assert not late.host_early and "after the text encoder (RAM)" in late.reason
    assert not plan_overlap(None, 0, [], ram_free=int(64 * GB)).host_early  # nothing streamed


# ---- host memory in the background ---------------------------------------------------------------------------------
SHAPE = (1, 32, 2, 8)


def test_host_layers_allocate_in_the_background_and_free_on_close():
    hl = HostLayers(SHAPE, torch.float32, range(1, 6), pin=False)
    layers = hl.take()
    assert sorted(layers) == [1, 2, 3, 4, 5] and layers[3].k.shape == SHAPE and hl.seconds >= 0
    hl.close()  # handed over: nothing of it left to free
    assert all(h.k is not None for h in layers.values())
    release_host_layers(list(layers.values())).join()
    assert all(h.k is None and h.buffer.tensor.numel() == 0 for h in layers.values())


def _tracking(monkeypatch, fail_at=None, delay=0.0):
    """_HostLayer that records every instance (and can fail or be slow) so a test can see what stays allocated."""
    made, calls = [], []
    real = kv_host_alloc._HostLayer

    class Tracked(real):
        def __init__(self, *a, **kw):
            calls.append(1)
            if fail_at is not None and len(calls) == fail_at:
                raise RuntimeError("cudaHostRegister failed: out of memory\nsecond line")
            time.sleep(delay)
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(kv_host_alloc, "_HostLayer", Tracked)
    return made


def test_an_allocation_error_is_one_line_and_frees_every_layer(monkeypatch):
    made = _tracking(monkeypatch, fail_at=3)
    hl = HostLayers(SHAPE, torch.float32, range(0, 8), pin=False)
    with pytest.raises(KVHostMemoryError) as err:
        hl.take()
    msg = str(err.value)
    assert "\n" not in msg and "host memory could not be allocated" in msg and "8 layers" in msg
    assert "cudaHostRegister failed: out of memory" in msg
    assert made and all(h.k is None and h.buffer.tensor.numel() == 0 for h in made)
    hl.close()  # idempotent


def test_close_while_allocating_stops_waits_and_frees(monkeypatch):
    made = _tracking(monkeypatch, delay=0.05)
    hl = HostLayers(SHAPE, torch.float32, range(0, 40), pin=False)
    time.sleep(0.06)
    hl.close()  # e.g. Ctrl-C during the VAE encode
    assert 0 < len(made) < 40 and all(h.k is None for h in made)


def test_discarded_pages_read_as_zeros():
    t = torch.ones(8 * 1024 * 1024, dtype=torch.uint8)
    assert discard_host_pages(t)
    inner = t[4096 - t.data_ptr() % 4096:][:4 * 1024 * 1024]
    assert int(inner.sum()) == 0


# ---- the placement: host memory ahead, freed early -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fast_model(demo_ckpt):
    """The demo checkpoint's Fast model (2 layers) and its config."""
    from lingbot_world.loaders.expert_format import detect_format

    path = demo_ckpt / "lingbot_world_fast_bnb_nf4"
    return path, detect_format(path).config


def _host_plan(cfg):
    return plan_fast_memory(32, 48, cfg, cache_layout(9, 6), 1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=0)


def _latents(model, cache, on_chunk=None):
    cfg = model.cfg
    g = torch.Generator().manual_seed(50)
    y = torch.randn(1, 20, 9, 4, 6, generator=g)
    cam = torch.randn(1, 384, 9, 4, 6, generator=g)
    ctx = torch.randn(1, cfg.text_len, cfg.text_dim, generator=g)
    gen = make_generator(3, "cpu")
    device = next(model.parameters()).device
    return FastRun(model, draw(gen, (1, 16, 9, 4, 6), device), ctx.to(device, model.dtype_for_compute()), y, cam,
                   cache, gen, device=device, on_chunk=on_chunk, schedule=V1_FAST.recipe.schedule(),
                   chunk_frames=V1_FAST.recipe.chunk_frames).run().cpu()


@pytest.mark.parametrize("ahead,release_early", [(False, False), (True, True)])
def test_host_memory_ahead_and_freed_early_give_the_same_latents(fast_model, ahead, release_early):
    path, cfg = fast_model
    with FastPlacement(_host_plan(cfg), "cpu") as fp:
        if ahead:
            assert fp.start_host_memory(cfg, torch.float32)
        load = ModelLoad(lambda progress: fp.load_model(path, progress=progress), "cpu")
        model = (load.start() if ahead else load).result()
        cache = fp.make_cache()
        host = list(fp.placement.streamer.host.values())
        assert len(host) == 2 and (fp.host_memory_s is not None) == ahead

        def on_chunk(index, x0):
            if release_early and index == 2:
                fp.release_cache()

        got = _latents(model, cache, on_chunk)
        if release_early:
            assert fp.placement is None  # freed before the run returned; close() joins the thread
    assert all(h.k is None and h.buffer.tensor.numel() == 0 for h in host)
    with FastPlacement(_host_plan(cfg), "cpu") as fp:
        want = _latents(fp.load_model(path), fp.make_cache())
    assert torch.equal(got, want)


def test_host_memory_for_another_dtype_is_dropped_and_allocated_again(fast_model, monkeypatch):
    path, cfg = fast_model
    made = _tracking(monkeypatch)
    with FastPlacement(_host_plan(cfg), "cpu") as fp:
        fp.start_host_memory(cfg, torch.bfloat16)  # the model computes in float32 on the CPU
        fp.load_model(path)
        cache = fp.make_cache()
        assert cache.k[1].dtype == torch.float32
    assert len(made) == 4 and all(h.k is None for h in made)


# ---- the model's load beside the encode -----------------------------------------------------------------------------
def test_a_load_error_on_its_thread_is_raised_once_in_the_caller():
    def fails(progress):
        progress(1, 2)
        raise RuntimeError("bad tensor blocks.3.ffn.0.weight")

    load = ModelLoad(fails, "cpu").start()
    with pytest.raises(RuntimeError, match="bad tensor"):
        load.result()
    load.close()


def test_close_stops_a_running_load_at_its_next_tensor():
    seen, stopped = [], []

    def slow(progress):
        try:
            for i in range(1000):
                time.sleep(0.01)
                progress(i, 1000)
                seen.append(i)
        except LoadStopped:
            stopped.append(True)
            raise
        return "model"

    load = ModelLoad(slow, "cpu").start()
    time.sleep(0.05)
    t = time.monotonic()
    load.close()  # an error or Ctrl-C on the main thread
    assert time.monotonic() - t < 1 and stopped and len(seen) < 100


# ---- the CLI ----------------------------------------------------------------------------------------------------------
def _frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


@pytest.fixture
def cli_host_plan(monkeypatch):
    """The CLI's memory plan with the cache streamed from host memory (a CPU plan keeps it all in RAM), and the
    latents it returns."""
    from lingbot_world.world import assembly
    from lingbot_world.world.plan import session_layout
    from lingbot_world.world.session import WorldSession

    real_plan, real_run = assembly.plan_memory, WorldSession.run_part
    latents = []

    def plan(checked, video, device, settings, *a, latent_frames=0, **kw):
        _, stream = real_plan(checked, video, device, settings, *a, latent_frames=latent_frames, **kw)
        return plan_fast_memory(video.height, video.width, checked.config, session_layout(video, latent_frames),
                                1 << 40, 1 << 40, cache="host", cache_layers_on_gpu=1), stream

    def run_part(self, *a, **kw):
        latent = real_run(self, *a, **kw)
        latents.append(latent)
        return latent

    monkeypatch.setattr(assembly, "plan_memory", plan)
    monkeypatch.setattr(WorldSession, "run_part", run_part)
    return latents


def _run(demo, out, *extra):
    return main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo), "--out", str(out), "--quiet",
                 "--seed", "5", "--frames", "21", "--cache-dir", str(demo / "text_cache"), *extra])


def test_every_overlap_on_or_off_gives_the_same_latents_and_video(demo_ckpt, tmp_path, cli_host_plan, capsys):
    assert _run(demo_ckpt, tmp_path / "off", "--overlap", "off") == 0
    off = capsys.readouterr().out
    assert _run(demo_ckpt, tmp_path / "on") == 0
    on = capsys.readouterr().out
    assert "load (beside the VAE encode)" in on and "K/V host memory (in the background)" in on
    assert "beside" not in off and "finish (last frames written and memory freed)" in off
    assert torch.equal(cli_host_plan[0], cli_host_plan[1])
    assert np.array_equal(_frames(tmp_path / "off"), _frames(tmp_path / "on"))


def test_a_host_memory_error_in_the_background_is_one_line(demo_ckpt, tmp_path, cli_host_plan, monkeypatch, capsys):
    made = _tracking(monkeypatch, fail_at=1)
    assert _run(demo_ckpt, tmp_path / "x") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if "host memory could not be allocated" in line]) == 1
    assert err[-1].startswith("lingbot-world generate: the K/V cache's host memory could not be allocated")
    assert all(h.k is None for h in made)


def test_a_load_error_beside_the_encode_is_one_line(demo_ckpt, tmp_path, monkeypatch, capsys):
    from lingbot_world.memory import kv_placement

    threads = []

    def broken(self, *a, **kw):
        threads.append(threading.current_thread().name)
        raise OSError("read error in lingbot_world_fast_bnb_nf4/model.safetensors")

    monkeypatch.setattr(kv_placement.FastPlacement, "load_model", broken)
    assert _run(demo_ckpt, tmp_path / "x") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert threads == ["lingbot-model-load"]
    assert err[-1] == "lingbot-world generate: read error in lingbot_world_fast_bnb_nf4/model.safetensors"
    assert not (tmp_path / "x").exists()


# ---- CUDA -----------------------------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.cuda
def test_cuda_pinned_host_memory_ahead_load_on_its_stream_and_release(fast_model):
    path, cfg = fast_model
    dev = torch.device("cuda", torch.cuda.current_device())
    with FastPlacement(_host_plan(cfg), dev) as fp:
        want = _latents(fp.load_model(path), fp.make_cache())
    with FastPlacement(_host_plan(cfg), dev) as fp:
        fp.start_host_memory(cfg, torch.bfloat16)
        load = ModelLoad(lambda progress: fp.load_model(path, progress=progress), dev).start()
        vae_like = torch.randn(64, 1024, 1024, device=dev) @ torch.randn(1024, 1024, device=dev)  # work meanwhile
        model = load.result()
        cache = fp.make_cache()
        host = list(fp.placement.streamer.host.values())
        assert all(h.buffer.pinned for h in host)

        def on_chunk(index, x0):
            if index == 2:
                fp.release_cache()

        got = _latents(model, cache, on_chunk)
        del vae_like
    assert all(h.k is None and h.buffer.tensor.numel() == 0 and h.buffer._registered_ptr is None for h in host)
    assert torch.equal(got, want)

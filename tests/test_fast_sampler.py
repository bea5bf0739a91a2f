"""The Fast sampler: frame rounding, the schedule, the chunk loop (spec Fast §2-4), determinism, cancellation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_world.wan.control.camera import camera_condition
from lingbot_world.wan.control.camera_presets import preset_camera
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT
from lingbot_world.wan.sampling.fast_sampler import (
    FastRun, fast_frames, fast_schedule, make_generator, draw, sample_fast)
from lingbot_world.wan.sampling.sampler import Cancelled
from lingbot_world.world.models import V1_FAST

V1_RUN = {"schedule": V1_FAST.recipe.schedule(), "chunk_frames": V1_FAST.recipe.chunk_frames}

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8, causal=True)
LAT_H, LAT_W = 4, 6
FSL = 6


@pytest.mark.parametrize("requested,poses,frames,latent,pose_frames", [
    (81, None, 81, 21, 81), (25, None, 21, 6, 25), (17, None, 9, 3, 17), (83, None, 81, 21, 81),
    (81, 41, 33, 9, 41), (961, None, 957, 240, 961)])
def test_frame_rounding(requested, poses, frames, latent, pose_frames):
    f = fast_frames(requested, poses, chunk=V1_FAST.recipe.chunk_frames)
    assert (f.frames, f.latent_frames, f.pose_frames, f.chunks) == (frames, latent, pose_frames, latent // 3)
    assert (f.note is None) == (frames == requested)
    if f.note:
        assert f"generates {frames} frames" in f.note


def test_frame_rounding_refuses_zero_chunks():
    with pytest.raises(ValueError, match="no complete chunk.*at least 9 frames"):
        fast_frames(5, chunk=V1_FAST.recipe.chunk_frames)
    with pytest.raises(ValueError, match="6 poses, enough for 5 frames.*as many camera poses"):
        fast_frames(81, 6, chunk=V1_FAST.recipe.chunk_frames)
    with pytest.raises(ValueError, match="positive integer"):
        fast_frames(0, chunk=V1_FAST.recipe.chunk_frames)


def test_schedule_indices_and_sigmas_follow_the_spec():
    # the grid written from the spec: s = linspace(0.999, 0, 1001)[:1000], sigma = 10 s / (1 + 9 s), t = int(1000 sigma)
    # sigma_max is the training table's float32 1 - 1/1000, used as a float64 start
    s = np.linspace(float(np.float32(0.999)), 0.0, 1001)[:1000]
    sigma = 10 * s / (1 + 9 * s)
    t = (sigma * 1000).astype(np.int64)
    sch = V1_FAST.recipe.schedule()
    assert sch.timesteps == (999, 978, 947, 825) == tuple(int(t[i]) for i in (0, 179, 358, 679))
    assert sch.x0_indices == (0, 176, 354, 678)
    assert sch.renoise_indices == (177, 355, 679)
    for i, ts in zip(sch.x0_indices, sch.timesteps):
        assert t[i] == ts and (i == 0 or t[i - 1] != ts)
    for i, ts in zip(sch.renoise_indices, sch.timesteps[1:]):
        assert t[i] == ts and t[i - 1] == ts  # the second of two equal entries
    np.testing.assert_allclose(sch.sigma_x0, sigma[list(sch.x0_indices)].astype(np.float32), rtol=0, atol=0)
    np.testing.assert_allclose(sch.sigma_renoise, sigma[list(sch.renoise_indices)].astype(np.float32), rtol=0, atol=0)


def test_fast_camera_resamples_at_non_integer_targets():
    path = preset_camera("dolly_in+pan_right", frames=25)
    plan = fast_frames(25, path.poses.shape[0], chunk=V1_FAST.recipe.chunk_frames)
    cond = camera_condition(path.poses, path.intrinsics, 64, 96, plan.pose_frames, latent_frames=plan.latent_frames)
    assert cond.plucker.shape[2] == plan.latent_frames == 6
    base = camera_condition(path.poses, path.intrinsics, 64, 96, 25)
    assert base.plucker.shape[2] == 7
    torch.testing.assert_close(cond.latent_poses[0], base.latent_poses[0])  # both start at frame 0 ...
    torch.testing.assert_close(cond.latent_poses[-1], base.latent_poses[-1])  # ... and end at frame 24
    assert not torch.allclose(cond.latent_poses[1], base.latent_poses[1])  # target 4.8, not 4


# ---- the loop ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    m = WanDiT(CFG).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 1 / p[0].numel() ** 0.5))
    return m


def problem(latent_frames=6, seed=0):
    g = torch.Generator().manual_seed(100 + seed)
    y = torch.randn(1, 20, latent_frames, LAT_H, LAT_W, generator=g)
    cam = torch.randn(1, 384, latent_frames, LAT_H, LAT_W, generator=g)
    ctx = torch.randn(1, CFG.text_len, CFG.text_dim, generator=g)
    return y, cam, ctx


def cache_for(latent_frames):
    return KVCache.allocate(CFG.num_layers, latent_frames * FSL, CFG.num_heads, CFG.head_dim, dtype=torch.float32)


def spec_loop(model, y, cam, ctx, seed):
    """Spec Fast §4 written out: noise, 4 calls per chunk with x0 / re-noise, the context pass at t = 0."""
    g = torch.Generator().manual_seed(seed)
    f = y.shape[2]
    noise = torch.randn(16, f, LAT_H, LAT_W, generator=g)
    ts, sig_a, sig_b = [999, 978, 947, 825], [0, 176, 354, 678], [177, 355, 679]
    s = np.linspace(0.999, 0, 1001)[:1000]
    sigmas = torch.from_numpy(10 * s / (1 + 9 * s)).float()
    cache = cache_for(f)
    out = []
    with torch.no_grad():
        for c in range(f // 3):
            x = noise[None, :, 3 * c:3 * c + 3]
            args = dict(camera=cam[:, :, 3 * c:3 * c + 3], kv_cache=cache, start_frame=3 * c)
            for i, t in enumerate(ts):
                v = model(x, torch.tensor([t]), ctx, y[:, :, 3 * c:3 * c + 3], **args)
                x0 = (x.double() - sigmas[sig_a[i]].double() * v.double()).float()
                if i < 3:
                    eps = torch.randn(16, 3, LAT_H, LAT_W, generator=g)[None]
                    x = (1 - sigmas[sig_b[i]]) * x0 + sigmas[sig_b[i]] * eps
            model(x0, torch.tensor([0]), ctx, y[:, :, 3 * c:3 * c + 3], **args)
            out.append(x0)
    return torch.cat(out, dim=2)


def run(model, y, cam, ctx, seed, **kw):
    g = make_generator(seed, "cpu")
    noise = draw(g, (1, 16, y.shape[2], LAT_H, LAT_W))
    kw.setdefault("schedule", V1_FAST.recipe.schedule())
    return FastRun(model, noise, ctx, y, cam, cache_for(y.shape[2]), g, chunk_frames=V1_FAST.recipe.chunk_frames, **kw)


def test_chunk_loop_equals_the_spec_loop(model):
    y, cam, ctx = problem()
    steps, chunks = [], []
    r = run(model, y, cam, ctx, 11, callback=steps.append, on_chunk=lambda c, x0: chunks.append((c, x0.shape)))
    latent = r.run()
    torch.testing.assert_close(latent, spec_loop(model, y, cam, ctx, 11), rtol=0, atol=0)
    assert [(s.chunk, s.step, s.timestep) for s in steps] == [(c, i, t) for c in range(2)
                                                              for i, t in enumerate((999, 978, 947, 825))]
    assert [s.index for s in steps] == list(range(8)) and steps[-1].total == 8 and r.model_calls == 10
    assert chunks == [(0, (1, 16, 3, LAT_H, LAT_W)), (1, (1, 16, 3, LAT_H, LAT_W))]
    assert r.done and r.cache.global_end == 6 * FSL


def test_the_last_context_pass_is_skipped_when_nothing_continues_the_video(model):
    """final_context=False: the same latent with one model call less (the last chunk's cache write only feeds a
    continuation)."""
    y, cam, ctx = problem()
    calls = []
    original = model.forward

    def counting(*a, **k):
        calls.append(k.get("cache_final"))
        return original(*a, **k)

    model.forward = counting
    try:
        r = run(model, y, cam, ctx, 11, final_context=False)
        latent = r.run()
    finally:
        del model.forward
    torch.testing.assert_close(latent, spec_loop(model, y, cam, ctx, 11), rtol=0, atol=0)
    assert r.model_calls == 9 and len(calls) == 9 and calls.count(True) == 1  # chunk 0's context pass only


def test_same_seed_same_video_other_seed_other_video(model):
    y, cam, ctx = problem()
    a = run(model, y, cam, ctx, 5).run()
    b = sample_fast(model, *run_args(y, cam, ctx, 5), **V1_RUN)
    c = run(model, y, cam, ctx, 6).run()
    assert torch.equal(a, b) and not torch.allclose(a, c)


def run_args(y, cam, ctx, seed):
    g = make_generator(seed, "cpu")
    noise = draw(g, (1, 16, y.shape[2], LAT_H, LAT_W))
    return noise, ctx, y, cam, cache_for(y.shape[2]), g


def test_stop_after_a_chunk_and_continue(model):
    y, cam, ctx = problem()
    whole = run(model, y, cam, ctx, 9).run()
    r = run(model, y, cam, ctx, 9)
    first = r.next_chunk()
    assert r.chunk == 1 and not r.done
    torch.testing.assert_close(first, whole[:, :, :3], rtol=0, atol=0)
    torch.testing.assert_close(r.run(), whole, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="all 2 chunks are done"):
        r.next_chunk()


def test_cancel_between_model_calls(model):
    y, cam, ctx = problem()
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 7  # the 8th check: chunk 1, step 2

    r = run(model, y, cam, ctx, 1, cancel_check=cancel)
    with pytest.raises(Cancelled):
        r.run()
    assert r.chunk == 1 and len(r.latents) == 1 and r.cache.plan is None


def test_run_checks_its_inputs(model):
    y, cam, ctx = problem()
    g = make_generator(0)
    with pytest.raises(ValueError, match="whole number of 3-frame chunks"):
        FastRun(model, torch.zeros(1, 16, 4, LAT_H, LAT_W), ctx, y[:, :, :4], None, cache_for(4), g, **V1_RUN)
    with pytest.raises(ValueError, match="camera tensor"):
        FastRun(model, torch.zeros(1, 16, 6, LAT_H, LAT_W), ctx, y, cam[:, :, :3], cache_for(6), g, **V1_RUN)
    with pytest.raises(ValueError, match="noise source"):
        make_generator(0, "mps")


# ---- the camera FiLM kept per chunk -------------------------------------------------------------------------------
def _assert_same_run(plain, kept) -> None:
    """Both runs' latents and every layer of their K/V caches, bit for bit."""
    assert torch.equal(plain.run(), kept.run())
    for layer in range(CFG.num_layers):
        assert torch.equal(plain.cache.k[layer], kept.cache.k[layer])
        assert torch.equal(plain.cache.v[layer], kept.cache.v[layer])


@pytest.mark.parametrize("blocks,fold", [(2, False), (1, False), (2, True)])
def test_camera_film_kept_per_chunk_gives_the_same_bits(model, blocks, fold):
    """A chunk's calls share its camera slice: its first call keeps the FiLM, the others read it (a later chunk's
    slice starts over). The latents and the K/V cache equal the run that computes the FiLM at every call."""
    from lingbot_world.wan.dit.film_cache import FilmCache

    y, cam, ctx = problem(9, seed=4)
    plain = run(model, y, cam, ctx, 5, fold_context=fold)
    film = FilmCache(device_blocks=range(blocks))
    kept = run(model, y, cam, ctx, 5, fold_context=fold, film=film)
    _assert_same_run(plain, kept)
    calls = kept.model_calls // kept.chunks  # 4 steps + the context pass; 4 with it folded
    # every chunk's first call fills the cached blocks, its other calls read them; each new chunk restarts it
    assert film.stats["filled"] == blocks * kept.chunks
    assert film.stats["read"] == blocks * kept.chunks * (calls - 1)
    assert film.stats["restarts"] == kept.chunks - 1
    film.close()


@pytest.mark.parametrize("device_blocks,slots,fold", [([0], 1, False), ([], 1, False), ([], 1, True), ([], 2, False)])
def test_camera_film_kept_in_host_ram_gives_the_same_bits(model, device_blocks, slots, fold):
    """Blocks whose FiLM the card has no room for keep it in (pinned) host RAM: written in each chunk's first call,
    streamed back ahead of each block in the others. One store serves every chunk and outlives the cache: its host
    buffers are allocated once, and closing the cache frees only its device buffers (not even those when kept)."""
    from lingbot_world.memory.film_stream import HostFilmStore
    from lingbot_world.wan.dit.film_cache import FilmCache

    y, cam, ctx = problem(9, seed=4)
    plain = run(model, y, cam, ctx, 5, fold_context=fold)
    store = HostFilmStore("cpu", slots=slots, keep_buffers=slots > 1)
    host_blocks = [i for i in range(CFG.num_layers) if i not in device_blocks]
    film = FilmCache(device_blocks=device_blocks, host_blocks=host_blocks, host_store=store, own_host_store=False)
    kept = run(model, y, cam, ctx, 5, fold_context=fold, film=film)
    _assert_same_run(plain, kept)
    calls = kept.model_calls // kept.chunks
    # every call of a chunk but its first streams each host block in; as many as there are buffers stay there
    per_chunk = len(host_blocks) if len(host_blocks) <= slots else len(host_blocks) * (calls - 1)
    assert store.uploads == kept.chunks * per_chunk
    assert store.written_bytes == kept.chunks * store.host_bytes  # written once per chunk
    buffers = dict(store.host)
    film.close()
    assert store.host == buffers and store.host_bytes > 0  # kept for the next cache
    # its device buffers too when it keeps them (the Fast plan's store: planned as the plan's own)
    assert store.staging_bytes == (slots * store.host_bytes // len(host_blocks) if slots > 1 else 0)
    store.close()
    assert store.host_bytes == 0


def test_camera_film_is_ignored_without_a_camera(model):
    from lingbot_world.wan.dit.film_cache import FilmCache

    y, _, ctx = problem(6, seed=6)
    film = FilmCache(device_blocks=range(2))
    assert torch.equal(run(model, y, None, ctx, 2).run(), run(model, y, None, ctx, 2, film=film).run())
    assert film.stats["forwards"] == 0

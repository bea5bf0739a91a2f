"""The Fast chunk loop's draft levers (issue 26): fewer steps and the context pass folded into the last step,
checked against the chunk loop written out by hand; the default loop stays the release's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_world.speed.levers import ChunkLevers
from lingbot_world.wan.dit.kv_cache import KVCache
from lingbot_world.wan.dit.model import DiTConfig, WanDiT
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, fast_schedule, make_generator
from lingbot_world.world.models import V1_FAST

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8, causal=True)
LAT_H, LAT_W = 4, 6
FSL = 6
GRID = np.linspace(0.999, 0, 1001)[:1000]
SIGMAS = torch.from_numpy(10 * GRID / (1 + 9 * GRID)).float()  # shift-10 flow grid
TIMESTEPS = (SIGMAS * 1000).long()  # the grid's timesteps (int of sigma * 1000)


@pytest.fixture(scope="module")
def model():
    m = WanDiT(CFG).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, p in m.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 1 / p[0].numel() ** 0.5))
    return m


def problem(latent_frames=6):
    g = torch.Generator().manual_seed(77)
    return (torch.randn(1, 20, latent_frames, LAT_H, LAT_W, generator=g),
            torch.randn(1, 384, latent_frames, LAT_H, LAT_W, generator=g),
            torch.randn(1, CFG.text_len, CFG.text_dim, generator=g))


def cache_for(latent_frames):
    return KVCache.allocate(CFG.num_layers, latent_frames * FSL, CFG.num_heads, CFG.head_dim, dtype=torch.float32)


def hand_loop(model, y, cam, ctx, seed, timesteps, fold):
    """The chunk loop written out: x0 with the sigma at a timestep's first grid index, re-noise with the sigma at
    its second one; fold: the last step's call writes the cache, no call at t = 0."""
    g = torch.Generator().manual_seed(seed)
    f = y.shape[2]
    noise = torch.randn(16, f, LAT_H, LAT_W, generator=g)
    first = [int((TIMESTEPS == t).nonzero()[0]) for t in timesteps]
    second = [int((TIMESTEPS == t).nonzero()[1]) for t in timesteps[1:]]
    cache = cache_for(f)
    out = []
    with torch.no_grad():
        for c in range(f // 3):
            x = noise[None, :, 3 * c:3 * c + 3]
            kw = dict(camera=cam[:, :, 3 * c:3 * c + 3], kv_cache=cache, start_frame=3 * c)
            for i, t in enumerate(timesteps):
                last = i + 1 == len(timesteps)
                v = model(x, torch.tensor([t]), ctx, y[:, :, 3 * c:3 * c + 3], cache_final=fold and last, **kw)
                x0 = (x.double() - SIGMAS[first[i]].double() * v.double()).float()
                if not last:
                    eps = torch.randn(16, 3, LAT_H, LAT_W, generator=g)[None]
                    x = (1 - SIGMAS[second[i]]) * x0 + SIGMAS[second[i]] * eps
            if not fold:
                model(x0, torch.tensor([0]), ctx, y[:, :, 3 * c:3 * c + 3], **kw)
            out.append(x0)
    return torch.cat(out, dim=2)


def fast_run(model, y, cam, ctx, seed, **kw):
    g = make_generator(seed, "cpu")
    noise = draw(g, (1, 16, y.shape[2], LAT_H, LAT_W))
    kw.setdefault("schedule", V1_FAST.recipe.schedule())
    return FastRun(model, noise, ctx, y, cam, cache_for(y.shape[2]), g, chunk_frames=V1_FAST.recipe.chunk_frames, **kw)


def recording(model, calls):
    original = model.forward

    def forward(*a, **k):
        calls.append((int(a[1][0]), k.get("cache_final")))
        return original(*a, **k)

    return forward


@pytest.mark.parametrize("steps,fold", [(4, False), (3, False), (4, True), (3, True), (2, True)])
def test_levers_equal_the_loop_written_out(model, steps, fold):
    y, cam, ctx = problem()
    levers = ChunkLevers(steps=steps, fold_context=fold)
    calls = []
    model.forward = recording(model, calls)
    try:
        r = fast_run(model, y, cam, ctx, 21, **levers.fast_run_options(V1_FAST.recipe))
        latent = r.run()
    finally:
        del model.forward
    timesteps = V1_FAST.recipe.schedule(steps).timesteps
    torch.testing.assert_close(latent, hand_loop(model, y, cam, ctx, 21, timesteps, fold), rtol=0, atol=0)
    per_chunk = [(t, fold and i + 1 == steps) for i, t in enumerate(timesteps)] + ([] if fold else [(0, True)])
    assert calls == per_chunk * 2 and r.model_calls == len(calls)


def test_fold_keeps_the_first_chunk_and_changes_the_later_ones(model):
    y, cam, ctx = problem()
    exact = fast_run(model, y, cam, ctx, 4).run()
    folded = fast_run(model, y, cam, ctx, 4, fold_context=True).run()
    torch.testing.assert_close(folded[:, :, :3], exact[:, :, :3], rtol=0, atol=0)  # nothing cached before it
    assert (folded[:, :, 3:] - exact[:, :, 3:]).norm() > 1e-4 * exact[:, :, 3:].norm()


def test_fold_without_a_final_context_leaves_the_last_chunk_unwritten(model):
    y, cam, ctx = problem()
    calls = []
    model.forward = recording(model, calls)
    try:
        r = fast_run(model, y, cam, ctx, 4, fold_context=True, final_context=False)
        r.run()
    finally:
        del model.forward
    assert [final for _, final in calls] == [False, False, False, True] + [False] * 4 and r.model_calls == 8


def test_three_steps_reuse_the_release_grid_values():
    four, three = V1_FAST.recipe.schedule(), V1_FAST.recipe.schedule(3)
    assert three.timesteps == (999, 947, 825)
    assert three.sigma_x0 == (four.sigma_x0[0], four.sigma_x0[2], four.sigma_x0[3])
    assert three.sigma_renoise == four.sigma_renoise[1:]  # re-noise to 947 and 825 as the 4-step schedule does
    assert V1_FAST.recipe.schedule(2).timesteps == (999, 825)


def test_the_default_levers_change_nothing():
    assert ChunkLevers().exact and ChunkLevers().fast_run_options(V1_FAST.recipe) == {}
    assert ChunkLevers().window(21, 21) == 21 and ChunkLevers().window(None, 21) is None
    with pytest.raises(ValueError, match="step variants"):
        ChunkLevers(steps=5)
    with pytest.raises(ValueError, match="window_frames"):
        ChunkLevers(window_frames=2)


@pytest.mark.parametrize("window,latent,expected", [(21, 21, 15), (None, 21, 15), (9, 21, 9), (None, 12, None),
                                                    (30, 81, 15)])
def test_the_window_cap(window, latent, expected):
    assert ChunkLevers(window_frames=15).window(window, latent) == expected


@pytest.mark.parametrize("fold", [False, True])
def test_replaying_the_final_calls_rebuilds_the_cache_exactly(model, fold):
    """A rebuilt cache (e.g. after a rewind) must hold what the run wrote: the context passes at t = 0, or with
    fold_context the last steps' calls (FastRun.folded_inputs)."""
    from lingbot_world.wan.sampling.fast_sampler import context_pass

    y, cam, ctx = problem()
    r = fast_run(model, y, cam, ctx, 9, fold_context=fold)
    r.run()
    rebuilt = cache_for(y.shape[2])
    replay = r.folded_inputs if fold else [(x0, 0) for x0 in r.latents]
    assert len(replay) == r.chunks
    with torch.no_grad():
        for c, (x, t) in enumerate(replay):
            sl = slice(3 * c, 3 * c + 3)
            context_pass(model, x, ctx, y[:, :, sl], cam[:, :, sl], rebuilt, 3 * c, timestep=t)
    for a, b in zip(rebuilt.k + rebuilt.v, r.cache.k + r.cache.v):
        assert torch.equal(a, b)
    assert not fold or [t for _, t in r.folded_inputs] == [825, 825]

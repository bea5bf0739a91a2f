"""The dual-expert sampling loop on tiny random experts (CPU, float32)."""
import pytest
import torch

from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.expert_schedule import expert_for_timestep
from lingbot_world.wan.sampling.sampler import Cancelled, ResidentExperts, SamplingSettings, make_noise, sample
from lingbot_world.wan.sampling.schedulers import make_scheduler

F, H, W = 2, 4, 6


class SpyExpert(torch.nn.Module):
    """Wraps a DiT and records every call's timestep and batch size."""

    def __init__(self, inner, name, log):
        super().__init__()
        self.inner, self.name, self.log = inner, name, log

    def forward(self, x, t, ctx, y, camera=None):
        self.log.append((self.name, int(t.reshape(-1)[0]), x.shape[0], camera is not None))
        return self.inner(x, t, ctx, y, camera=camera)


@pytest.fixture
def setup():
    cfg = DiTConfig.tiny()
    torch.manual_seed(1)
    high, low = WanDiT(cfg).eval(), WanDiT(cfg).eval()
    ctx = pad_context([torch.randn(5, cfg.text_dim)], cfg.text_len)
    neg = pad_context([torch.randn(9, cfg.text_dim)], cfg.text_len)
    y = torch.randn(1, 20, F, H, W)
    cam = torch.randn(1, 384, F, H, W)
    return cfg, high, low, ctx, neg, y, cam


def run(setup, settings, camera=True, log=None, seed=7, **kw):
    cfg, high, low, ctx, neg, y, cam = setup
    log = [] if log is None else log
    prov = ResidentExperts(SpyExpert(high, "high", log), SpyExpert(low, "low", log))
    noise = make_noise((1, 16, F, H, W), seed)
    out = sample(prov, noise, ctx, neg, y, cam if camera else None, settings, **kw)
    return out, log, prov


def test_switches_expert_exactly_at_the_boundary(setup):
    s = SamplingSettings(steps=12, shift=10.0, guide_high=3.0, guide_low=4.0, cfg_mode="sequential")
    out, log, prov = run(setup, s)
    ts = [int(t) for t in make_scheduler("unipc", 12, 10.0).timesteps]
    n_high = sum(t >= 947 for t in ts)
    assert 0 < n_high < 12
    names = [name for name, *_ in log]
    # two forwards (cond + uncond) per step, high first, then low, one switch
    assert names == ["high"] * (2 * n_high) + ["low"] * (2 * (12 - n_high))
    assert [t for _, t, *_ in log[::2]] == ts
    assert all(expert_for_timestep(t) == name for name, t, *_ in log)
    assert prov.events == [("acquire", "high"), ("release", "high"), ("acquire", "low"), ("release", "low")]
    assert out.shape == (1, 16, F, H, W) and torch.isfinite(out).all()


def test_deterministic_for_a_seed(setup):
    s = SamplingSettings(steps=4, cfg_mode="sequential")
    a, *_ = run(setup, s, seed=3)
    b, *_ = run(setup, s, seed=3)
    c, *_ = run(setup, s, seed=4)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_batched_cfg_equals_sequential(setup):
    seq, log_s, _ = run(setup, SamplingSettings(steps=5, cfg_mode="sequential"))
    bat, log_b, _ = run(setup, SamplingSettings(steps=5, cfg_mode="batch"))
    assert all(b == 2 for _, _, b, _ in log_b) and len(log_b) == 5
    assert torch.allclose(seq, bat, rtol=1e-5, atol=1e-5), (seq - bat).abs().max()


def test_camera_on_and_off_both_run_and_differ(setup):
    s = SamplingSettings(steps=3, cfg_mode="sequential")
    with_cam, log_c, _ = run(setup, s, camera=True)
    without, log_n, _ = run(setup, s, camera=False)
    assert all(c for *_, c in log_c) and not any(c for *_, c in log_n)
    assert not torch.allclose(with_cam, without)


def test_guide_one_skips_the_unconditional_pass(setup):
    s = SamplingSettings(steps=3, guide_high=1.0, guide_low=1.0)
    _, log, _ = run(setup, s)
    assert len(log) == 3


def test_callback_reports_every_step_with_x0(setup):
    seen = []
    s = SamplingSettings(steps=4, cfg_mode="sequential")
    out, _, _ = run(setup, s, callback=seen.append)
    assert [i.index for i in seen] == [0, 1, 2, 3] and all(i.total == 4 for i in seen)
    assert seen[-1].x0.shape == out.shape
    assert torch.allclose(seen[-1].x0, out)  # last UniPC step returns the x0 estimate


def test_cancel_stops_within_one_model_call_and_releases(setup):
    calls = []

    def cancel():
        return len(calls) >= 3

    log = []
    cfg, high, low, ctx, neg, y, cam = setup

    class Counting(SpyExpert):
        def forward(self, *a, **k):
            calls.append(1)
            return super().forward(*a, **k)

    prov = ResidentExperts(Counting(high, "high", log), Counting(low, "low", log))
    with pytest.raises(Cancelled):
        sample(prov, make_noise((1, 16, F, H, W), 0), ctx, neg, y, cam,
               SamplingSettings(steps=10, cfg_mode="sequential"), cancel_check=cancel)
    assert len(calls) == 3
    assert prov.events[-1][0] == "release"


def test_noise_sources():
    a = make_noise((1, 16, 2, 4, 4), 42)
    b = make_noise((1, 16, 2, 4, 4), 42)
    assert torch.equal(a, b)
    # identical to the reference's randn(16, F, H, W) on a seeded generator
    g = torch.Generator().manual_seed(42)
    assert torch.equal(a[0], torch.randn(16, 2, 4, 4, generator=g))
    with pytest.raises(ValueError):
        make_noise((1, 16, 2, 4, 4), 1, source="tpu")


def test_duplicate_leading_timesteps_end_cleanly(setup):
    # 100 steps at shift 12 start with 999, 999: the scheduler starts at index 1 and is done a call early
    s = SamplingSettings(steps=100, shift=12.0, guide_high=1.0, guide_low=1.0)
    out, log, _ = run(setup, s, camera=False)
    assert len(log) == 99 and torch.isfinite(out).all()

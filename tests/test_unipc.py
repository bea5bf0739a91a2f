"""Flow UniPC scheduler (spec §6.1-6.3, §5.5): grid, parity with diffusers, duplicate-timestep rule, last step."""
import math

import numpy as np
import pytest
import torch

from lingbot_world.wan.sampling.dpm_solver import FlowDPMSolverScheduler
from lingbot_world.wan.sampling.schedulers import make_scheduler
from lingbot_world.wan.sampling.unipc import FlowUniPCScheduler, flow_timesteps, train_sigma_max

# spec §5.5: the 70 integer timesteps at steps=70, shift=10
SPEC_TIMESTEPS = [
    999, 998, 996, 995, 993, 992, 990, 988, 987, 985, 983, 981, 979, 977, 975, 973, 971, 968, 966, 963,
    961, 958, 956, 953, 950, 947, 944, 940, 937, 933, 930, 926, 922, 917, 913, 908, 904, 899, 893,
    888, 882, 875, 869, 862, 855, 847, 838, 830, 820, 810, 799, 788, 775, 762, 747, 731, 714, 694, 673,
    650, 624, 595, 563, 526, 483, 434, 377, 309, 227, 126,
]


def run(sched, velocity, x, timesteps=None, record=None):
    for t in sched.timesteps if timesteps is None else timesteps:
        t = int(t)
        x = sched.step(velocity(x, t), t, x)
        if record is not None:
            record.append((sched.last_order, x, sched.x0_estimate))
    return x


def diffusers_unipc(steps: int, shift: float):
    """diffusers' UniPC in its flow configuration, on the reference grid: passing the *unshifted* sigmas
    linspace(sigma_max, 0, steps+1)[:-1] makes it apply flow_shift once, exactly like spec §6.2."""
    diffusers = pytest.importorskip("diffusers")
    sched = diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", use_flow_sigmas=True,
        flow_shift=shift, predict_x0=True, solver_type="bh2", lower_order_final=True, final_sigmas_type="zero",
    )
    sched.set_timesteps(sigmas=np.linspace(train_sigma_max(), 0.0, steps + 1)[:-1])
    return sched


def test_default_grid_matches_spec():
    timesteps, sigmas = flow_timesteps(70, 10.0)
    assert timesteps.dtype == torch.int64 and sigmas.dtype == torch.float32
    assert timesteps.tolist() == SPEC_TIMESTEPS
    assert int((timesteps >= 947).sum()) == 26
    assert sigmas.shape == (71,) and sigmas[-1].item() == 0.0
    # unrounded float t of step 26 (the last high-noise step) is 947.23
    assert abs(sigmas[25].item() * 1000 - 947.23) < 0.005
    # sigma_max is the float32 training sigma 0.999, shifted once in float64, then stored as float32
    assert train_sigma_max() == float(np.float32(0.999))
    s = train_sigma_max()
    assert sigmas[0].item() == float(np.float32(10 * s / (1 + 9 * s)))
    assert abs(sigmas[-2].item() - 0.12647) < 1e-5


def test_matches_diffusers_unipc_bit_for_bit(make_velocity):
    velocity, noise = make_velocity()
    ours = FlowUniPCScheduler()
    ours.set_timesteps(70, 10.0)
    ref = diffusers_unipc(70, 10.0)
    assert torch.equal(ref.timesteps, ours.timesteps) and torch.equal(ref.sigmas, ours.sigmas)

    x, y, worst = noise.clone(), noise.clone(), 0.0
    for t in ours.timesteps:
        x = ours.step(velocity(x, int(t)), int(t), x)
        y = ref.step(velocity(y, int(t)), t, y).prev_sample
        worst = max(worst, (x - y).abs().max().item())
    assert worst <= 1e-6, worst
    assert torch.isfinite(x).all()


class UniPC64:
    """Independent float64 re-derivation of spec §6.3 (closed-form 2x2 solve, expm1 from math)."""

    def __init__(self, sigmas):
        self.s = [float(v) for v in sigmas]
        self.n = len(self.s) - 1
        self.i, self.x0s, self.corrected, self.prev_order = 0, [], None, None

    @staticmethod
    def lam(sigma):
        return math.inf if sigma == 0.0 else math.log1p(-sigma) - math.log(sigma)

    def step(self, x, v):
        s, i, lam = self.s, self.i, self.lam
        x = x.double()
        x0 = x - s[i] * v.double()
        if i > 0:  # corrector on x from the previous corrected sample
            h = lam(s[i]) - lam(s[i - 1])
            e = math.expm1(-h)
            alpha = 1.0 - s[i]
            base = s[i] / s[i - 1] * self.corrected - alpha * e * self.x0s[-1]
            if self.prev_order == 1:
                rho0, rho1, d1 = 0.0, 0.5, 0.0
            else:
                r = (lam(s[i - 2]) - lam(s[i - 1])) / h
                d1 = (self.x0s[-2] - self.x0s[-1]) / r
                k1 = e / -h - 1.0
                k2 = k1 / -h - 0.5
                b1, b2 = k1 / e, 2.0 * k2 / e
                rho1 = (b2 - r * b1) / (1.0 - r)  # [[1, 1], [r, 1]] @ rho = b
                rho0 = b1 - rho1
            x = base - alpha * e * (rho0 * d1 + rho1 * (x0 - self.x0s[-1]))
        self.x0s = (self.x0s + [x0])[-2:]
        order = min(2, self.n - i, i + 1)
        self.prev_order, self.corrected = order, x
        h = lam(s[i + 1]) - lam(s[i])
        e = math.expm1(-h)
        alpha = 1.0 - s[i + 1]
        out = s[i + 1] / s[i] * x - alpha * e * x0
        if order == 2:
            r = (lam(s[i - 1]) - lam(s[i])) / h
            out = out - alpha * e * 0.5 * (self.x0s[-2] - x0) / r
        self.i += 1
        return out


@pytest.mark.parametrize("seed", [1, 2])
def test_matches_float64_rederivation(seed, make_velocity):
    velocity, noise = make_velocity(seed)
    ours = FlowUniPCScheduler()
    ours.set_timesteps(70, 10.0)
    ref = UniPC64(ours.sigmas)
    x, y, worst = noise.clone(), noise.double(), 0.0
    for t in ours.timesteps:
        x = ours.step(velocity(x, int(t)), int(t), x)
        y = ref.step(y, velocity(y, int(t)))
        worst = max(worst, (x.double() - y).abs().max().item() / max(1.0, y.abs().max().item()))
    # float32 rounding floor over 70 steps (the corrector chain carries it): measured ~3.5e-7 relative
    assert worst <= 1e-6, worst


def test_last_step_returns_x0_and_order_pattern(make_velocity):
    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(70, 10.0)
    record = []
    out = run(sched, velocity, noise, record=record)
    assert [order for order, _, _ in record] == [1] + [2] * 68 + [1]
    assert torch.equal(out, sched.x0_estimate)
    assert sched.done and sched.step_index == 70


def test_first_step_and_x0_estimate(make_velocity):
    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(70, 10.0)
    v = velocity(noise, 999)
    out = sched.step(v, 999, noise)
    assert sched.step_index == 1 and sched.last_order == 1
    assert torch.equal(sched.x0_estimate, noise - sched.sigmas[0] * v)
    # order-1 UniP: x1 = sigma1/sigma0 * x - alpha1 * expm1(-h) * x0
    lam = lambda s: math.log1p(-s) - math.log(s)  # noqa: E731
    s0, s1 = float(sched.sigmas[0]), float(sched.sigmas[1])
    expect = s1 / s0 * noise.double() - (1 - s1) * math.expm1(lam(s0) - lam(s1)) * sched.x0_estimate.double()
    assert (out.double() - expect).abs().max().item() < 1e-6


def test_duplicate_timestep_starts_at_second_match(make_velocity):
    timesteps, sigmas = flow_timesteps(100, 12.0)
    assert timesteps[0].item() == timesteps[1].item() == 999
    # spec: also at 150+ steps with shift >= 8; never at the defaults
    assert flow_timesteps(150, 8.0)[0][:2].tolist() == [999, 999]
    assert len(set(flow_timesteps(70, 10.0)[0].tolist())) == 70

    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(100, 12.0)
    v = velocity(noise, 999)
    x = sched.step(v, 999, noise)
    assert sched.step_index == 2  # started at index 1, then incremented
    assert torch.equal(sched.x0_estimate, noise - sched.sigmas[1] * v)

    # it therefore lands on sigma 0 after 99 calls; the result is the last x0, and a 100th call is refused
    record = []
    x = run(sched, velocity, x, timesteps=sched.timesteps[1:99], record=record)
    assert sched.done and sched.step_index == 100
    assert record[-1][0] == 1 and torch.equal(x, sched.x0_estimate)
    with pytest.raises(RuntimeError, match="done"):
        sched.step(velocity(x, int(timesteps[99])), int(timesteps[99]), x)


def test_duplicate_timestep_matches_diffusers(make_velocity):
    velocity, noise = make_velocity()
    ours = FlowUniPCScheduler()
    ours.set_timesteps(100, 12.0)
    ref = diffusers_unipc(100, 12.0)
    assert torch.equal(ref.timesteps, ours.timesteps)
    x, y, worst = noise.clone(), noise.clone(), 0.0
    for t in ours.timesteps[:99]:
        x = ours.step(velocity(x, int(t)), int(t), x)
        y = ref.step(velocity(y, int(t)), t, y).prev_sample
        worst = max(worst, (x - y).abs().max().item())
    assert ref.step_index == ours.step_index == 100
    assert worst <= 1e-6, worst


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_output_keeps_sample_dtype(dtype, make_velocity):
    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(6, 5.0)
    x = noise.to(dtype)
    for t in sched.timesteps:
        x = sched.step(velocity(x, int(t)).to(dtype), int(t), x)
        assert x.dtype == dtype
    assert torch.isfinite(x.float()).all()


def test_set_timesteps_resets_history(make_velocity):
    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(8, 10.0)
    first = run(sched, velocity, noise)
    sched.set_timesteps(8, 10.0)
    assert sched.step_index is None and not sched.done
    assert torch.equal(run(sched, velocity, noise), first)


def test_accepts_tensor_timestep_and_single_step(make_velocity):
    velocity, noise = make_velocity()
    sched = FlowUniPCScheduler()
    sched.set_timesteps(1, 10.0)
    t = sched.timesteps[0]
    out = sched.step(velocity(noise, int(t)), t, noise)
    assert sched.last_order == 1 and torch.equal(out, sched.x0_estimate)


def test_bad_input_raises_clear_errors():
    sched = FlowUniPCScheduler()
    x = torch.zeros(1, 4, 2, 3, 5)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        sched.step(x, 999, x)
    with pytest.raises(ValueError, match="steps"):
        sched.set_timesteps(0, 10.0)
    with pytest.raises(ValueError, match="shift"):
        sched.set_timesteps(10, 0.0)
    sched.set_timesteps(10, 10.0)
    with pytest.raises(ValueError, match="not in the scheduler's timesteps"):
        sched.step(x, 123, x)
    with pytest.raises(ValueError, match="shape"):
        sched.step(x[:, :2], 999, x)
    with pytest.raises(ValueError, match="solver_order"):
        FlowUniPCScheduler(solver_order=3)


def test_make_scheduler():
    unipc = make_scheduler("unipc", 70, 10.0)
    assert isinstance(unipc, FlowUniPCScheduler) and unipc.timesteps.tolist() == SPEC_TIMESTEPS
    dpm = make_scheduler("DPM++", 70, 10.0)
    assert isinstance(dpm, FlowDPMSolverScheduler) and dpm.timesteps[0].item() == 1000
    with pytest.raises(ValueError, match="unknown sampler"):
        make_scheduler("euler", 70, 10.0)

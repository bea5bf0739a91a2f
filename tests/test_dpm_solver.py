"""Flow DPM-Solver++ (spec §6.4): grid from linspace(1, 0), parity with diffusers' solver maths and with a
float64 re-derivation, order pattern and exact x0 at the end."""
import math

import numpy as np
import pytest
import torch

from lingbot_world.wan.sampling.dpm_solver import FlowDPMSolverScheduler, dpm_flow_timesteps


def test_grid_starts_at_sigma_one_and_shifts_once():
    timesteps, sigmas = dpm_flow_timesteps(70, 10.0)
    assert timesteps.dtype == torch.int64 and sigmas.dtype == torch.float32
    assert timesteps.shape == (70,) and sigmas.shape == (71,)
    assert timesteps[0].item() == 1000 and sigmas[0].item() == 1.0 and sigmas[-1].item() == 0.0
    base = np.linspace(1, 0, 71)[:70]
    once = 10 * base / (1 + 9 * base)
    assert torch.equal(sigmas[:-1], torch.from_numpy(once.astype(np.float32)))
    assert timesteps.tolist() == [int(v) for v in once * 1000]
    assert timesteps[:4].tolist() == [1000, 998, 997, 995] and timesteps[-1].item() == 126
    assert int((timesteps >= 947).sum()) == 26


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy-2 __array__ notice raised inside diffusers
def test_matches_diffusers_dpmsolver_maths(make_velocity):
    """diffusers' flow grid differs by design (it starts at shift(0.999), not 1.0, and has no `sigmas=`
    argument), so its solver runs on our grid by replacing its timesteps/sigmas after set_timesteps."""
    diffusers = pytest.importorskip("diffusers")
    velocity, noise = make_velocity()
    ours = FlowDPMSolverScheduler()
    ours.set_timesteps(70, 10.0)
    ref = diffusers.DPMSolverMultistepScheduler(
        num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", algorithm_type="dpmsolver++",
        solver_type="midpoint", lower_order_final=True, final_sigmas_type="zero", use_flow_sigmas=True,
        flow_shift=10.0,
    )
    ref.set_timesteps(70)
    ref.timesteps, ref.sigmas = ours.timesteps.clone(), ours.sigmas.clone()
    x, y, worst = noise.clone(), noise.clone(), 0.0
    for t in ours.timesteps:
        x = ours.step(velocity(x, int(t)), int(t), x)
        y = ref.step(velocity(y, int(t)), t, y).prev_sample
        worst = max(worst, (x - y).abs().max().item())
    assert worst <= 1e-6, worst


class DPM64:
    """Independent float64 re-derivation of multistep DPM-Solver++(2M, midpoint) in the flow parametrisation
    (alpha = 1 - sigma, lambda = ln(alpha/sigma)), order 1 at the start and at sigma 0."""

    def __init__(self, sigmas):
        self.s = [float(v) for v in sigmas]
        self.n = len(self.s) - 1
        self.i, self.x0s = 0, []

    @staticmethod
    def lam(sigma):
        if sigma == 0.0:
            return math.inf
        if sigma == 1.0:
            return -math.inf
        return math.log1p(-sigma) - math.log(sigma)

    def step(self, x, v):
        s, i, lam = self.s, self.i, self.lam
        x = x.double()
        x0 = x - s[i] * v.double()
        self.x0s = (self.x0s + [x0])[-2:]
        self.i += 1
        if s[i + 1] == 0.0:
            return x0
        h = lam(s[i + 1]) - lam(s[i])
        c = (1.0 - s[i + 1]) * math.expm1(-h)
        out = s[i + 1] / s[i] * x - c * x0
        if i > 0 and s[i - 1] < 1.0:  # the second-order term; it vanishes right after sigma = 1 (lambda = -inf)
            r0 = (lam(s[i]) - lam(s[i - 1])) / h
            out = out - 0.5 * c * (x0 - self.x0s[-2]) / r0
        return out


@pytest.mark.parametrize("seed", [1, 2])
def test_matches_float64_rederivation(seed, make_velocity):
    velocity, noise = make_velocity(seed)
    ours = FlowDPMSolverScheduler()
    ours.set_timesteps(70, 10.0)
    forced, free = DPM64(ours.sigmas), DPM64(ours.sigmas)
    x, y = noise.clone(), noise.double()
    worst_step, worst_run = 0.0, 0.0
    for t in ours.timesteps:
        v = velocity(x, int(t))
        expect = forced.step(x, v)  # same inputs as ours: checks each update to float32 rounding
        x = ours.step(v, int(t), x)
        y = free.step(y, velocity(y, int(t)))  # its own float64 trajectory
        worst_step = max(worst_step, (x.double() - expect).abs().max().item())
        worst_run = max(worst_run, (x.double() - y).abs().max().item() / max(1.0, y.abs().max().item()))
    assert worst_step <= 1e-6, worst_step  # measured ~4e-7
    assert worst_run <= 1e-6, worst_run  # relative to the sample scale; measured ~5e-7


def test_order_pattern_and_last_step_is_x0(make_velocity):
    velocity, noise = make_velocity()
    sched = FlowDPMSolverScheduler()
    sched.set_timesteps(70, 10.0)
    x, orders = noise.clone(), []
    for t in sched.timesteps:
        x = sched.step(velocity(x, int(t)), int(t), x)
        orders.append(sched.last_order)
        assert torch.isfinite(x).all()  # lambda(1.0) = -inf must not leak NaN into the second step
    assert orders == [1] + [2] * 68 + [1]
    assert torch.equal(x, sched.x0_estimate)
    assert sched.done
    with pytest.raises(RuntimeError, match="done"):
        sched.step(x, 126, x)


def test_first_step_is_exact_interpolation(make_velocity):
    # from sigma 1 (pure noise) the first-order update is x1 = sigma1 * x + (1 - sigma1) * x0
    velocity, noise = make_velocity()
    sched = FlowDPMSolverScheduler()
    sched.set_timesteps(10, 5.0)
    v = velocity(noise, 1000)
    out = sched.step(v, 1000, noise)
    s1 = float(sched.sigmas[1])
    assert torch.equal(sched.x0_estimate, noise - v)
    assert (out.double() - (s1 * noise.double() + (1 - s1) * sched.x0_estimate.double())).abs().max() < 1e-6


def test_bad_input_raises_clear_errors():
    sched = FlowDPMSolverScheduler()
    x = torch.zeros(1, 4, 2, 3, 5)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        sched.step(x, 1000, x)
    with pytest.raises(ValueError, match="steps"):
        sched.set_timesteps(-1, 10.0)
    sched.set_timesteps(10, 10.0)
    with pytest.raises(ValueError, match="not in the scheduler's timesteps"):
        sched.step(x, 999, x)
    with pytest.raises(ValueError, match="shape"):
        sched.step(x[..., :2], 1000, x)

"""Flow-matching UniPC multistep scheduler of LingBot-World / Wan2.2 (spec §6.1-6.3).

UniPC with order 2, the `bh2` B(h), data (x0) prediction from the flow velocity, a corrector on every step
after the first and order 1 at the final step. The grid is built in float64 and stored as float32 sigmas;
the model sees int64 timesteps (truncated), the update uses the float sigmas. All scalar maths (alpha,
lambda, h, phi, rho) runs on 0-d float32 CPU tensors like the reference, so results match it to the bit
rather than merely to float32 tolerance.
"""
from __future__ import annotations

import logging
from typing import Optional, Union

import numpy as np
import torch

log = logging.getLogger(__name__)

Timestep = Union[int, float, torch.Tensor]


def check_grid_args(steps: int, shift: float) -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not np.isfinite(shift) or shift <= 0:
        raise ValueError(f"shift must be a finite number > 0, got {shift!r}")


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """Flow shift sigma' = shift*sigma / (1 + (shift-1)*sigma), float64, same operation order as the reference."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def grid_from_shifted_sigmas(
    shifted: np.ndarray, num_train_timesteps: int = 1000, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps int64 [N] truncated toward zero on `device`, sigmas float32 [N+1] on CPU ending in 0)."""
    timesteps = torch.from_numpy(shifted * num_train_timesteps).to(device=device, dtype=torch.int64)
    sigmas = torch.from_numpy(np.concatenate([shifted, [0.0]]).astype(np.float32))
    return timesteps, sigmas


def train_sigma_max(num_train_timesteps: int = 1000) -> float:
    """Largest sigma of the training table: 1 - 1/N stored as float32 (0.999 -> 0.9990000128746033)."""
    return float(np.float32(1.0 - 1.0 / num_train_timesteps))


def flow_timesteps(
    steps: int, shift: float, num_train_timesteps: int = 1000, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """UniPC grid of spec §6.2: sigma = linspace(sigma_max, 0, steps+1)[:-1] in float64, shifted once.

    Returns (timesteps int64 [steps], sigmas float32 [steps+1] with a final 0).
    """
    check_grid_args(steps, shift)
    base = np.linspace(train_sigma_max(num_train_timesteps), 0.0, steps + 1)[:-1]
    return grid_from_shifted_sigmas(shift_sigmas(base, float(shift)), num_train_timesteps, device)


def log_snr(sigma: torch.Tensor) -> torch.Tensor:
    """lambda = ln(alpha) - ln(sigma) with alpha = 1 - sigma, on a 0-d float32 tensor (+inf at sigma 0)."""
    return torch.log(1 - sigma) - torch.log(sigma)


def first_step_index(timesteps: torch.Tensor, t: Timestep) -> int:
    """Index the first step starts from: the match of t in `timesteps`, the *second* match if t occurs twice.

    This is the reference rule (meant for starting mid-schedule); with duplicated leading timesteps
    (e.g. 999, 999 at 100 steps / shift 12) the scheduler therefore starts at index 1.
    """
    t_cmp = t.to(timesteps.device) if isinstance(t, torch.Tensor) else t
    matches = (timesteps == t_cmp).nonzero().flatten()
    if matches.numel() == 0:
        shown = t.tolist() if isinstance(t, torch.Tensor) else t
        raise ValueError(
            f"timestep {shown} is not in the scheduler's timesteps {timesteps.tolist()[:5]}...; "
            "pass the timesteps from scheduler.timesteps in order"
        )
    return int(matches[1 if matches.numel() > 1 else 0])


class FlowMultistepScheduler:
    """What the flow multistep solvers share: the grid, the step index (with the duplicate-timestep rule), the
    x0 history and the bookkeeping around each step. Subclasses set `grid` and implement `_update(sample, x0, i)`.
    """

    grid = staticmethod(flow_timesteps)  # (steps, shift, num_train_timesteps, device) -> (timesteps, sigmas)

    def __init__(self, num_train_timesteps: int = 1000, solver_order: int = 2):
        if solver_order not in (1, 2):
            raise ValueError(f"solver_order must be 1 or 2 (the reference runs 2), got {solver_order}")
        self.num_train_timesteps = int(num_train_timesteps)
        self.solver_order = solver_order
        self.timesteps: Optional[torch.Tensor] = None
        self.sigmas: Optional[torch.Tensor] = None
        self._reset()

    def _reset(self) -> None:
        self.step_index: Optional[int] = None
        self.x0_estimate: Optional[torch.Tensor] = None
        self.last_order: Optional[int] = None  # order of the update of the latest step
        self._x0_history: list[torch.Tensor] = []  # data predictions, oldest first, at most solver_order
        self._lower_order_nums = 0

    def set_timesteps(self, steps: int, shift: float, device=None) -> None:
        self.timesteps, self.sigmas = self.grid(steps, shift, self.num_train_timesteps, device)
        self._reset()

    @property
    def num_steps(self) -> int:
        return 0 if self.timesteps is None else len(self.timesteps)

    @property
    def done(self) -> bool:
        """True once the step landing on sigma 0 has run (with duplicated leading timesteps that happens one call
        before the end of `timesteps`, see `first_step_index`)."""
        return self.step_index is not None and self.step_index >= self.num_steps

    def step(self, model_output: torch.Tensor, t: Timestep, sample: torch.Tensor) -> torch.Tensor:
        """One step: `model_output` is the flow velocity at (sample, t); returns the next sample."""
        name = type(self).__name__
        if self.timesteps is None:
            raise RuntimeError(f"{name}.step called before set_timesteps(steps, shift)")
        if model_output.shape != sample.shape:
            raise ValueError(
                f"velocity shape {tuple(model_output.shape)} does not match sample shape {tuple(sample.shape)}"
            )
        if self.step_index is None:
            self.step_index = first_step_index(self.timesteps, t)
        if self.done:
            raise RuntimeError(
                f"the schedule is finished (step index {self.step_index} of {self.num_steps}): the sample is already "
                "the final x0. With duplicated leading timesteps the first step starts at index 1, so stop when "
                "scheduler.done is True instead of running every entry of timesteps"
            )
        i = self.step_index
        x0 = sample - self.sigmas[i] * model_output
        x_next = self._update(sample, x0, i)
        self._lower_order_nums = min(self._lower_order_nums + 1, self.solver_order)
        self.step_index = i + 1
        return x_next

    def _update(self, sample: torch.Tensor, x0: torch.Tensor, i: int) -> torch.Tensor:
        raise NotImplementedError


class FlowUniPCScheduler(FlowMultistepScheduler):
    """Stateful UniPC (bh2, predict x0) for flow-matching velocity models.

    Usage: `set_timesteps(steps, shift)`, then for t in `timesteps`: `x = step(v(x, t), t, x)`.
    After the last step `done` is True and the returned sample equals `x0_estimate` exactly.
    """

    def _reset(self) -> None:
        super()._reset()
        self._last_sample: Optional[torch.Tensor] = None  # corrected sample the latest predictor started from

    def _scalars(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sigma = self.sigmas[i]
        return sigma, 1 - sigma, log_snr(sigma)

    def _corrector(self, x0: torch.Tensor) -> torch.Tensor:
        """UniC: refine the sample the model just saw, using its fresh data prediction `x0`."""
        i = self.step_index
        order = self.last_order
        m0 = self._x0_history[-1]
        x_prev = self._last_sample
        sigma_t, alpha_t, lam_t = self._scalars(i)
        sigma_s0, _, lam_s0 = self._scalars(i - 1)
        h = lam_t - lam_s0
        hh = -h
        h_phi_1 = torch.expm1(hh)
        b_h = torch.expm1(hh)  # bh2
        x_base = sigma_t / sigma_s0 * x_prev - alpha_t * h_phi_1 * m0
        d1_t = x0 - m0
        if order == 1:
            rho_t = torch.tensor(0.5, dtype=x_prev.dtype)
            return (x_base - alpha_t * b_h * (rho_t * d1_t)).to(x_prev.dtype)
        # order 2: solve the 2x2 system for (rho_0, rho_t) in float32 like the reference
        _, _, lam_s1 = self._scalars(i - 2)
        rk = (lam_s1 - lam_s0) / h
        d1 = (self._x0_history[-2] - m0) / rk
        k1 = h_phi_1 / hh - 1
        k2 = k1 / hh - 0.5
        rhs = torch.stack([k1 / b_h, k2 * 2 / b_h])
        lhs = torch.stack([torch.ones(2), torch.stack([rk, torch.ones(())])])
        # solved on the sample's device, as the reference does (CPU and CUDA solvers may differ in the last ulp)
        rho = torch.linalg.solve(lhs.to(x_prev.device), rhs.to(x_prev.device)).to(x_prev.dtype)
        return (x_base - alpha_t * b_h * (rho[0] * d1 + rho[1] * d1_t)).to(x_prev.dtype)

    def _predictor(self, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniP from sigma_i to sigma_{i+1}; order 2 uses the fixed rho = 0.5 of the reference."""
        i = self.step_index
        m0 = self._x0_history[-1]
        sigma_t, alpha_t, lam_t = self._scalars(i + 1)
        sigma_s0, _, lam_s0 = self._scalars(i)
        h = lam_t - lam_s0
        hh = -h
        h_phi_1 = torch.expm1(hh)
        b_h = torch.expm1(hh)
        x_next = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0
        if order == 2:
            _, _, lam_s1 = self._scalars(i - 1)
            rk = (lam_s1 - lam_s0) / h
            d1 = (self._x0_history[-2] - m0) / rk
            x_next = x_next - alpha_t * b_h * (torch.tensor(0.5, dtype=x.dtype) * d1)
        return x_next.to(x.dtype)

    def _update(self, sample: torch.Tensor, x0: torch.Tensor, i: int) -> torch.Tensor:
        if i > 0 and self._last_sample is not None:
            sample = self._corrector(x0)

        self._x0_history = (self._x0_history + [x0])[-self.solver_order:]
        self.x0_estimate = x0

        order = min(self.solver_order, self.num_steps - i)  # lower_order_final
        order = min(order, self._lower_order_nums + 1)  # warm-up of the multistep history
        self.last_order = order
        self._last_sample = sample
        return self._predictor(sample, order)
"""Flow-matching DPM-Solver++ (2M, midpoint) scheduler, the reference's `--sample_solver dpm++` (spec §6.4).

Differences from UniPC (wan/unipc.py): the grid starts at sigma 1.0 (linspace(1, 0, steps+1)[:steps], shifted
once), there is no corrector, and the update uses exp(-h) - 1 rather than expm1. Order 1 at the first and the
last step (final sigma 0), order 2 in between. Scalar maths on 0-d float32 CPU tensors like the reference; the
update itself runs in float32.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .unipc import Timestep, check_grid_args, first_step_index, grid_from_shifted_sigmas, log_snr, shift_sigmas


def dpm_flow_timesteps(
    steps: int, shift: float, num_train_timesteps: int = 1000, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPM++ grid: sigma = shift(linspace(1, 0, steps+1)[:steps]) in float64 (first timestep 1000).

    Returns (timesteps int64 [steps], sigmas float32 [steps+1] with a final 0).
    """
    check_grid_args(steps, shift)
    base = np.linspace(1.0, 0.0, steps + 1)[:steps]
    # The reference scheduler is built with shift=1 and re-applies it in set_timesteps: 1*s/(1+0*s) == s exactly.
    return grid_from_shifted_sigmas(shift_sigmas(base, float(shift)), num_train_timesteps, device)


class FlowDPMSolverScheduler:
    """Stateful multistep DPM-Solver++ (order 2, midpoint, x0 prediction) for flow velocity models.

    Same interface as `FlowUniPCScheduler`: `set_timesteps(steps, shift)`, `step(v, t, x)`, `timesteps`,
    `sigmas`, `step_index`, `x0_estimate`, `last_order`, `done`.
    """

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
        self.last_order: Optional[int] = None
        self._x0_history: list[torch.Tensor] = []
        self._lower_order_nums = 0

    def set_timesteps(self, steps: int, shift: float, device=None) -> None:
        self.timesteps, self.sigmas = dpm_flow_timesteps(steps, shift, self.num_train_timesteps, device)
        self._reset()

    @property
    def num_steps(self) -> int:
        return 0 if self.timesteps is None else len(self.timesteps)

    @property
    def done(self) -> bool:
        return self.step_index is not None and self.step_index >= self.num_steps

    def _first_order(self, x: torch.Tensor, i: int) -> torch.Tensor:
        sigma_t, sigma_s = self.sigmas[i + 1], self.sigmas[i]
        alpha_t = 1 - sigma_t
        h = log_snr(sigma_t) - log_snr(sigma_s)
        return (sigma_t / sigma_s) * x - (alpha_t * (torch.exp(-h) - 1.0)) * self._x0_history[-1]

    def _second_order(self, x: torch.Tensor, i: int) -> torch.Tensor:
        sigma_t, sigma_s0, sigma_s1 = self.sigmas[i + 1], self.sigmas[i], self.sigmas[i - 1]
        alpha_t = 1 - sigma_t
        lam_t, lam_s0, lam_s1 = log_snr(sigma_t), log_snr(sigma_s0), log_snr(sigma_s1)
        m0, m1 = self._x0_history[-1], self._x0_history[-2]
        h, h_0 = lam_t - lam_s0, lam_s0 - lam_s1
        r0 = h_0 / h
        d1 = (1.0 / r0) * (m0 - m1)  # 0 right after sigma 1.0 (lambda = -inf there), no NaN
        coef = alpha_t * (torch.exp(-h) - 1.0)
        return (sigma_t / sigma_s0) * x - coef * m0 - 0.5 * coef * d1

    def step(self, model_output: torch.Tensor, t: Timestep, sample: torch.Tensor) -> torch.Tensor:
        """One DPM++ step: `model_output` is the flow velocity at (sample, t); returns the next sample."""
        if self.timesteps is None:
            raise RuntimeError("FlowDPMSolverScheduler.step called before set_timesteps(steps, shift)")
        if model_output.shape != sample.shape:
            raise ValueError(
                f"velocity shape {tuple(model_output.shape)} does not match sample shape {tuple(sample.shape)}"
            )
        if self.step_index is None:
            self.step_index = first_step_index(self.timesteps, t)
        if self.done:
            raise RuntimeError(
                f"the schedule is finished (step index {self.step_index} of {self.num_steps}); "
                "stop when scheduler.done is True"
            )
        i = self.step_index
        x0 = sample - self.sigmas[i] * model_output
        self._x0_history = (self._x0_history + [x0])[-self.solver_order:]
        self.x0_estimate = x0

        # final sigma 0 always ends with order 1 (which returns x0 exactly); warm-up starts with order 1
        final = i == self.num_steps - 1
        order = 1 if (self.solver_order == 1 or self._lower_order_nums < 1 or final) else 2
        self.last_order = order
        x32 = sample.to(torch.float32)
        x_next = self._first_order(x32, i) if order == 1 else self._second_order(x32, i)

        self._lower_order_nums = min(self._lower_order_nums + 1, self.solver_order)
        self.step_index = i + 1
        return x_next.to(sample.dtype)

"""Flow-matching DPM-Solver++ (2M, midpoint) scheduler, the reference's `--sample_solver dpm++` (spec §6.4).

Differences from UniPC (wan/sampling/unipc.py): the grid starts at sigma 1.0 (linspace(1, 0, steps+1)[:steps], shifted
once), there is no corrector, and the update uses exp(-h) - 1 rather than expm1. Order 1 at the first and the
last step (final sigma 0), order 2 in between. Scalar maths on 0-d float32 CPU tensors like the reference; the
update itself runs in float32.
"""
from __future__ import annotations

import numpy as np
import torch

from .unipc import FlowMultistepScheduler, check_grid_args, grid_from_shifted_sigmas, log_snr, shift_sigmas


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


class FlowDPMSolverScheduler(FlowMultistepScheduler):
    """Stateful multistep DPM-Solver++ (order 2, midpoint, x0 prediction) for flow velocity models.

    Same interface as `FlowUniPCScheduler`: `set_timesteps(steps, shift)`, `step(v, t, x)`, `timesteps`,
    `sigmas`, `step_index`, `x0_estimate`, `last_order`, `done`.
    """

    grid = staticmethod(dpm_flow_timesteps)

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

    def _update(self, sample: torch.Tensor, x0: torch.Tensor, i: int) -> torch.Tensor:
        self._x0_history = (self._x0_history + [x0])[-self.solver_order:]
        self.x0_estimate = x0

        # final sigma 0 always ends with order 1 (which returns x0 exactly); warm-up starts with order 1
        final = i == self.num_steps - 1
        order = 1 if (self.solver_order == 1 or self._lower_order_nums < 1 or final) else 2
        self.last_order = order
        x32 = sample.to(torch.float32)
        x_next = self._first_order(x32, i) if order == 1 else self._second_order(x32, i)
        return x_next.to(sample.dtype)

"""Pick a flow-matching sampler by name: "unipc" (the reference default) or "dpm++"."""
from __future__ import annotations

from typing import Union

from .dpm_solver import FlowDPMSolverScheduler
from .unipc import FlowUniPCScheduler

FlowScheduler = Union[FlowUniPCScheduler, FlowDPMSolverScheduler]

SCHEDULERS = {"unipc": FlowUniPCScheduler, "dpm++": FlowDPMSolverScheduler}


def make_scheduler(
    name: str, steps: int, shift: float, device=None, num_train_timesteps: int = 1000
) -> FlowScheduler:
    """A scheduler with its timesteps set (timesteps on `device`, sigmas on the CPU)."""
    key = name.strip().lower()
    if key not in SCHEDULERS:
        raise ValueError(f"unknown sampler {name!r}; choose one of {sorted(SCHEDULERS)}")
    sched = SCHEDULERS[key](num_train_timesteps=num_train_timesteps, solver_order=2)
    sched.set_timesteps(steps, shift, device=device)
    return sched

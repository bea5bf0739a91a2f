"""Which expert and which guide scale a timestep uses (spec §5.5).

The high-noise expert runs while t >= boundary * num_train_timesteps (0.947 * 1000 == 947.0 exactly in
float), the low-noise expert afterwards. The comparison uses the integer timestep the model sees.
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

GuideScale = Union[float, Sequence[float]]


def _as_number(t: Union[int, float, torch.Tensor]) -> float:
    if isinstance(t, torch.Tensor):
        if t.numel() != 1:
            raise ValueError(f"expected a single timestep, got a tensor of shape {tuple(t.shape)}")
        return t.item()
    return t


def boundary_timestep(boundary: float = 0.947, num_train_timesteps: int = 1000) -> float:
    """The switch point in timestep units (947.0 at the defaults)."""
    if not 0.0 <= boundary <= 1.0:
        raise ValueError(f"boundary must be in [0, 1], got {boundary}")
    return boundary * num_train_timesteps


def expert_for_timestep(
    t: Union[int, float, torch.Tensor], boundary: float = 0.947, num_train_timesteps: int = 1000
) -> str:
    """"high" while t >= boundary * num_train_timesteps, else "low"."""
    return "high" if _as_number(t) >= boundary_timestep(boundary, num_train_timesteps) else "low"


def guide_for_timestep(
    t: Union[int, float, torch.Tensor],
    guide_scale: GuideScale = (5.0, 5.0),
    boundary: float = 0.947,
    num_train_timesteps: int = 1000,
) -> float:
    """Guide scale for step t. `guide_scale` is one float for both experts or a pair in the reference's order
    (low_noise, high_noise): guide_scale[1] while the high-noise expert runs, guide_scale[0] afterwards."""
    if isinstance(guide_scale, (int, float)):
        return float(guide_scale)
    if len(guide_scale) != 2:
        raise ValueError(f"guide_scale must be a float or a (low, high) pair, got {guide_scale!r}")
    low, high = guide_scale
    return float(high if expert_for_timestep(t, boundary, num_train_timesteps) == "high" else low)

"""Expert and guide-scale choice per timestep (spec §5.5)."""
import pytest
import torch

from lingbot_world.wan.sampling.dpm_solver import dpm_flow_timesteps
from lingbot_world.wan.sampling.expert_schedule import boundary_timestep, expert_for_timestep, guide_for_timestep
from lingbot_world.wan.sampling.unipc import flow_timesteps


def test_defaults_give_26_high_then_44_low():
    timesteps, _ = flow_timesteps(70, 10.0)
    experts = [expert_for_timestep(int(t)) for t in timesteps]
    assert experts == ["high"] * 26 + ["low"] * 44
    assert int(timesteps[25]) == 947 and int(timesteps[26]) == 944
    # the dpm++ grid (starts at t=1000) splits the same way
    assert [expert_for_timestep(t) for t in dpm_flow_timesteps(70, 10.0)[0]].count("high") == 26


def test_boundary_is_inclusive():
    assert boundary_timestep() == 947.0
    assert expert_for_timestep(947) == "high" and expert_for_timestep(946) == "low"
    assert expert_for_timestep(torch.tensor([947])) == "high"
    assert expert_for_timestep(torch.tensor(946, dtype=torch.int64)) == "low"
    assert expert_for_timestep(900, boundary=0.9) == "high" and expert_for_timestep(899, boundary=0.9) == "low"
    assert expert_for_timestep(1000) == "high"


def test_guide_scale_uses_reference_order_low_high():
    pair = (3.0, 7.0)  # (low_noise, high_noise) as in the reference's guide_scale
    assert guide_for_timestep(999, pair) == 7.0
    assert guide_for_timestep(947, pair) == 7.0
    assert guide_for_timestep(946, pair) == 3.0
    assert guide_for_timestep(126, 4.5) == 4.5 and guide_for_timestep(999, 4.5) == 4.5
    assert guide_for_timestep(999) == 5.0 and guide_for_timestep(126) == 5.0
    timesteps, _ = flow_timesteps(70, 10.0)
    guides = [guide_for_timestep(t, pair) for t in timesteps]
    assert guides.count(7.0) == 26 and guides.count(3.0) == 44


def test_bad_input():
    with pytest.raises(ValueError, match="guide_scale"):
        guide_for_timestep(999, (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="boundary"):
        expert_for_timestep(999, boundary=1.5)
    with pytest.raises(ValueError, match="single timestep"):
        expert_for_timestep(torch.tensor([999, 998]))

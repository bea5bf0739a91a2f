"""Speed presets (issue 26): what each preset turns on, explicit flags over a preset, the plan's Fast levers,
the CLI flag and the node's widget."""
from __future__ import annotations


import pytest
import torch

from lingbot_world.speed import compile as compile_mod
from lingbot_world.speed.levers import ChunkLevers
from lingbot_world.speed.options import SpeedOptionError, SpeedOptions
from lingbot_world.speed.presets import PRESET_NAMES, PRESETS, preset_options, resolve_preset
from lingbot_world.wan.dit import attention as attn

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _restore_attention():
    yield
    attn.set_backend("sdpa", CPU)


def test_the_presets_and_what_they_turn_on():
    assert PRESET_NAMES == ("exact", "fast", "draft", "auto")
    assert PRESETS["exact"].options == SpeedOptions("off", "bf16", "sdpa") and PRESETS["exact"].exact
    assert PRESETS["auto"].options == SpeedOptions("auto", "bf16", "auto") and PRESETS["auto"].exact
    assert PRESETS["fast"].options.compute == "auto" and not PRESETS["fast"].exact
    for name in ("exact", "auto", "fast"):
        assert PRESETS[name].levers == ChunkLevers()
    assert PRESETS["fast"].options.attention == "sdpa"  # FP8 attention measured slower for chunk shapes
    assert PRESETS["draft"].levers == ChunkLevers(steps=3, fold_context=True, window_frames=15, decode_bf16=True,
                                                  kv_fp8=True)
    assert not any(p.levers.decode_overlap for p in PRESETS.values())  # over the 22.5 GB budget on a 24 GB card
    assert PRESETS["draft"].options == PRESETS["fast"].options


def test_on_the_cpu_every_preset_resolves_to_the_exact_kernels_with_its_levers():
    for name in PRESET_NAMES:
        plan = resolve_preset(name, CPU)
        assert (plan.compile, plan.compute, plan.attention) == ("off", "bf16", "sdpa")
        assert plan.preset == name and plan.levers == PRESETS[name].levers
        assert plan.notes[0].startswith(f"speed preset {name}: ")
        assert plan.summary().startswith(f"preset={name}, compile=off")
    draft = resolve_preset("draft", CPU)
    assert any("3 steps per chunk" in n for n in draft.notes) and any("15 latent frames" in n for n in draft.notes)
    opts = draft.fast_run_options()
    assert opts["fold_context"] is True and opts["schedule"].timesteps == (999, 947, 825)
    assert draft.fast_window(21, 21) == 15
    assert resolve_preset("exact", CPU).fast_run_options() == {}
    assert resolve_preset("exact", CPU).to_json()["levers"] == {"steps": 4, "fold_context": False,
                                                                "window_frames": None, "decode_overlap": False,
                                                                "decode_bf16": False, "kv_fp8": False}


def test_auto_compiles_where_the_compiler_runs(monkeypatch):
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: None)
    assert resolve_preset("auto", CPU).compile == "off"  # compile auto is never on a CPU
    assert resolve_preset("auto", CPU, explicit={"compile": "blocks"}).compile == "blocks"
    assert resolve_preset("exact", CPU, explicit={"compile": "blocks"}).compile == "blocks"


def test_explicit_flags_win_and_impossible_ones_are_refused():
    assert preset_options("fast", {"compute": "bf16", "attention": None}) == SpeedOptions("auto", "bf16", "sdpa")
    with pytest.raises(SpeedOptionError, match="--compute fp8: .*CUDA GPU"):
        resolve_preset("draft", CPU, explicit={"compute": "fp8"})
    with pytest.raises(SpeedOptionError, match="speed preset 'turbo' does not exist"):
        resolve_preset("turbo", CPU)


def _parse(argv):
    import argparse

    from lingbot_world.cli.generate import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    from lingbot_world.cli.generate_request import GenerateRequest

    return GenerateRequest.from_args(parser.parse_args(["generate"] + argv))


def test_cli_speed_flag_and_explicit_overrides():
    from lingbot_world.cli import speed_flags

    request = _parse(["--speed", "draft"])
    assert request.speed == "draft"
    plan = speed_flags.speed_plan(request.speed_flags, CPU)
    assert plan.preset == "draft" and plan.levers.fold_context and plan.compute == "bf16"  # fp8 auto: bf16 on a CPU
    flags = _parse(["--speed", "exact", "--compile", "blocks"]).speed_flags
    assert flags.compile == "blocks" and flags.attention == "sdpa"
    flags = _parse(["--compute", "bf16", "--speed", "fast"]).speed_flags  # the order of the flags does not matter
    assert (flags.compute, flags.compile) == ("bf16", "auto")
    request = _parse([])
    assert request.speed is None and speed_flags.speed_plan(request.speed_flags, CPU).preset is None
    with pytest.raises(SystemExit):
        _parse(["--speed", "turbo"])


def test_fast_speed_plan_keeps_its_signature_and_carries_the_preset(monkeypatch):
    from lingbot_world.cli import speed_flags

    flags = speed_flags.SpeedFlags.given("draft", {"compile": "auto", "compute": "bf16", "attention": "auto"})
    plan = speed_flags.fast_speed_plan(flags, CPU, 7, before_compiler_check=None)
    assert plan.preset == "draft" and plan.fast_run_options()["fold_context"]
    plain = speed_flags.fast_speed_plan(speed_flags.SpeedFlags(compile="auto", compute="bf16", attention="auto"), CPU, 7)
    assert plain.preset is None and plain.fast_run_options() == {}
    asked = []
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: asked.append(1) or None)
    gpu = speed_flags.fast_speed_plan(speed_flags.SpeedFlags.given(
        "exact", {"compile": "blocks", "compute": "bf16", "attention": "sdpa"}, {"compile"}), CPU, 7)
    assert gpu.compile == "blocks" and gpu.preset == "exact" and asked == [1]


def test_speed_node_offers_the_presets(monkeypatch):
    from lingbot_world.nodes import speed_node

    opt = speed_node.LingBotSpeedOptions.INPUT_TYPES()["optional"]["speed"]
    assert opt[0] == ["custom", "exact", "fast", "draft", "auto"] and opt[1]["default"] == "custom"
    seen = []

    def plan_speed(options, weights="nf4", preset=None):
        seen.append((options, preset))
        return resolve_preset(preset or "auto", CPU)

    monkeypatch.setattr(speed_node, "plan_speed", plan_speed)
    monkeypatch.setattr(speed_node, "show_on_node", lambda text: None)
    speed_node.LingBotSpeedOptions().choose("blocks", "fp8", "fp8", speed="draft")
    assert seen[-1] == (PRESETS["draft"].options, "draft")  # the preset replaces the three widgets
    speed_node.LingBotSpeedOptions().choose("blocks", "fp8", "fp8")
    assert seen[-1] == (SpeedOptions("blocks", "fp8", "fp8"), None)  # custom: the widgets decide
    with pytest.raises(ValueError, match="speed='turbo' is not a preset"):
        speed_node.LingBotSpeedOptions().choose(speed="turbo")

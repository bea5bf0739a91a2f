"""Speed presets (issue 26): what each preset turns on, explicit flags over a preset, the plan's Fast levers,
the CLI flag and the node's widget."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lingbot_world.speed import compile as compile_mod
from lingbot_world.speed.levers import ChunkLevers
from lingbot_world.speed.options import SpeedOptionError, SpeedOptions
from lingbot_world.speed.presets import PRESET_NAMES, PRESETS, preset_options, resolve_preset
from lingbot_world.wan.dit import attention as attn
from lingbot_world.world.models import V1_FAST

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
    assert PRESETS["exact"].levers == ChunkLevers()  # the release's schedule and its float32 decode
    assert PRESETS["auto"].levers == ChunkLevers(decode_dtype="fp16")
    assert PRESETS["fast"].levers == ChunkLevers(kv_fp8=True, decode_dtype="fp16")  # its K/V cache in FP8
    assert PRESETS["fast"].options.attention == "sdpa"  # FP8 attention measured slower for chunk shapes
    assert PRESETS["draft"].levers == ChunkLevers(steps=3, fold_context=True, window_frames=15, decode_dtype="fp16",
                                                  kv_fp8=True)
    assert not any(p.levers.decode_overlap for p in PRESETS.values())  # over the 22.5 GB budget on a 24 GB card
    assert PRESETS["draft"].options == PRESETS["fast"].options


def test_on_the_cpu_every_preset_resolves_to_the_exact_kernels_with_its_levers():
    for name in PRESET_NAMES:
        plan = resolve_preset(name, CPU)
        assert (plan.compile, plan.compute, plan.attention) == ("off", "bf16", "sdpa")
        # the release's float32 decode off a CUDA GPU (half-precision convolutions are slower on a CPU)
        assert plan.preset == name and plan.levers == dataclasses.replace(PRESETS[name].levers, decode_dtype="float32")
        assert plan.notes[0].startswith(f"speed preset {name}: ")
        assert plan.summary().startswith(f"preset={name}, compile=off")
    draft = resolve_preset("draft", CPU)
    assert any("3 steps per chunk" in n for n in draft.notes) and any("15 latent frames" in n for n in draft.notes)
    opts = draft.fast_run_options(V1_FAST.recipe)
    assert opts["fold_context"] is True and opts["schedule"].timesteps == (999, 947, 825)
    assert draft.fast_window(21, 21) == 15
    assert resolve_preset("exact", CPU).fast_run_options(V1_FAST.recipe) == {}
    assert resolve_preset("exact", CPU).to_json()["levers"] == {"steps": 4, "fold_context": False,
                                                                "window_frames": None, "decode_overlap": False,
                                                                "decode_dtype": "float32", "kv_fp8": False}


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
    from lingbot_world.cli.requests import GenerateRequest

    return GenerateRequest.from_args(parser.parse_args(["generate"] + argv))


def test_cli_speed_flag_and_explicit_overrides():
    from lingbot_world.speed import plans as speed_flags

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
    from lingbot_world.speed import plans as speed_flags

    flags = speed_flags.SpeedFlags.given("draft", {"compile": "auto", "compute": "bf16", "attention": "auto"})
    plan = speed_flags.fast_speed_plan(flags, CPU, 7, before_compiler_check=None)
    assert plan.preset == "draft" and plan.fast_run_options(V1_FAST.recipe)["fold_context"]
    plain = speed_flags.fast_speed_plan(speed_flags.SpeedFlags(compile="auto", compute="bf16", attention="auto"), CPU, 7)
    assert plain.preset is None and plain.fast_run_options(V1_FAST.recipe) == {}
    asked = []
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: asked.append(1) or None)
    gpu = speed_flags.fast_speed_plan(speed_flags.SpeedFlags.given(
        "exact", {"compile": "blocks", "compute": "bf16", "attention": "sdpa"}, {"compile"}), CPU, 7)
    assert gpu.compile == "blocks" and gpu.preset == "exact" and asked == [1]


def _planned_by_the_node(monkeypatch, speed_node) -> list:
    """The node's plan_speed calls, (options, preset, chunk_steps) each, resolved on the CPU instead of ComfyUI's
    device."""
    seen = []

    def plan_speed(options, weights="nf4", preset=None, chunk_steps=None):
        seen.append((options, preset, chunk_steps))
        return resolve_preset(preset or "auto", CPU, chunk_steps=chunk_steps)

    monkeypatch.setattr(speed_node, "plan_speed", plan_speed)
    monkeypatch.setattr(speed_node, "show_on_node", lambda text: None)
    return seen


def test_speed_node_offers_the_presets(monkeypatch):
    from lingbot_world.nodes import speed as speed_node

    opt = speed_node.LingBotSpeedOptions.INPUT_TYPES()["optional"]["speed"]
    assert opt[0] == ["custom", "exact", "fast", "draft", "auto"] and opt[1]["default"] == "custom"
    seen = _planned_by_the_node(monkeypatch, speed_node)
    speed_node.LingBotSpeedOptions().choose(speed="draft")
    assert seen[-1][:2] == (PRESETS["draft"].options, "draft")  # widgets at "from preset": the preset's choices
    speed_node.LingBotSpeedOptions().choose("auto", "bf16", "auto", speed="draft")  # a workflow saved before
    assert seen[-1][:2] == (PRESETS["draft"].options, "draft")  # runs as it did: the preset replaces them
    speed_node.LingBotSpeedOptions().choose("auto", "bf16", "from preset", speed="draft")
    assert seen[-1][:2] == (SpeedOptions("auto", "bf16", PRESETS["draft"].options.attention), "draft")
    # a widget set to a value is kept over the preset's, as a CLI flag over --speed: the RTX 40xx real-time play
    speed_node.LingBotSpeedOptions().choose("from preset", "fp16acc", "sage", speed="draft", chunk_steps="2")
    assert seen[-1] == (SpeedOptions(PRESETS["draft"].options.compile, "fp16acc", "sage"), "draft", 2)
    speed_node.LingBotSpeedOptions().choose("blocks", "fp8", "fp8")
    assert seen[-1][:2] == (SpeedOptions("blocks", "fp8", "fp8"), None)  # custom: the widgets decide
    speed_node.LingBotSpeedOptions().choose(compute="int8")
    assert seen[-1][:2] == (SpeedOptions(compute="int8"), None)  # custom, the others "from preset": the defaults
    with pytest.raises(ValueError, match="compute='fp4'; choose one of from preset, auto, bf16"):
        speed_node.LingBotSpeedOptions().choose(compute="fp4")
    with pytest.raises(ValueError, match="speed='turbo' is not a preset"):
        speed_node.LingBotSpeedOptions().choose(speed="turbo")


def test_chunk_steps_replace_the_presets_step_count_and_say_so():
    draft2 = resolve_preset("draft", CPU, chunk_steps=2)
    assert draft2.levers == dataclasses.replace(PRESETS["draft"].levers, steps=2, decode_dtype="float32")
    assert draft2.fast_run_options(V1_FAST.recipe)["schedule"].timesteps == (999, 825) and draft2.fast_run_options(V1_FAST.recipe)["fold_context"]
    assert any(n.startswith("chunk steps 2: 2 denoising calls per Fast chunk instead of the preset draft's 3")
               for n in draft2.notes)
    assert resolve_preset("draft", CPU, chunk_steps=3).levers == resolve_preset("draft", CPU).levers  # no note
    assert not any(n.startswith("chunk steps") for n in resolve_preset("draft", CPU, chunk_steps=3).notes)
    from lingbot_world.speed.options import resolve_speed
    from lingbot_world.speed.presets import attach_preset

    plain = attach_preset(resolve_speed(SpeedOptions(), CPU), None, 3)  # no preset: over the release's schedule
    assert plain.preset is None and plain.levers == ChunkLevers(steps=3)  # and the CPU's float32 decode
    assert plain.fast_run_options(V1_FAST.recipe)["schedule"].timesteps == (999, 947, 825)
    assert any("instead of the release's 4" in n for n in plain.notes)
    with pytest.raises(SpeedOptionError, match="chunk steps 5: the Fast model's schedule has 4, 3, 2 steps"):
        resolve_preset("draft", CPU, chunk_steps=5)


def test_on_a_cuda_gpu_every_preset_but_exact_decodes_in_fp16_and_no_preset_is_autos():
    from lingbot_world.speed.options import SpeedPlan
    from lingbot_world.speed.presets import attach_preset

    gpu = SpeedPlan("off", "bf16", "sdpa", "cuda:0")  # the levers alone: attach_preset reads only the device
    assert attach_preset(gpu, "exact").levers.decode_dtype == "float32"
    for name in ("auto", "fast", "draft"):
        plan = attach_preset(gpu, name)
        assert plan.levers == PRESETS[name].levers and plan.levers.decode_dtype == "fp16"
        assert any(n == f"speed preset {name}: the VAE decode in fp16 (approximate frames)" for n in plan.notes)
    plain = attach_preset(gpu, None)
    assert plain.preset is None and plain.levers == PRESETS["auto"].levers
    assert "speed: the VAE decode in fp16 (approximate frames)" in plain.notes


def test_cli_chunk_steps_reach_the_plan_and_are_a_fast_model_flag():
    from lingbot_world.speed import plans as speed_flags
    from lingbot_world.cli.errors import UsageError
    from lingbot_world.cli.checks import check_model_flags

    request = _parse(["--model", "fast", "--speed", "draft", "--chunk-steps", "2"])
    assert request.chunk_steps == 2 and request.speed_flags.chunk_steps == 2
    plan = speed_flags.fast_speed_plan(request.speed_flags, CPU, 7)
    assert plan.levers.steps == 2 and plan.preset == "draft" and plan.levers.window_frames == 15
    check_model_flags(request)
    assert _parse(["--model", "fast"]).speed_flags.chunk_steps is None
    with pytest.raises(SystemExit):
        _parse(["--model", "fast", "--chunk-steps", "1"])
    with pytest.raises(UsageError, match="--chunk-steps is a flag of the Fast model: add --model fast"):
        check_model_flags(_parse(["--chunk-steps", "2"]))
    with pytest.raises(UsageError, match="leave --steps out; --chunk-steps 2|3|4 sets its steps per chunk"):
        check_model_flags(_parse(["--model", "fast", "--steps", "2"]))


def test_speed_node_chunk_steps_widget(monkeypatch):
    from lingbot_world.nodes import speed as speed_node

    opt = speed_node.LingBotSpeedOptions.INPUT_TYPES()["optional"]["chunk_steps"]
    assert opt[0] == ["from preset", "4", "3", "2"] and opt[1]["default"] == "from preset"
    seen = _planned_by_the_node(monkeypatch, speed_node)
    (plan,) = speed_node.LingBotSpeedOptions().choose(speed="draft", chunk_steps="2")
    assert seen[-1][1:] == ("draft", 2) and plan.levers.steps == 2
    speed_node.LingBotSpeedOptions().choose(speed="draft")
    assert seen[-1][1:] == ("draft", None)
    speed_node.LingBotSpeedOptions().choose(chunk_steps="3")
    assert seen[-1][1:] == (None, 3)
    with pytest.raises(ValueError, match="chunk_steps='7'; choose one of from preset, 4, 3, 2"):
        speed_node.LingBotSpeedOptions().choose(chunk_steps="7")


def test_the_players_fast_render_replays_the_played_chunk_steps(tmp_path):
    """"Render this path" at 720p must run the played schedule: --chunk-steps goes to the Fast render only (the
    base Cam render refuses Fast flags)."""
    from pathlib import Path
    from types import SimpleNamespace

    from lingbot_world.cli.play import _render_source
    from lingbot_world.cli.requests import PlayRequest
    from lingbot_world.player.render_job import render_command

    speed = resolve_preset("draft", CPU, chunk_steps=2)
    for steps, want in ((2, ["--chunk-steps", "2"]), (None, [])):
        request = PlayRequest(demo=True, speed="draft", chunk_steps=steps)
        played = SimpleNamespace(window=15, sink=3, model_name="v1-fast")  # the session's settings
        src = _render_source(request, "64*112", "cpu", "cpu", speed, played)
        fast = render_command(src, "fast720", "w-8", Path("i.png"), "p", tmp_path / "o.mp4")
        cam = render_command(src, "cam", "w-8", Path("i.png"), "p", tmp_path / "o.mp4")
        got = fast[fast.index("--chunk-steps"):fast.index("--chunk-steps") + 2] if "--chunk-steps" in fast else []
        assert got == want and "--chunk-steps" not in cam
        assert fast[fast.index("--speed") + 1] == "draft"


def test_compile_auto_compiles_a_narrow_model_only_into_its_graphs_and_an_explicit_choice_stays(monkeypatch):
    """The v2 1.3B's small kernels wait on the host: compiled per-token work launched from Python made its chunk
    slower on an H200 (0.905 against 0.657 s of DiT), replayed from CUDA graphs faster (0.572 against 0.665 s once
    the window rolled). So `--compile auto` (the presets') compiles it only into the graphs ("graphs"), or not at all
    where graphs are off; the 14B keeps its compile, and an explicit --compile blocks is kept for every model."""
    import dataclasses

    from lingbot_world.speed.options import GRAPHS_ENV, SpeedPlan, fit_to_model
    from lingbot_world.world.models import V1_FAST, V2_14B, V2_1_3B

    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    auto = SpeedPlan("blocks", "bf16", "sdpa", "cuda:0", notes=["compile auto: blocks (...)"], compile_requested="auto")
    narrow = fit_to_model(auto, V2_1_3B.dit)
    assert narrow.compile == "graphs" and narrow.notes[0].startswith("compile auto: a model 1536 wide")
    assert not any(n.startswith("compile auto: blocks") for n in narrow.notes)
    monkeypatch.setenv(GRAPHS_ENV, "0")
    no_graphs = fit_to_model(auto, V2_1_3B.dit)
    assert no_graphs.compile == "off" and no_graphs.notes[0].startswith("compile auto: off for a model 1536 wide")
    monkeypatch.delenv(GRAPHS_ENV)
    assert fit_to_model(auto, V1_FAST.dit) is auto and fit_to_model(auto, V2_14B.dit) is auto
    explicit = dataclasses.replace(auto, compile_requested="blocks")
    assert fit_to_model(explicit, V2_1_3B.dit) is explicit and fit_to_model(None, V2_1_3B.dit) is None

"""--compile auto for the Fast model: a short video runs eagerly (the compile warm-up outweighs what it saves)."""
from dataclasses import replace

from lingbot_world.speed.plans import FAST_COMPILE_MIN_CHUNKS, SpeedFlags, fast_compile_policy
from lingbot_world.speed.options import SpeedPlan


def _plan():
    return SpeedPlan("blocks", "bf16", "sdpa", "cuda", notes=["compile auto: blocks (...)", "attention auto: sdpa"])


def test_short_fast_videos_run_eagerly_and_say_why():
    plan = fast_compile_policy(_plan(), SpeedFlags(compile="auto"), 7)
    assert plan.compile == "off" and (plan.compute, plan.attention) == ("bf16", "sdpa")
    assert plan.notes[0].startswith("compile auto: off for a Fast video of 7 chunks")
    assert "--compile blocks forces it" in plan.notes[0] and "attention auto: sdpa" in plan.notes
    assert not any(n.startswith("compile auto: blocks") for n in plan.notes)


def test_long_videos_and_explicit_choices_keep_compile():
    assert fast_compile_policy(_plan(), SpeedFlags(compile="auto"), FAST_COMPILE_MIN_CHUNKS).compile == "blocks"
    assert fast_compile_policy(_plan(), SpeedFlags(compile="blocks"), 3).compile == "blocks"
    off = SpeedPlan("off", "bf16", "sdpa", "cpu", notes=["compile auto: off on the CPU"])
    assert fast_compile_policy(off, SpeedFlags(compile="auto"), 3) is off


def test_the_compiler_check_waits_for_the_background_imports_only_when_it_runs(monkeypatch):
    import torch

    from lingbot_world.speed import plans as speed_flags
    from lingbot_world.speed import compile as compile_mod

    waited = []
    monkeypatch.setattr(compile_mod, "unavailable_reason", lambda device: waited.append("checked") or None)
    flags = SpeedFlags(compile="auto", compute="bf16", attention="auto", weights="nf4")
    plan = speed_flags.fast_speed_plan(flags, torch.device("cpu"), 7, before_compiler_check=lambda: waited.append(1))
    assert plan.compile == "off" and waited == []  # auto on the CPU: decided without the compiler
    flags = replace(flags, compile="blocks")
    plan = speed_flags.fast_speed_plan(flags, torch.device("cpu"), 7, before_compiler_check=lambda: waited.append(1))
    assert plan.compile == "blocks" and waited == [1, "checked"]  # the wait comes first


def test_a_short_video_on_a_gpu_never_asks_the_compiler(monkeypatch):
    import torch

    from lingbot_world.speed import plans as speed_flags

    asked = []
    monkeypatch.setattr(speed_flags, "speed_plan",
                        lambda flags, device: asked.append(flags.compile) or SpeedPlan(flags.compile, "bf16", "sdpa",
                                                                                        "cuda:0"))
    flags = SpeedFlags(compile="auto", compute="bf16", attention="auto", weights="nf4")
    plan = speed_flags.fast_speed_plan(flags, torch.device("cuda", 0), 7, before_compiler_check=lambda: asked.append(1))
    assert asked == ["off"] and plan.compile == "off" and plan.notes[0].startswith("compile auto: off for a Fast video")
    speed_flags.fast_speed_plan(flags, torch.device("cuda", 0), FAST_COMPILE_MIN_CHUNKS,
                                before_compiler_check=lambda: asked.append(1))
    assert asked == ["off", 1, "auto"]  # a long video: the check (after the wait) decides


def test_a_continuation_follows_the_kernels_its_video_was_made_with():
    from lingbot_world.speed.plans import follow_started_compile

    auto = SpeedFlags(compile="auto")
    available = _plan()  # the compiler runs here
    short = fast_compile_policy(available, auto, 3)  # a 3-chunk part alone would run eagerly
    plan = follow_started_compile(short, available, auto, "blocks")  # ... but the video was compiled
    assert plan.compile == "blocks" and plan.notes[0].startswith("compile auto: blocks, as the continued video")
    assert sum(n.startswith("compile auto:") for n in plan.notes) == 1
    long = fast_compile_policy(available, auto, FAST_COMPILE_MIN_CHUNKS)
    assert follow_started_compile(long, available, auto, "off").compile == "off"  # made eagerly: stays eager
    # an explicit choice, an older state (nothing recorded), or a machine without the compiler: as decided
    assert follow_started_compile(short, available, SpeedFlags(compile="off"), "blocks") is short
    assert follow_started_compile(short, available, auto, "") is short
    no_compiler = SpeedPlan("off", "bf16", "sdpa", "cuda", notes=["compile auto: off (no Triton)"])
    assert follow_started_compile(no_compiler, no_compiler, auto, "blocks") is no_compiler

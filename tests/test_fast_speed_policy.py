"""--compile auto for the Fast model: a short video runs eagerly (the compile warm-up outweighs what it saves)."""
from types import SimpleNamespace

from lingbot_world.cli.speed_flags import FAST_COMPILE_MIN_CHUNKS, fast_compile_policy
from lingbot_world.speed.options import SpeedPlan


def _plan():
    return SpeedPlan("blocks", "bf16", "sdpa", "cuda", notes=["compile auto: blocks (...)", "attention auto: sdpa"])


def test_short_fast_videos_run_eagerly_and_say_why():
    plan = fast_compile_policy(_plan(), SimpleNamespace(compile="auto"), 7)
    assert plan.compile == "off" and (plan.compute, plan.attention) == ("bf16", "sdpa")
    assert plan.notes[0].startswith("compile auto: off for a Fast video of 7 chunks")
    assert "--compile blocks forces it" in plan.notes[0] and "attention auto: sdpa" in plan.notes
    assert not any(n.startswith("compile auto: blocks") for n in plan.notes)


def test_long_videos_and_explicit_choices_keep_compile():
    assert fast_compile_policy(_plan(), SimpleNamespace(compile="auto"), FAST_COMPILE_MIN_CHUNKS).compile == "blocks"
    assert fast_compile_policy(_plan(), SimpleNamespace(compile="blocks"), 3).compile == "blocks"
    off = SpeedPlan("off", "bf16", "sdpa", "cpu", notes=["compile auto: off on the CPU"])
    assert fast_compile_policy(off, SimpleNamespace(compile="auto"), 3) is off

"""The typed requests the CLI reads its flags into (cli/requests.py): frozen, read once,
and changed only by making a new one."""
import dataclasses
from pathlib import Path

import pytest

from lingbot_world.cli import build_parser
from lingbot_world.cli.requests import DEMO_FRAMES, DEMO_SIZE, GenerateRequest, PlayRequest


def _generate(*argv) -> GenerateRequest:
    return GenerateRequest.from_args(build_parser().parse_args(["generate", *argv]))


def test_the_request_holds_every_flag_frozen():
    request = _generate("--guide-scale", "4", "6", "--lora", "a.safetensors", "--lora", "b.safetensors:0.5",
                        "--speed", "fast", "--compute", "bf16")
    assert request.guide_scale == (4.0, 6.0) and request.lora == ("a.safetensors", "b.safetensors:0.5")
    assert request.speed_explicit == frozenset({"compute"})
    assert (request.speed_flags.compute, request.speed_flags.attention) == ("bf16", "sdpa")  # the preset's sdpa
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.frames = 5
    # the parser's defaults are the request's: a request built in code means what the bare command means
    assert _generate() == GenerateRequest()


def test_demo_defaults_make_a_new_request():
    request = _generate("--demo")
    demo = request.with_demo_defaults()
    assert (demo.size, demo.frames, demo.device, demo.out) == (DEMO_SIZE, DEMO_FRAMES, "cpu", Path("lingbot_demo.mp4"))
    assert demo.camera and demo.image and demo.prompt
    assert (request.size, request.frames, request.camera, request.out) == ("480*832", None, None, None)
    given = _generate("--demo", "--actions", "w-8", "--size", "480*832", "--device", "cpu").with_demo_defaults()
    assert given.frames is None and given.camera is None  # an action string sets its own length and steers alone


def test_each_demo_writes_a_video_of_its_own_name():
    """A Fast or v2 demo never replaces the base demo's lingbot_demo.mp4 (nor another model's)."""
    from lingbot_world.cli.generate_causal import with_demo_defaults as with_fast_demo_defaults

    outs = {m: with_fast_demo_defaults(_generate("--demo", "--model", m)).out for m in ("fast", "v2-14b", "v2-1.3b")}
    assert outs == {"fast": Path("lingbot_demo_fast.mp4"), "v2-14b": Path("lingbot_demo_v2-14b.mp4"),
                    "v2-1.3b": Path("lingbot_demo_v2-1.3b.mp4")}
    frames = {m: with_fast_demo_defaults(_generate("--demo", "--model", m)).frames for m in ("fast", "v2-1.3b")}
    assert frames == {"fast": 33, "v2-1.3b": 45}  # three chunks of each model
    assert with_fast_demo_defaults(_generate("--demo", "--model", "fast", "--out", "x.mp4")).out == Path("x.mp4")


def test_play_request():
    request = PlayRequest.from_args(build_parser().parse_args(["play", "--demo", "--speed", "draft"]))
    assert request.demo and request.window is None and request.speed_flags.speed == "draft"  # the model's window
    assert PlayRequest.from_args(build_parser().parse_args(["play"])) == PlayRequest()


def test_the_speed_flags_carry_the_weights_for_every_command():
    """The speed plan is resolved for the weights that run: stored FP8 weights run their GEMMs as stored, so a
    plan resolved as if for NF4 would pick FP8 activations the weights cannot take."""
    play = PlayRequest.from_args(build_parser().parse_args(["play", "--weights", "fp8", "--speed", "fast"]))
    assert play.speed_flags.weights == "fp8" and play.speed_flags.speed == "fast"
    assert _generate("--model", "fast", "--weights", "fp8").speed_flags.weights == "fp8"

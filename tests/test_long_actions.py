"""Action strings longer than a file name may be (255 bytes) are action strings, not files that fail to open: inline
on the command line, from a text file (how the player hands a played hour to its render), in every check before the
run, and through a whole Fast demo run."""
from __future__ import annotations

import numpy as np
import pytest

from lingbot_world.cli import main
from lingbot_world.wan.control.actions import KeyTimeline, pad_to_4n1

PATTERN = ("w", "aw", "d", "none", "jw", "l", "s", "ik")


def long_string(segments: int, frames: int) -> str:
    """`segments` segments of `frames` frames each, neighbours with different keys (nothing merges)."""
    return ",".join(f"{PATTERN[i % len(PATTERN)]}-{frames}" for i in range(segments))


def test_an_hour_of_keys_passes_every_check_inline_and_from_a_file(tmp_path):
    """10,000 segments of 6 frames: 60,000 frames, an hour and two minutes at 16 fps, 47 kB of text."""
    from lingbot_world.cli import build_parser
    from lingbot_world.cli.checks import check_text_flags
    from lingbot_world.cli.outputs import generate_inputs
    from lingbot_world.cli.requests import GenerateRequest
    from lingbot_world.world.controls import requested_frames
    from lingbot_world.loaders.action_files import action_string_of, looks_like_path, path_exists, read_key_source

    text = long_string(10_000, 6)
    assert len(text) > 40_000 and not path_exists(text) and not looks_like_path(text)
    keys = KeyTimeline.from_string(text)
    assert keys.frames == 60_000
    saved = tmp_path / "play_1.actions.txt"
    saved.write_text(text + "\n")
    for spec in (text, str(saved)):
        request = GenerateRequest.from_args(build_parser().parse_args(
            ["generate", "--demo", "--model", "fast", f"--actions={spec}", "--out", str(tmp_path / "o.mp4")]))
        check_text_flags(request)
        assert requested_frames(request.actions, request.frames) == pad_to_4n1(60_000)
        assert action_string_of(spec) == text
        assert np.array_equal(read_key_source(spec).keys.pressed, keys.pressed)
        assert [flag for flag, _ in generate_inputs(request)] == ([] if spec == text else ["--actions"])
    assert read_key_source(str(saved)).label == "actions in play_1.actions.txt"


def test_a_long_preset_combination_is_a_preset_not_a_file():
    from lingbot_world.world.controls import camera_path

    spec = "+".join(["dolly_in", "pan_left"] * 30)  # 509 characters
    path, zoom = camera_path(spec, 9, 1.0)
    assert path.poses.shape[0] >= 9 and not zoom


def test_an_action_file_that_is_missing_or_wrong_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.actions.txt"
    bad.write_text("w-8,x-3")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    for spec, expect in ((tmp_path / "gone.txt", f"--actions: action file not found: {tmp_path / 'gone.txt'}"),
                         (bad, "--actions: action string 'w-8,x-3': segment 2 'x-3' has key(s) 'x'"),
                         (empty, f"--actions: {empty} is empty; it should hold keys such as 'w-8,a-4'")):
        rc = main(["generate", "--demo", "--model", "fast", "--actions", str(spec), "--out", str(tmp_path / "o.mp4")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and expect in err[0], err


@pytest.mark.slow
def test_a_string_longer_than_a_file_name_runs_inline_and_from_its_file(demo_ckpt, tmp_path):
    """The issue's repro, shorter: 30 frames of keys in 269 characters (was `[Errno 36] File name too long`)."""
    import imageio.v3 as iio

    text = ",".join("wasdijkl-1" if i % 2 == 0 else "none-1" for i in range(30))
    assert len(text.encode()) > 255
    (tmp_path / "keys.txt").write_text(text)
    common = ["generate", "--demo", "--demo-dir", str(demo_ckpt), "--model", "fast", "--quiet",
              "--cache-dir", str(tmp_path / "cache")]
    assert main([*common, "--actions", text, "--out", str(tmp_path / "inline.mp4")]) == 0
    assert main([*common, "--actions", str(tmp_path / "keys.txt"), "--out", str(tmp_path / "file.mp4")]) == 0
    inline, from_file = iio.imread(tmp_path / "inline.mp4"), iio.imread(tmp_path / "file.mp4")
    assert inline.shape[0] >= 21 and np.array_equal(inline, from_file)

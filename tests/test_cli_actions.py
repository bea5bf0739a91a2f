"""`lingbot-world generate --actions` on the tiny demo checkpoints (Cam and Act experts, CPU)."""
import numpy as np
import pytest
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.wan.control.actions import KeyTimeline


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos")
    return {"camera": root / "cam", "act": root / "act", "cache": root / "text_cache"}


def _run(demos, kind, out, *extra):
    argv = ["generate", "--demo", kind, "--demo-dir", str(demos[kind]), "--out", str(out),
            "--cache-dir", str(demos["cache"]), "--steps", "2", "--size", "32*64", *extra]  # 32x48 pixels
    return main(argv)


def _frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


def test_action_string_drives_the_cam_model_and_draws_the_picture(demos, tmp_path, capsys):
    assert _run(demos, "camera", tmp_path / "s", "--actions", "w-4,dl-3", "--trajectory-picture") == 0
    out = capsys.readouterr().out
    assert "7 frames of keys, video of 9 frames (3 latent), camera path" in out  # 7 -> padded to 4n+1
    assert _frames(tmp_path / "s").shape[0] == 9
    pic = Image.open(tmp_path / "s_trajectory.png")
    assert pic.width == 960 and pic.height > 600  # the views plus the key timeline under them
    # the same keys as key files give the same video
    keys = KeyTimeline.from_string("w-4,dl-3,none-2")  # key files are not padded: they cover the video
    folder = tmp_path / "keys"
    folder.mkdir()
    np.save(folder / "wasd_action.npy", keys.wasd)
    np.save(folder / "ijkl_action.npy", keys.ijkl)
    assert _run(demos, "camera", tmp_path / "f", "--actions", str(folder), "--frames", "9", "--quiet") == 0
    assert np.array_equal(_frames(tmp_path / "f"), _frames(tmp_path / "s"))


def test_act_model_runs_the_release_act_input(demos, tmp_path, capsys):
    assert _run(demos, "act", tmp_path / "a", "--frames", "9") == 0  # default: examples/05 action.npy + poses.npy
    out = capsys.readouterr().out
    assert "(action.npy + poses.npy) -> 9 frames, 3 latent" in out
    a = _frames(tmp_path / "a")
    assert a.shape == (9, 32, 48, 3) and a.std() > 0


def test_bad_key_input_is_one_line_and_exit_code_2(demos, tmp_path, capsys):
    cases = [
        (("camera", "--actions", "w-4,,a-2"), "segment 2 is empty"),
        (("camera", "--actions", "w-12", "--frames", "9"), "12 frames of keys but the video has 9"),
        (("camera", "--actions", "w-4", "--camera", "static"), "either --camera"),
        (("camera", "--actions", str(tmp_path)), "has no wasd_action.npy or ijkl_action.npy"),
        (("act", "--camera", "dolly_in"), "an Act model with 7-channel control"),
    ]
    for (kind, *extra), fragment in cases:
        assert _run(demos, kind, tmp_path / "x", *extra) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err, err

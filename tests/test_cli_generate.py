"""`lingbot-world generate --demo`: the whole pipeline on the tiny random-weight checkpoint (CPU)."""
import numpy as np
import pytest
from PIL import Image

from lingbot_world.cli import main


@pytest.fixture(scope="module")
def demo_dir(demo_ckpt, demo_text_cache):
    return demo_ckpt  # its text_cache/ holds the demo prompts


def _frames(folder):
    files = sorted(folder.glob("frame_*.png"))
    return np.stack([np.asarray(Image.open(f)) for f in files])


def _generate(demo_dir, out, *extra):
    argv = ["generate", "--demo", "--demo-dir", str(demo_dir), "--out", str(out), "--quiet",
            "--cache-dir", str(demo_dir / "text_cache"), *extra]
    assert main(argv) == 0
    return _frames(out)


def test_demo_runs_and_is_deterministic(demo_dir, tmp_path):
    a = _generate(demo_dir, tmp_path / "a", "--seed", "3")
    # 17 frames at 48x112 (the demo's 64*112 max area with the 16:9 image), RGB uint8
    assert a.shape == (17, 48, 112, 3) and a.dtype == np.uint8
    assert a.std() > 0  # not a constant image
    b = _generate(demo_dir, tmp_path / "b", "--seed", "3")
    assert np.array_equal(a, b)
    c = _generate(demo_dir, tmp_path / "c", "--seed", "4", "--camera", "static", "--steps", "8")
    assert c.shape == a.shape and not np.array_equal(a, c)


def test_demo_writes_mp4(demo_dir, tmp_path):
    imageio = pytest.importorskip("imageio.v2")
    out = tmp_path / "demo.mp4"
    main(["generate", "--demo", "--demo-dir", str(demo_dir), "--out", str(out), "--quiet", "--steps", "6",
          "--cache-dir", str(demo_dir / "text_cache")])
    frames = imageio.mimread(out)
    assert len(frames) == 17 and frames[0].shape[:2] == (48, 112)


def test_bad_arguments_are_reported(demo_dir, tmp_path, capsys):
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--frames", "10", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "frame count 10" in err and "9" in err and "13" in err  # names the nearest valid counts
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--camera", "no_such_preset"])
    assert rc == 2 and "no_such_preset" in capsys.readouterr().err

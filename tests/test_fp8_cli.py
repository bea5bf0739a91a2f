"""`--weights fp8` through the doors: `generate --model fast` and a played session on the demo's FP8 copy give the
same frames (FP8 GEMMs emulated on the CPU), different from NF4's; the flag is refused where it cannot apply, and the
player's Fast render replays with it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, open_session

IMAGE = "assets/examples/00/image.jpg"
PROMPT = "a lake with a lone tree"
SIZE = "64*112"
KEYS = ("w-8", "a-12")


@pytest.fixture
def demo(copy_demo) -> Path:
    """A private copy of the demo: its FP8 copy is added to it (the session's demo stays as built)."""
    return copy_demo()


def _generate(demo_ckpt, tmp_path, weights: str) -> np.ndarray:
    out = tmp_path / f"batch_{weights}"
    code = main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--weights", weights,
                 "--rule", "continuable", "--actions", ",".join(KEYS), "--image", IMAGE, "--prompt", PROMPT,
                 "--size", SIZE, "--quiet", "--cache-dir", str(tmp_path / "text"), "--out", str(out)])
    assert code == 0
    return np.stack([np.asarray(Image.open(f)) for f in sorted(out.glob("frame_*.png"))])


def test_fp8_weights_play_as_the_batch_run_and_differ_from_nf4(demo, tmp_path):
    demo_ckpt = demo
    batch = _generate(demo_ckpt, tmp_path, "fp8")
    settings = WorldSettings(size=SIZE, weights="fp8", text=TextSettings(device="cpu", cache_dir=tmp_path / "text"))
    with open_session(WorldFiles.demo(demo_ckpt, weights="fp8"), settings, device="cpu") as s:
        assert "fp8" in s.files.dit.name
        s.start(IMAGE, PROMPT)
        played = np.concatenate([b.frames for k in KEYS for b in s.step(k)])
    assert played.shape == batch.shape and np.array_equal(played, batch)
    assert not np.array_equal(batch, _generate(demo_ckpt, tmp_path, "nf4"))


def test_fp8_weights_are_refused_where_they_cannot_run(demo_ckpt, tmp_path, capsys, monkeypatch):
    from lingbot_world.quant import compute

    def one_line(argv):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    base = ["generate", "--demo", "--demo-dir", str(demo_ckpt), "--out", str(tmp_path / "x.mp4"), "--weights", "fp8"]
    assert "--weights fp8 is for the Fast model" in one_line(base)
    no_fp8 = "this card is sm86: use --weights nf4"
    monkeypatch.setattr(compute, "stored_weights_unavailable", lambda kind, device: no_fp8)
    assert "sm86" in one_line(base + ["--model", "fast"])
    assert "sm86" in one_line(["play", "--demo", "--demo-dir", str(demo_ckpt), "--weights", "fp8", "--no-browser",
                               "--port", "0", "--out-dir", str(tmp_path / "o")])
    assert not (tmp_path / "x.mp4").exists()


def test_the_players_fast_render_keeps_the_weights():
    from lingbot_world.player.options import RenderSource
    from lingbot_world.player.render_job import render_command

    src = RenderSource(("--demo",), 42, SIZE, 21, 3, demo=True, fast_weights="fp8")
    fast = render_command(src, "fast720", "w-8", Path(IMAGE), PROMPT, Path("out.mp4"))
    cam = render_command(src, "cam", "w-8", Path(IMAGE), PROMPT, Path("out.mp4"))
    assert fast[fast.index("--weights") + 1] == "fp8" and "--weights" not in cam

"""A CPU run's log says where things really are: nothing 'on the GPU', loads 'into RAM' with sizes a tiny model
shows, the text encoder 'on the CPU' (never 'on auto')."""
from __future__ import annotations

import pytest

from lingbot_world.cli import main

pytestmark = pytest.mark.slow


def _lines(capsys) -> list[str]:
    out, err = capsys.readouterr()
    return (out + err).splitlines()


def test_the_fast_demo_on_the_cpu(demo_ckpt, tmp_path, capsys):
    assert main(["generate", "--demo", "--demo-dir", str(demo_ckpt), "--model", "fast", "--frames", "9",
                 "--cache-dir", str(tmp_path / "fresh"), "--out", str(tmp_path / "f.mp4")]) == 0
    lines = _lines(capsys)
    plan = next(line for line in lines if line.startswith("memory plan:"))
    assert "on the GPU" not in plan and "the camera FiLM of 2/2 blocks in RAM" in plan, plan
    assert any("the text encoder runs on the CPU first" in line for line in lines), lines
    assert not any("on auto" in line for line in lines)


def test_the_base_demo_on_the_cpu(demo_ckpt, tmp_path, capsys):
    assert main(["generate", "--demo", "--demo-dir", str(demo_ckpt), "--steps", "2", "--size", "32*64",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "b.mp4")]) == 0
    loads = [line for line in _lines(capsys) if "expert loaded from disk" in line]
    assert len(loads) == 2 and all(" into RAM in " in line and " MB, " in line and "MB/s)" in line
                                   for line in loads), loads
    assert not any("GB/s" in line or "to cpu" in line for line in loads)

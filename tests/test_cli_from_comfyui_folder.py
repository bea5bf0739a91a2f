"""The CLI from a ComfyUI install, where the pack is a folder in custom_nodes/ and not an installed package:
`python path/to/ComfyUI-LingBot-World COMMAND` (docs/comfyui.md) runs it with ComfyUI's own Python."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(folder: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing makes `lingbot_world` importable
    return subprocess.run([sys.executable, str(folder), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_pack_folder_runs_the_cli_without_being_installed(tmp_path):
    custom_nodes = tmp_path / "ComfyUI" / "custom_nodes"
    custom_nodes.mkdir(parents=True)
    pack = custom_nodes / "ComfyUI-LingBot-World"
    pack.symlink_to(REPO, target_is_directory=True)
    got = _run(pack, "convert-expert", "--help", cwd=tmp_path / "ComfyUI")
    assert got.returncode == 0, got.stderr
    assert "usage: lingbot-world convert-expert" in got.stdout and "No module named" not in got.stderr
    # the package is the folder's code, not a copy installed in this Python
    script = ("import runpy, sys\nsys.argv = ['x', '--help']\ntry:\n    runpy.run_path(sys.argv_pack, "
              "run_name='__main__')\nexcept SystemExit:\n    pass\nimport lingbot_world\nprint(lingbot_world.__file__)")
    script = script.replace("sys.argv_pack", repr(str(pack)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert where.stdout.strip().splitlines()[-1] == str(pack / "__init__.py"), where.stderr[-2000:]


def test_a_conversion_runs_from_the_folder(tmp_path):
    from lingbot_world.loaders.demo_checkpoint import demo_configs
    from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert

    cfg = demo_configs()[0]
    src = tmp_path / "high_noise_model"
    write_official_expert(random_expert_state(cfg, seed=3), cfg, src)
    pack = tmp_path / "ComfyUI-LingBot-World"
    pack.symlink_to(REPO, target_is_directory=True)
    got = _run(pack, "convert-expert", str(src), str(tmp_path / "high_noise_model_bnb_nf4"), "--device", "cpu",
               cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    assert (tmp_path / "high_noise_model_bnb_nf4" / "config.json").is_file()


def test_comfyuis_own_python_runs_the_cli_from_custom_nodes(tmp_path):
    """The documented command, `python custom_nodes/ComfyUI-LingBot-World COMMAND` from the ComfyUI folder, with
    ComfyUI's interpreter (COMFYUI_PYTHON: the pack's requirements.txt and nothing installed as `lingbot_world`)."""
    python, comfyui = os.environ.get("COMFYUI_PYTHON"), os.environ.get("COMFYUI_PATH")
    if not python or not comfyui:
        pytest.skip("set COMFYUI_PATH and COMFYUI_PYTHON (a ComfyUI checkout and its venv's python) to run the CLI "
                    "with ComfyUI's own Python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run([python, "-c", "import lingbot_world"], env=env, capture_output=True, text=True,
                               timeout=120)
    assert installed.returncode != 0, "ComfyUI's Python has lingbot_world installed: it would not test the folder"
    home = tmp_path / "ComfyUI"  # ComfyUI's layout: the pack in custom_nodes/ (the checkout is never modified)
    (home / "custom_nodes").mkdir(parents=True)
    (home / "custom_nodes" / "ComfyUI-LingBot-World").symlink_to(REPO, target_is_directory=True)
    got = subprocess.run([python, "custom_nodes/ComfyUI-LingBot-World", "convert-fp8", "--help"], cwd=home, env=env,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "usage: lingbot-world convert-fp8" in got.stdout

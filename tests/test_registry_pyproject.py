"""pyproject.toml as the Comfy Registry's specification asks (docs.comfy.org/registry/specifications) and as
ComfyUI's own parser reads it (comfy_config.config_parser, when COMFYUI_PATH names a checkout)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_project_section_follows_the_registry_rules():
    project = CONFIG["project"]
    name = project["name"]
    # < 100 characters; letters, digits, - _ . only; no two specials in a row; starts with a letter; no "ComfyUI"
    assert len(name) < 100 and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*([-_.][A-Za-z0-9]+)*", name), name
    assert "comfyui" not in name.lower()
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])  # semantic X.Y.Z
    assert project["description"] and project["urls"]["Repository"].startswith("https://github.com/")
    assert "huggingface_hub>=0.24" in project["dependencies"]  # the loaders' downloads


def test_tool_comfy_names_the_publisher_display_name_icon_and_includes():
    comfy = CONFIG["tool"]["comfy"]
    assert re.fullmatch(r"[a-z][a-z0-9-]*", comfy["PublisherId"])  # the registry's publisher ids are lower case
    assert comfy["DisplayName"] == "LingBot-World (Wan 2.2)"
    icon = urlsplit(comfy["Icon"])
    assert icon.scheme == "https" and icon.path.endswith(".png")
    # the URL points at a file of this repository (main branch): it must exist here, square, at most 400 x 400
    repo_path = icon.path.split("/main/", 1)[1]
    from PIL import Image

    with Image.open(REPO / repo_path) as im:
        assert im.width == im.height <= 400
    assert isinstance(comfy["includes"], list) and all((REPO / p).exists() for p in comfy["includes"])
    assert re.fullmatch(r"[<>=!~]=?\s*\d+\.\d+(\.\d+)?", comfy["requires-comfyui"])
    pack_data = CONFIG["tool"]["setuptools"]["package-data"]["lingbot_world.assets"]
    assert "*.png" in pack_data  # the icon ships with the package too


def test_comfyuis_own_parser_reads_it():
    comfyui = os.environ.get("COMFYUI_PATH")
    if not comfyui or not (Path(comfyui) / "comfy_config" / "config_parser.py").is_file():
        import pytest

        pytest.skip("set COMFYUI_PATH to a ComfyUI checkout to parse pyproject.toml with comfy_config")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    script = ("import json, sys\nfrom comfy_config import config_parser\n"
              "c = config_parser.extract_node_configuration(sys.argv[1])\n"
              "print(json.dumps({'name': c.project.name, 'publisher': c.tool_comfy.publisher_id, "
              "'display': c.tool_comfy.display_name, 'icon': c.tool_comfy.icon, 'includes': c.tool_comfy.includes, "
              "'comfyui': c.project.supported_comfyui_version, 'license': c.project.license.text}))")
    out = subprocess.run([python, "-c", script, str(REPO)], cwd=comfyui, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    comfy = CONFIG["tool"]["comfy"]
    assert got == {"name": CONFIG["project"]["name"], "publisher": comfy["PublisherId"],
                   "display": comfy["DisplayName"], "icon": comfy["Icon"], "includes": comfy["includes"],
                   "comfyui": comfy["requires-comfyui"], "license": "Apache-2.0"}

"""The pack's root __init__: silent outside ComfyUI, loud inside it (ComfyUI's IMPORT FAILED names the package).

Each case runs in a fresh interpreter that loads the repository the way ComfyUI's `load_custom_node` does (by
path, under a path-like module name), with stand-ins for the two ComfyUI modules the pack looks for.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOAD_LIKE_COMFYUI = textwrap.dedent("""
    import importlib.util, json, sys, types
    if {fake_comfy}:
        sys.modules["folder_paths"] = types.ModuleType("folder_paths")
        comfy = types.ModuleType("comfy")
        comfy.model_management = types.ModuleType("comfy.model_management")
        sys.modules["comfy"], sys.modules["comfy.model_management"] = comfy, comfy.model_management
    name = {repo!r}.replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, {repo!r} + "/__init__.py", submodule_search_locations=[{repo!r}])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        print("RESULT" + json.dumps({{"error": type(e).__name__, "message": str(e), "name": getattr(e, "name", None)}}))
    else:
        print("RESULT" + json.dumps({{"nodes": sorted(module.NODE_CLASS_MAPPINGS), "web": module.WEB_DIRECTORY,
                                      "comfy_imported": [m for m in sys.modules if m.split(".")[0] == "comfy"]}}))
""")


def _load(tmp_path: Path, fake_comfy: bool, shadow: str = "") -> dict:
    env = dict(os.environ)
    if shadow:
        # A module that fails exactly like a missing package does, first on the path.
        pkg = tmp_path / "shadow" / shadow
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{shadow}'\", name={shadow!r})\n")
        env["PYTHONPATH"] = str(tmp_path / "shadow") + os.pathsep + env.get("PYTHONPATH", "")
    code = LOAD_LIKE_COMFYUI.format(repo=str(REPO), fake_comfy=fake_comfy)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


def test_outside_comfyui_the_pack_registers_nothing_and_imports_no_comfy(tmp_path):
    out = _load(tmp_path, fake_comfy=False)
    assert out == {"nodes": [], "web": "./web", "comfy_imported": []}


def test_inside_comfyui_the_nodes_register(tmp_path):
    out = _load(tmp_path, fake_comfy=True)
    assert "LingBotSampler" in out["nodes"] and "LingBotTextEncode" in out["nodes"]
    assert (REPO / out["web"]).is_dir()


def test_a_missing_dependency_fails_the_import_and_names_the_package(tmp_path):
    out = _load(tmp_path, fake_comfy=True, shadow="bitsandbytes")
    assert out["error"] == "ImportError" and out["name"] == "bitsandbytes"
    assert "'bitsandbytes'" in out["message"] and "pip install -r" in out["message"]
    assert str(REPO / "requirements.txt") in out["message"]


def test_a_missing_dependency_is_harmless_outside_comfyui(tmp_path):
    """The CLI's own import errors are its business; the root package does not import the nodes at all."""
    out = _load(tmp_path, fake_comfy=False, shadow="bitsandbytes")
    assert out["nodes"] == []

"""The background imports (world/heavy_imports.py): their lifecycle, and on the real CLI in fresh processes that the
main thread and the import thread never import the same modules, that the run neither deadlocks nor sees a
half-imported module while both import at once, and that the video is the same as with the imports in turn."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lingbot_world.world.heavy_imports import BackgroundImports

PROBE = Path(__file__).with_name("heavy_imports_probe.py")


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    """Two importable modules that nothing has imported yet: one slow, one broken."""
    pkg = tmp_path / "lingbot_fake_heavy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "slow.py").write_text("import time\ntime.sleep(0.3)\nVALUE = 42\n")
    (pkg / "broken.py").write_text("raise ImportError('libfoo.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lingbot_fake_heavy"
    for name in [m for m in sys.modules if m.startswith("lingbot_fake_heavy")]:
        del sys.modules[name]


def test_imports_run_on_a_thread_and_wait_joins_them(fake_modules):
    t = time.perf_counter()
    imports = BackgroundImports([f"{fake_modules}.slow"], first=())
    assert imports.background and time.perf_counter() - t < 0.2  # returned at once
    imports.wait()
    imports.wait()  # idempotent
    assert sys.modules[f"{fake_modules}.slow"].VALUE == 42 and imports.seconds >= 0.3
    assert not [th for th in threading.enumerate() if th.name == "lingbot-imports"]
    assert not BackgroundImports([f"{fake_modules}.slow"], first=()).background  # already imported: no thread


def test_an_import_error_is_raised_by_the_callers_own_import(fake_modules):
    imports = BackgroundImports([f"{fake_modules}.broken"], first=())
    imports.wait()  # not raised here
    with pytest.raises(ImportError, match="libfoo.so"):
        __import__(f"{fake_modules}.broken")


def test_in_turn_the_first_wait_imports(fake_modules):
    imports = BackgroundImports([f"{fake_modules}.slow"], background=False, first=())
    assert not imports.background and f"{fake_modules}.slow" not in sys.modules
    imports.wait()
    assert f"{fake_modules}.slow" in sys.modules


def _probe(mode: str, tmp_path: Path, demo: Path) -> dict:
    out = tmp_path / f"{mode}.json"
    argv = [sys.executable, str(PROBE), mode, str(out), "--", "generate", "--demo", "--model", "fast", "--demo-dir",
            str(demo), "--out", str(tmp_path / mode), "--quiet", "--frames", "9", "--seed", "4",
            "--cache-dir", str(demo / "text_cache")]
    # a deadlock would hang: the timeout turns it into a failure
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _frames(folder: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the probe computes the closure in a fork")
def test_the_real_cli_imports_apart_without_deadlock(demo_ckpt, tmp_path):
    from lingbot_world.cli import main

    serial = _probe("serial", tmp_path, demo_ckpt)
    assert serial["join_thread"] == "MainThread"
    closure, main_thread = set(serial["closure"]), set(serial["main_before_join"])
    # the import thread's modules, from the state it starts in: bitsandbytes and what it pulls in (inductor)
    assert {"bitsandbytes", "bitsandbytes.functional", "torch._inductor.compile_fx"} <= closure
    assert "lingbot_world.loaders.vae_files" in main_thread  # the main thread's work up to the join: the VAE encode
    assert not closure & main_thread, sorted(closure & main_thread)[:20]

    # both threads importing at once: the import thread is slowed down, and held inside bitsandbytes' closure (its
    # import locks taken) until the main thread joins, so it outlasts the main thread's start-up by construction
    assert "torch._inductor.compile_fx" in closure  # where the probe holds it (GATE_MODULE)
    slow = _probe("slow", tmp_path, demo_ckpt)
    assert slow["background"] and not slow.get("gate_timed_out"), "the main thread never joined the held imports"
    assert slow["imports_running_at_join"]
    assert "bitsandbytes" in slow["loaded_by_imports"]
    assert not set(slow["loaded_by_imports"]) & set(slow["main_before_join"])
    # the same video as this process makes with everything in turn
    assert main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--out",
                 str(tmp_path / "ref"), "--quiet", "--frames", "9", "--seed", "4", "--overlap", "off",
                 "--cache-dir", str(demo_ckpt / "text_cache")]) == 0
    assert np.array_equal(_frames(tmp_path / "ref"), _frames(tmp_path / "slow"))

"""The demo checkpoint is built atomically: a killed build never leaves a folder that looks usable, and the next
build cleans up after it."""
import os
import signal
import subprocess
import sys
import time

import pytest

from lingbot_world.loaders.demo_checkpoint import MANIFEST, build_demo_checkpoint


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_killed_build_is_cleaned_and_rebuilt(tmp_path):
    root = tmp_path / "demo"
    code = f"from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint; build_demo_checkpoint({str(root)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        t0 = time.monotonic()
        while not any((p / "high_noise_model_bnb_nf4").exists() for p in tmp_path.glob(".demo.tmp-*")):
            assert proc.poll() is None and time.monotonic() - t0 < 60, "the build never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not root.exists()  # nothing under the final name
    assert len(list(tmp_path.glob(".demo.tmp-*"))) == 1  # the half-built temp folder of the killed run
    files = build_demo_checkpoint(root)
    assert (root / MANIFEST).is_file() and files.high.is_dir() and files.vae.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]  # the leftover was removed


def test_partial_and_foreign_folders(tmp_path):
    root = tmp_path / "demo"
    (root / "google").mkdir(parents=True)  # a partial folder of demo files without the manifest: rebuilt
    (root / "Wan2.1_VAE.pth").write_bytes(b"half")
    build_demo_checkpoint(root)
    assert (root / MANIFEST).is_file() and (root / "Wan2.1_VAE.pth").stat().st_size > 100
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.pdf").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="not a demo checkpoint"):
        build_demo_checkpoint(mine)
    assert [p.name for p in mine.iterdir()] == ["thesis.pdf"]

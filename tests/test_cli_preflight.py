"""The issue's catalogue of bad inputs through `lingbot_world.cli.main`: exit code 2, one line naming the flag or
file and what to do, no traceback, and nothing expensive started (no text-encoder child, no model loaded)."""
import os
import struct
import tempfile
import zlib

import pytest
import torch

from lingbot_world.cli import main
from lingbot_world.text_encoder import encode as text_encode


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if the text encoder child is started or an expert is loaded (i.e. work began)."""
    started = []

    def refuse(*a, **k):
        started.append(a)
        raise RuntimeError("expensive work started")

    monkeypatch.setattr(text_encode, "run_text_encoder", refuse)
    from lingbot_world.memory import placement

    monkeypatch.setattr(placement, "make_provider", refuse)
    return started


def _run(capsys, demo_ckpt, tmp_path, *argv, demo=True):
    base = ["generate", "--quiet", "--cache-dir", str(tmp_path / "text_cache")]
    if demo:
        base += ["--demo", "--demo-dir", str(demo_ckpt)]
    rc = main(base + [str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _readonly_dir(tmp_path):
    """A folder this process cannot create files in (chmod when not root; root ignores modes, /sys refuses)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        return d
    try:
        fd, p = tempfile.mkstemp(dir="/sys")
    except OSError:
        return "/sys"
    os.close(fd)
    os.unlink(p)
    pytest.skip("no read-only folder available")


# ---- 1. output path ---------------------------------------------------------------------------------------------
def test_output_is_an_existing_folder(capsys, demo_ckpt, tmp_path, no_work):
    (tmp_path / "out.mp4").mkdir()
    rc, out, err = _run(capsys, demo_ckpt, tmp_path, "--out", tmp_path / "out.mp4")
    assert rc == 2 and "wrote" not in out and not no_work
    line = _one_line(err)
    assert "out.mp4 is an existing folder" in line and line.startswith("lingbot-world generate: error:")


def test_output_in_a_missing_or_readonly_folder(capsys, demo_ckpt, tmp_path, no_work):
    rc, out, err = _run(capsys, demo_ckpt, tmp_path, "--out", tmp_path / "nope" / "x.mp4")
    assert rc == 2 and "folder" in _one_line(err) and "does not exist" in err and not no_work
    ro = _readonly_dir(tmp_path)
    rc, out, err = _run(capsys, demo_ckpt, tmp_path, "--out", f"{ro}/x.mp4")
    assert rc == 2 and "cannot write in" in _one_line(err) and not no_work


def test_output_extension_and_png_folder(capsys, demo_ckpt, tmp_path, no_work):
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--out", tmp_path / "x.avi")
    assert rc == 2 and "unknown extension '.avi'" in _one_line(err) and ".mp4, .webm or .gif" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "holiday.jpg").write_bytes(b"x")
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--out", tmp_path / "mine")
    assert rc == 2 and "holding other files (holiday.jpg)" in _one_line(err)
    (tmp_path / "file").write_bytes(b"x")
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--out", tmp_path / "file")
    assert rc == 2 and "is an existing file" in _one_line(err) and not no_work


# ---- 5. tracebacks instead of messages -------------------------------------------------------------------------
def test_non_image_and_bomb_image(capsys, demo_ckpt, tmp_path, no_work):
    (tmp_path / "notes.txt").write_text("hello")
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--image", tmp_path / "notes.txt")
    assert rc == 2 and "notes.txt is not an image" in _one_line(err)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", 40000, 40000, 8, 0, 0, 0, 0)  # claims 1.6 gigapixels
    (tmp_path / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                                        chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b""))
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--image", tmp_path / "bomb.png")
    assert rc == 2 and "decompression-bomb limit" in _one_line(err)
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--image", tmp_path / "missing.png")
    assert rc == 2 and "missing.png does not exist" in _one_line(err) and not no_work


@pytest.mark.parametrize("flag,value,expect", [
    ("--device", "tpu", "--device 'tpu': use auto, cpu, cuda or cuda:N"),
    ("--device", "cpu:1", "the CPU has no index"),
    ("--seed", str(2**70), "--seed 1180591620717411303424: use 0 .. 18446744073709551615"),
    ("--frames", "1000000001", "--frames 1000000001: use 1 .. 100001 (4n+1; the longest video a run makes is 1 h"),
    ("--frames", "10", "frame count 10 is not of the form 4n+1; use 9 or 13"),
    ("--size", "100000*100000", "of RAM"),
    ("--size", "big", "--size: unknown size 'big'"),
    ("--steps", "0", "--steps 0: use 1 .. 10000"),
    ("--fps", "0", "--fps 0"),
    ("--boundary", "1.5", "--boundary 1.5: use 0 .. 1"),
    ("--shift", "nan", "--shift nan"),
    ("--t5-timeout", "0", "--t5-timeout 0.0: use more than 0 and at most 2592000 (seconds; leave the flag out"),
    ("--blocks-on-gpu", "-1", "--blocks-on-gpu -1"),
    ("--camera", "no_such_preset", "no_such_preset"),
])
def test_bad_flag_values(capsys, demo_ckpt, tmp_path, no_work, flag, value, expect):
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, flag, value, "--out", tmp_path / "x.mp4")
    assert rc == 2, err
    assert expect in _one_line(err)
    assert not no_work and not (tmp_path / "x.mp4").exists()


def test_huge_frame_count_names_the_memory_it_needs(capsys, demo_ckpt, tmp_path, no_work):
    """--frames 1000000001 used to try to allocate 119 GiB; a count under the frame limit that cannot fit the
    machine is one line with the numbers, at once."""
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--frames", "100001", "--size", "720*1280")
    line = _one_line(err)
    assert rc == 2 and "TiB of RAM" in line and "more than this machine's" in line and "GiB" in line


def test_guide_scale_count_is_checked_first(capsys, demo_ckpt, tmp_path, no_work):
    rc, _, err = _run(capsys, demo_ckpt, tmp_path, "--guide-scale", "1", "2", "3")
    assert rc == 2 and "one value or two" in _one_line(err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU messages")
def test_cuda_choices_without_a_gpu(capsys, demo_ckpt, tmp_path, no_work):
    for argv, expect in ((["--device", "cuda"], "no CUDA GPU is available here; use --device cpu"),
                         (["--noise", "cuda"], "--noise cuda needs a CUDA GPU"),
                         (["--t5-device", "cuda"], "--t5-device cuda: no CUDA GPU")):
        rc, _, err = _run(capsys, demo_ckpt, tmp_path, *argv)
        assert rc == 2 and expect in _one_line(err)


def test_argparse_errors_return_2(capsys):
    assert main(["generate", "--frames", "many"]) == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2


# ---- 6. checkpoint damage is found before any work ---------------------------------------------------------------
@pytest.mark.parametrize("part", ["low_noise_model_bnb_nf4/model.safetensors", "models_t5_umt5-xxl-enc-bf16.pth",
                                  "Wan2.1_VAE.pth"])
def test_truncated_checkpoint_file_found_first(capsys, copy_demo, tmp_path, no_work, part):
    root = copy_demo()
    data = (root / part).read_bytes()
    (root / part).write_bytes(data[: len(data) * 2 // 3])
    rc, _, err = _run(capsys, root, tmp_path, "--out", tmp_path / "x.mp4")
    line = _one_line(err)
    assert rc == 2 and part.split("/")[-1] in line and "truncated" in line and not no_work


def test_missing_checkpoint_parts(capsys, tmp_path, no_work):
    rc, _, err = _run(capsys, None, tmp_path, "--ckpt-dir", tmp_path / "none", "--image", tmp_path / "a.png",
                      "--prompt", "p", "--out", tmp_path / "x.mp4", demo=False)
    assert rc == 2 and "a.png does not exist" in _one_line(err)  # the image is checked before the folder
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    rc, _, err = _run(capsys, None, tmp_path, "--ckpt-dir", tmp_path / "none", "--image", tmp_path / "a.png",
                      "--prompt", "p", "--out", tmp_path / "x.mp4", demo=False)
    assert rc == 2 and "checkpoint folder" in _one_line(err) and "does not exist" in err
    rc, _, err = _run(capsys, None, tmp_path, "--image", tmp_path / "a.png", "--prompt", "p", "--out",
                      tmp_path / "x.mp4", demo=False)
    assert rc == 2 and "give --ckpt-dir (or --demo)" in _one_line(err) and not no_work


# ---- --help ------------------------------------------------------------------------------------------------------
def test_help_documents_every_flag_and_shows_defaults(capsys):
    from lingbot_world.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and len(action.help) > 8, f"{name} {action.option_strings} has no help"
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("(default: 480*832)", "default 81, or as long as --actions", "default 70; 20 for the Act model",
                  "(default: 42)", "(default: auto)",
                  "(default: unipc)", "(default: nf4)", "(default: [5.0])", "(default: 16)", "(default: bf16)",
                  "130 interrupted", "143 terminated"):
        assert shown in text, shown


def test_debug_shows_the_traceback_and_bugs_always_do(capsys, demo_ckpt, tmp_path, monkeypatch):
    rc = main(["--debug", "generate", "--demo", "--demo-dir", str(demo_ckpt), "--device", "tpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" in err and err.strip().endswith("use auto, cpu, cuda or cuda:N")

    from lingbot_world.cli import generate_base

    def bug(request, session):
        return 1 / 0

    monkeypatch.setattr(generate_base, "preflight", bug)
    rc = main(["generate", "--demo", "--demo-dir", str(demo_ckpt)])
    err = capsys.readouterr().err
    assert rc == 1 and "ZeroDivisionError" in err and "Traceback" in err and "please report it" in err


def test_exit_code_table():
    from lingbot_world.cli.errors import Terminated, UsageError, classify
    from lingbot_world.text_encoder.child_process import TextEncoderInputError, TextEncoderKilled

    assert classify(KeyboardInterrupt()) == (130, "interrupted")
    assert classify(Terminated(15)) == (143, "terminated (SIGTERM)")
    assert classify(UsageError("--x 1: bad")) == (2, "--x 1: bad")
    assert classify(FileNotFoundError("a.png does not exist"))[0] == 2
    assert classify(TextEncoderInputError("text encoder failed: wrong file\n--- stderr ---\nTraceback"))[1] == (
        "text encoder failed: wrong file")  # the first line only
    assert classify(TextEncoderKilled("killed"))[0] == 1
    assert classify(OSError(28, "No space left on device"))[0] == 1
    code, msg = classify(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert code == 1 and msg.startswith("out of GPU memory; try --memory-mode swap or block_swap")
    assert classify(MemoryError())[1].startswith("out of RAM")
    assert classify(ZeroDivisionError()) is None  # a bug: the traceback is shown

"""Issue 28 through `lingbot_world.cli.main` on the tiny demo: the Fast model, continuation, LoRA and every output
kind hold the base model's bar. Each case: the exit code, the one line (naming the flag), and what is on disk
afterwards (no temp file, an earlier file intact); bad input is refused before any work starts."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lingbot_world.cli import main
from lingbot_world.text_encoder import encode as text_encode


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if the text encoder child starts, the VAE or the Fast model loads (work began)."""
    started = []

    def refuse(*a, **k):
        started.append(a)
        raise RuntimeError("expensive work started")

    from lingbot_world.loaders import vae_files
    from lingbot_world.memory.kv_placement import FastPlacement

    monkeypatch.setattr(text_encode, "run_text_encoder", refuse)
    monkeypatch.setattr(vae_files, "load_vae", refuse)
    monkeypatch.setattr(FastPlacement, "load_model", refuse)
    return started


def _fast(demo_ckpt, cache, *argv, model="fast"):
    return ["generate", "--demo", "--demo-dir", str(demo_ckpt), "--cache-dir", str(cache), "--quiet",
            *(["--model", model] if model else []), *[str(a) for a in argv]]


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def old_video(tmp_path):
    """An earlier complete video at the output path: every refusal and failure must leave it as it was."""
    out = tmp_path / "out.mp4"
    out.write_bytes(b"complete earlier video")
    return out


# ---- numbers, text and LoRA strengths: one line naming the flag, before any work ------------------------------
@pytest.mark.parametrize("argv, expect", [
    (["--fps", "0"], "--fps 0: use 1 .. 240"),
    (["--seed", str(2**70)], "--seed 1180591620717411303424: use 0 .. 18446744073709551615"),
    (["--t5-timeout", "nan"], "--t5-timeout nan: use more than 0"),
    (["--t5-timeout", "-1"], "--t5-timeout -1.0: use more than 0"),
    (["--parallel-timeout", "inf"], "--parallel-timeout inf"),
    (["--frames", "100000000"], "--frames 100000000: use 1 .. 100001 (4n+1; the longest video a run makes"),
    (["--frames", "100001", "--size", "720*1280"], "GiB of RAM"),
    (["--actions", "w-1000000000"], "--actions: action string 'w-1000000000': segment 1 'w-1000000000' asks for "
                                    "more frames than the longest video a run makes (100001 frames"),
    (["--actions", "w-99999999999999999999999"], "asks for more frames than the longest video"),
    (["--actions", "w-60000,a-60000"], "holds 120000 frames in all"),
    (["--actions", "w-\u0661\u0662"], "not a positive whole number written with the digits 0-9"),
    (["--actions", ""], "--actions '' is empty (an unset shell variable?)"),
    (["--actions", "  "], "--actions '  ' is empty"),
    (["--camera", ""], "--camera '' is empty"),
    (["--lora", "style.safetensors:nan"], "--lora style.safetensors:nan: strength nan must be a finite number"),
    (["--lora", "style.safetensors:inf"], "strength inf must be a finite number"),
    (["--lora", "style.safetensors:strong"], "--lora style.safetensors:strong: strength 'strong' is not a number"),
    (["--kv-layers-on-gpu", "-1"], "--kv-layers-on-gpu -1: use 0 .. 1000"),
    (["--window", "-1"], "--window -1: use 0 .. 25001"),
    (["--max-attention", str(2**40)], "--max-attention 1099511627776"),
    (["--camera-speed", "nan"], "--camera-speed nan"),
])
def test_fast_bad_values_are_one_line_before_any_work(capsys, demo_ckpt, tmp_path, no_work, old_video, argv, expect):
    rc, out, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, *argv))
    line = _one_line(err)
    assert rc == 2 and line.startswith("lingbot-world generate: error: ") and expect in line, line
    assert not no_work and old_video.read_bytes() == b"complete earlier video" and _names(tmp_path) == ["out.mp4"]


# ---- flags that do not apply: refused, never silently ignored ---------------------------------------------------
@pytest.mark.parametrize("model, argv, expect", [
    ("", ["--save-state", "v.state"], "--save-state is a flag of the Fast model: add --model fast"),
    ("", ["--continue-from", "v.state"], "--continue-from is a flag of the Fast model"),
    ("", ["--window", "3"], "--window is a flag of the Fast model"),
    ("fast", ["--steps", "3"], "--model fast does not take --steps"),
    ("fast", ["--guide-scale", "3"], "--model fast does not take --guide-scale"),
    ("fast", ["--lora-high", "x.safetensors"], "--lora-high: the Fast model is one model; use --lora FILE[:STRENGTH]"),
    ("fast", ["--whole-video", "w.mp4"], "--whole-video writes the whole video of a continuation: it needs "
                                         "--continue-from"),
    ("fast", ["--camera", "dolly_in", "--actions", "w-8"], "give either --camera (a trajectory) or --actions"),
])
def test_flags_of_another_model_are_refused(capsys, demo_ckpt, tmp_path, no_work, old_video, model, argv, expect):
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, *argv, model=model))
    assert rc == 2 and expect in _one_line(err)
    assert not no_work and _names(tmp_path) == ["out.mp4"]


# ---- output targets: collisions, kinds, folders, free space ---------------------------------------------------
def test_state_and_video_on_one_path_are_refused(capsys, demo_ckpt, tmp_path, no_work, old_video):
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, "--save-state", old_video))
    assert rc == 2 and "--out and --save-state both name" in _one_line(err)
    assert old_video.read_bytes() == b"complete earlier video" and _names(tmp_path) == ["out.mp4"]


def test_an_output_that_is_an_input_is_refused(capsys, demo_ckpt, tmp_path, no_work):
    from lingbot_world.loaders.demo_checkpoint import DEMO_IMAGE

    image = tmp_path / "in.png"
    shutil.copy(DEMO_IMAGE, image)
    before = image.read_bytes()
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--image", image, "--out", tmp_path / "o.mp4",
                                    "--trajectory-picture", image))
    assert rc == 2 and "--trajectory-picture" in _one_line(err) and "is also the input --image" in err
    assert image.read_bytes() == before and _names(tmp_path) == ["in.png"]


@pytest.mark.parametrize("flag, make, expect", [
    ("--save-state", lambda p: p.mkdir(), "is a folder, not a file; give a file name inside it, e.g. "),
    ("--save-state", lambda p: os.mkfifo(p), "is a pipe, not a file"),
    ("--trajectory-picture", lambda p: None, "the folder"),
])
def test_unusable_targets_are_found_before_the_run(capsys, demo_ckpt, tmp_path, no_work, old_video, flag, make,
                                                   expect):
    target = tmp_path / "target"
    make(target)
    path = target if flag != "--trajectory-picture" else tmp_path / "missing" / "p.png"
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, flag, path))
    line = _one_line(err)
    assert rc == 2 and line.startswith(f"lingbot-world generate: error: {flag} {path}") and expect in line, line
    assert ".tmp" not in line and not no_work and old_video.read_bytes() == b"complete earlier video"


def test_a_refused_target_is_the_only_line_even_when_the_frames_are_off_the_grid(capsys, demo_ckpt, tmp_path, no_work,
                                                                                 old_video):
    """Checks first, notes after: 17 frames would be padded (to 21) to the chunk grid, but the unusable --save-state is the
    one line the user gets."""
    target = tmp_path / "a_folder"
    target.mkdir()
    rc, out, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, "--frames", "17",
                                      "--save-state", target))
    line = _one_line(err)
    assert rc == 2 and line.startswith(f"lingbot-world generate: error: --save-state {target}"), line
    assert "instead of the requested" not in out + err and not no_work


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (root only: `mount -t tmpfs`), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_state_larger_than_the_free_space_is_refused_first(capsys, demo_ckpt, demo_text_cache, small_disk, no_work):
    """The demo's state is ~1.5 MB: on a 1 MB disk it is refused before anything runs, with the estimate."""
    rc, out, err = _run(capsys, _fast(demo_ckpt, demo_text_cache, "--out", small_disk / "v.mp4",
                                      "--save-state", small_disk / "v.state"))
    line = _one_line(err)
    assert rc == 2 and line.startswith(f"lingbot-world generate: error: --out {small_disk / 'v.mp4'}: not enough "
                                       f"free space in {small_disk}") and "--save-state 1." in line, line
    assert not no_work and _names(small_disk) == []


def test_a_full_disk_while_writing_is_one_line_and_keeps_the_old_video(capsys, demo_ckpt, demo_text_cache, small_disk,
                                                                        monkeypatch):
    """The estimate passes (forced to 0 here) but the disk fills while ffmpeg writes: exit 1, ffmpeg's reason, no
    traceback (it was an AttributeError from closing the writer twice), the earlier video and no temp left."""
    from lingbot_world.cli import outputs

    monkeypatch.setattr(outputs, "video_estimate", lambda *a: 0)
    out = small_disk / "v.mp4"
    out.write_bytes(b"complete earlier video")
    _fill(small_disk / "filler", leave=48 * 1024)  # the demo's video takes ~120 kB
    rc, stdout, err = _run(capsys, _fast(demo_ckpt, demo_text_cache, "--out", out))
    line = _one_line(err)
    assert rc == 1 and line.startswith("lingbot-world generate: no space left on the disk"), line
    assert f"while writing {out}; free some space or write it to another disk" in line and "wrote" not in stdout
    assert out.read_bytes() == b"complete earlier video" and _names(small_disk) == ["filler", "v.mp4"]


def test_a_disk_filled_after_the_checks_names_the_state_file(capsys, demo_ckpt, demo_text_cache, small_disk,
                                                             monkeypatch):
    """The disk fills between the pre-flight (passed here) and the state's write: one line naming the state file and
    what to do (it was a bare `[Errno 28] No space left on device`), the earlier state intact, no temp left."""
    from lingbot_world.cli import outputs

    monkeypatch.setattr(outputs, "_check_space", lambda targets: None)
    state = small_disk / "v.state"
    state.write_bytes(b"earlier state")
    _fill(small_disk / "filler", leave=400 * 1024)  # the video (~120 kB) fits, the state (~1.5 MB) does not
    rc, _, err = _run(capsys, _fast(demo_ckpt, demo_text_cache, "--out", small_disk / "v.mp4", "--save-state", state))
    line = _one_line(err)
    assert rc == 1 and "[Errno" not in line, line
    assert "no space left on the disk" in line and f"while writing {state}; free some space" in line, line
    assert state.read_bytes() == b"earlier state" and not [n for n in _names(small_disk) if n.startswith(".")]


def test_a_full_disk_is_named_whatever_the_writer(tmp_path):
    """Without root (no small disk): /dev/full gives a real ENOSPC, the file size limit a real EFBIG."""
    from lingbot_world.loaders.atomic import DiskFullError, naming_full_disk

    with pytest.raises(DiskFullError) as e:
        with naming_full_disk(tmp_path / "clip.mp4"), open("/dev/full", "wb") as f:
            f.write(b"x" * 65536)
    assert str(e.value).startswith("no space left on the disk (") and f"writing {tmp_path / 'clip.mp4'}" in str(e.value)
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "from lingbot_world.loaders.atomic import write_bytes\n"
              "write_bytes(sys.argv[1], b'x' * 100000)\n")
    target = tmp_path / "big.bin"
    r = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True)
    assert r.returncode == 1 and "DiskFullError" in r.stderr
    assert f"{target} grew past this system's file size limit (ulimit -f)" in r.stderr.strip().splitlines()[-1]
    assert _names(tmp_path) == []  # the temp is gone, nothing was written under the name


# ---- flags naming files that are something else ----------------------------------------------------------------
def test_a_cache_dir_that_is_a_file_is_refused_before_any_work(capsys, demo_ckpt, tmp_path, no_work, old_video):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    rc, _, err = _run(capsys, _fast(demo_ckpt, cache, "--out", old_video))
    assert rc == 2 and _one_line(err) == (f"lingbot-world generate: error: --cache-dir {cache} is a file; give a "
                                          "folder for the prompt-embedding cache (made if missing)")
    rc, _, err = _run(capsys, _fast(demo_ckpt, cache / "sub", "--out", old_video))
    assert rc == 2 and f"--cache-dir {cache / 'sub'} is inside {cache}, which is a file" in _one_line(err)
    rc, _, err = _run(capsys, ["play", "--demo", "--demo-dir", str(demo_ckpt), "--no-browser", "--port", "0",
                               "--out-dir", str(tmp_path / "o"), "--cache-dir", str(cache)])
    assert rc == 2 and f"--cache-dir {cache} is a file" in _one_line(err)
    assert not no_work and old_video.read_bytes() == b"complete earlier video"


@pytest.mark.parametrize("make, expect", [
    (lambda d: d, "{p} is a folder, not a state file; give the .state file --save-state wrote"),
    (lambda d: Path(os.devnull), "{p} is not a regular file (a device or a pipe); give the .state file "
                                 "--save-state wrote"),
    (lambda d: d / "gone.state", "state file not found: {p}"),
])
def test_continue_from_something_else_says_what_it_is(capsys, demo_ckpt, tmp_path, no_work, make, expect):
    p = make(tmp_path)
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--continue-from", p, "--out", tmp_path / "o.mp4"))
    assert rc == 2 and _one_line(err) == "lingbot-world generate: error: " + expect.format(p=p)
    assert not no_work


def test_a_camera_folder_typo_is_not_called_an_unknown_preset(capsys, demo_ckpt, tmp_path, no_work, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spec in ("./typo", "trajectories/orbit", "~/nowhere"):
        rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--camera", spec, "--out", tmp_path / "o.mp4"))
        line = _one_line(err)
        assert rc == 2 and f"--camera {spec}: no such folder; give a trajectory folder" in line, line
        assert "unknown camera preset" not in line
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--camera", "dolly_ni", "--out", tmp_path / "o.mp4"))
    assert rc == 2 and "unknown camera preset(s) dolly_ni" in _one_line(err)


def _fill(path, leave: int) -> None:
    """Fill the disk under `path` up to `leave` free bytes."""
    free = shutil.disk_usage(path.parent).free
    with open(path, "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_full_prompt_cache_disk_is_a_warning_and_the_run_goes_on(capsys, demo_ckpt, small_disk, tmp_path):
    _fill(small_disk / "filler", leave=0)  # no room for the cache entry
    rc, stdout, err = _run(capsys, _fast(demo_ckpt, small_disk / "text", "--out", tmp_path / "v.mp4", "--frames", "9"))
    assert rc == 0, err
    assert "text-embedding cache: cannot store the entry" in err and "No space left on device" in err
    assert "Traceback" not in err and (tmp_path / "v.mp4").is_file()
    assert not (small_disk / "text").exists() or _names(small_disk / "text") == []  # no temp entry left


# ---- LoRA files -------------------------------------------------------------------------------------------------
def test_a_lora_with_nan_weights_is_refused(capsys, demo_ckpt, tmp_path, no_work, old_video):
    from safetensors.torch import save_file

    down = torch.randn(2, 64)
    down[1, 3] = float("nan")
    save_file({"lora_unet_blocks_0_self_attn_q.lora_down.weight": down,
               "lora_unet_blocks_0_self_attn_q.lora_up.weight": torch.randn(64, 2)}, str(tmp_path / "bad.safetensors"))
    rc, _, err = _run(capsys, _fast(demo_ckpt, tmp_path / "cache", "--out", old_video, "--lora",
                                    tmp_path / "bad.safetensors"))
    line = _one_line(err)
    assert rc == 2 and "bad.safetensors" in line and "1 NaN or infinite value(s)" in line, line
    assert not no_work and old_video.read_bytes() == b"complete earlier video"


# ---- continuation -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state(demo_ckpt, demo_text_cache, tmp_path_factory):
    """A saved Fast video to continue (one run of the demo)."""
    folder = tmp_path_factory.mktemp("state")
    assert main(_fast(demo_ckpt, demo_text_cache, "--out", folder / "first.mp4", "--frames", "9",
                      "--save-state", folder / "v.state")) == 0
    return folder / "v.state"


@pytest.mark.parametrize("argv, expect", [
    (["--out", "{d}/x.mp4", "--whole-video", "{d}/x.mp4"], "--out and --whole-video both name"),
    (["--out", "{d}/x.mp4", "--trajectory-picture", "{s}"], "--trajectory-picture {s} is also the input "
                                                            "--continue-from"),
    (["--camera", "dolly_in", "--actions", "w-8"], "give either --camera (a trajectory) or --actions"),
    (["--seed", "7"], "--seed: a continuation takes the image, size, seed, noise and rule from the state"),
    (["--size", "480*480"], "--size: a continuation takes"),
    (["--size", "480*832"], "--size: a continuation takes"),  # the default, given: refused too, never ignored
    (["--fps", "0"], "--fps 0"),
])
def test_continuation_refusals(capsys, demo_ckpt, demo_text_cache, state, tmp_path, no_work, argv, expect):
    fill = {"d": tmp_path, "s": state}
    argv = [a.format(**fill) for a in argv]
    before = state.read_bytes()
    rc, _, err = _run(capsys, _fast(demo_ckpt, demo_text_cache, "--continue-from", state, *argv))
    assert rc == 2 and expect.format(**fill) in _one_line(err)
    assert not no_work and state.read_bytes() == before and _names(tmp_path) == []


def test_a_continuation_may_save_over_its_own_state(capsys, demo_ckpt, demo_text_cache, state, tmp_path):
    own = tmp_path / "v.state"
    shutil.copy(state, own)
    rc, out, err = _run(capsys, _fast(demo_ckpt, demo_text_cache, "--continue-from", own, "--save-state", own,
                                      "--out", tmp_path / "p2.mp4", "--whole-video", tmp_path / "all.mp4",
                                      "--actions", "w-12"))
    assert rc == 0, err
    assert f"continue with --continue-from {own}" in out
    assert _names(tmp_path) == ["all.mp4", "p2.mp4", "v.state"]


# ---- the bitsandbytes notice --------------------------------------------------------------------------------------
def test_the_bitsandbytes_optional_kernel_notice_is_filtered(caplog):
    import logging

    import lingbot_world.quant  # noqa: F401 - installs the filter

    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        bnb.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
                    "`pip install kernels`", "No module named 'kernels'")
        bnb.warning("another bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["another bitsandbytes warning"]

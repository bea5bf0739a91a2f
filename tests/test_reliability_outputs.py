"""cli/outputs.check_outputs: every output target checked together before any work, one line naming the flag."""
import os
import socket
import subprocess

import pytest

from lingbot_world.cli.errors import UsageError
from lingbot_world.cli.outputs import OutputSpec, check_outputs, video_estimate


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_fine_targets_pass_and_nothing_is_left(tmp_path):
    (tmp_path / "old.mp4").write_bytes(b"complete earlier video")
    got = check_outputs([OutputSpec("--out", tmp_path / "old.mp4", 1000),
                         OutputSpec("--save-state", tmp_path / "v.state", 1000),
                         OutputSpec("--whole-video", tmp_path / "frames", 1000, folder=True)],
                        inputs=[("--image", tmp_path / "in.png")])
    assert got == [tmp_path / "old.mp4", tmp_path / "v.state", tmp_path / "frames"]
    assert _names(tmp_path) == ["old.mp4"] and (tmp_path / "old.mp4").read_bytes() == b"complete earlier video"


@pytest.mark.parametrize("a, b", [("--save-state", "--out"), ("--out", "--whole-video")])
def test_two_flags_naming_one_file_are_refused(tmp_path, a, b):
    with pytest.raises(UsageError, match=f"^{a} and {b} both name .*x: one would overwrite the other"):
        check_outputs([OutputSpec(a, tmp_path / "x"), OutputSpec(b, tmp_path / "x")])
    # the same file through another spelling (a link to the folder, a relative path)
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    with pytest.raises(UsageError, match="both name"):
        check_outputs([OutputSpec(a, tmp_path / "d" / "x"), OutputSpec(b, tmp_path / "link" / "x")])


def test_a_target_inside_a_png_folder_target_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"^--save-state .*frames/v.state is inside the folder --out"):
        check_outputs([OutputSpec("--out", tmp_path / "frames", folder=True),
                       OutputSpec("--save-state", tmp_path / "frames" / "v.state")])


def test_an_output_that_is_an_input_is_refused(tmp_path):
    image = tmp_path / "in.png"
    image.write_bytes(b"png")
    with pytest.raises(UsageError, match="^--trajectory-picture .*in.png is also the input --image"):
        check_outputs([OutputSpec("--trajectory-picture", image)], inputs=[("--image", image)])
    os.link(image, tmp_path / "hard.png")  # another name of the same file
    with pytest.raises(UsageError, match="is also the input --image"):
        check_outputs([OutputSpec("--out", tmp_path / "hard.png")], inputs=[("--image", image)])
    with pytest.raises(UsageError, match="^--out .* is a folder holding the input --image"):
        check_outputs([OutputSpec("--out", tmp_path, folder=True)], inputs=[("--image", image)])
    # declared replaceable: a continuation saving its state over the state it continues
    state = tmp_path / "v.state"
    state.write_bytes(b"state")
    check_outputs([OutputSpec("--save-state", state, may_replace=("--continue-from",))],
                  inputs=[("--continue-from", state)])
    assert image.read_bytes() == b"png" and state.read_bytes() == b"state"


def test_targets_that_are_not_regular_files_are_refused(tmp_path):
    (tmp_path / "dir.state").mkdir()
    with pytest.raises(UsageError, match=r"^--save-state .*dir.state is a folder, not a file; give a file name inside"):
        check_outputs([OutputSpec("--save-state", tmp_path / "dir.state")])
    (tmp_path / "real.mp4").write_bytes(b"video")
    (tmp_path / "link.mp4").symlink_to(tmp_path / "real.mp4")
    with pytest.raises(UsageError, match="^--out .*link.mp4 is a symbolic link, not a file"):
        check_outputs([OutputSpec("--out", tmp_path / "link.mp4")])
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(UsageError, match="^--trajectory-picture .*pipe.png is a pipe, not a file"):
        check_outputs([OutputSpec("--trajectory-picture", tmp_path / "pipe.png")])
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock.state"))
        with pytest.raises(UsageError, match="is a socket, not a file"):
            check_outputs([OutputSpec("--save-state", tmp_path / "sock.state")])
    with pytest.raises(UsageError, match="is a device, not a file"):
        check_outputs([OutputSpec("--save-state", "/dev/null")])
    check_outputs([OutputSpec("--out", tmp_path / "dir.state", folder=True)])  # a PNG folder may be a folder
    assert (tmp_path / "real.mp4").read_bytes() == b"video"


def test_missing_or_unwritable_folders_are_refused(tmp_path):
    with pytest.raises(UsageError, match="^--save-state .*: the folder .*nope does not exist"):
        check_outputs([OutputSpec("--save-state", tmp_path / "nope" / "v.state")])
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UsageError, match="is not a folder"):
        check_outputs([OutputSpec("--whole-video", tmp_path / "file" / "v.mp4")])
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(UsageError, match="^--trajectory-picture .*: cannot write in .*ro"):
        check_outputs([OutputSpec("--trajectory-picture", ro / "p.png")])


def test_not_enough_space_is_refused_with_the_numbers(tmp_path):
    import shutil

    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(UsageError, match=r"^--save-state .*: not enough free space in .* free, the run writes about "
                                         r".*--save-state .* \+ --out"):
        check_outputs([OutputSpec("--save-state", tmp_path / "v.state", free),
                       OutputSpec("--out", tmp_path / "v.mp4", 10**6)])
    assert _names(tmp_path) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (root only: `mount -t tmpfs`)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_small_disk_refuses_what_does_not_fit(small_disk):
    check_outputs([OutputSpec("--out", small_disk / "a.mp4", video_estimate(9, 32, 48, ".mp4"))])
    with pytest.raises(UsageError, match="not enough free space"):
        check_outputs([OutputSpec("--save-state", small_disk / "v.state", 2 * 1024**2)])

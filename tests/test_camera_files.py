"""poses.npy / intrinsics.npy reading, writing and validation (each bad input names the file and the problem)."""
import warnings

import numpy as np
import pytest

from lingbot_world.loaders.camera_files import (
    INTRINSICS_FILE,
    POSES_FILE,
    CameraFileError,
    CameraFileNotFoundError,
    load_camera,
    load_camera_files,
    load_camera_folder,
    save_camera_folder,
)
from lingbot_world.wan.control.camera import CameraInputError, camera_condition
from lingbot_world.wan.control.camera_presets import PRESET_NAMES, preset_camera

K = [502.9116, 503.10812, 415.77786, 239.77779]


def write(folder, poses, intrinsics):
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / POSES_FILE, poses)
    np.save(folder / INTRINSICS_FILE, intrinsics)
    return folder


def good(n=9):
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], n, 0)
    poses[:, 2, 3] = np.arange(n) * 0.1
    return poses, np.tile(np.array(K, dtype=np.float32), (n, 1))


def test_loads_the_shipped_example(examples_dir):
    folder = examples_dir / "00"
    cam = load_camera_folder(folder)
    assert cam.poses.shape == (961, 4, 4) and cam.intrinsics.shape == (961, 4)
    assert cam.poses.dtype == np.float32 and cam.intrinsics.dtype == np.float32
    np.testing.assert_array_equal(cam.poses, np.load(folder / POSES_FILE))
    np.testing.assert_array_equal(cam.intrinsics, np.load(folder / INTRINSICS_FILE))
    two = load_camera(folder / POSES_FILE, folder / INTRINSICS_FILE)
    np.testing.assert_array_equal(two.poses, cam.poses)
    np.testing.assert_array_equal(load_camera(folder).intrinsics, cam.intrinsics)


@pytest.mark.parametrize("names", list(PRESET_NAMES) + ["dolly_in+pan_right", "orbit_left+zoom_in+pedestal_up"])
def test_presets_round_trip_through_files(tmp_path, names):
    cam = preset_camera(names, frames=33, speed=1.5)
    folder = save_camera_folder(tmp_path / names.replace("+", "_"), *cam)
    back = load_camera_folder(folder)
    np.testing.assert_array_equal(back.poses, cam.poses)
    np.testing.assert_array_equal(back.intrinsics, cam.intrinsics)
    assert np.load(folder / POSES_FILE).dtype == np.float32


def test_float64_files_are_accepted_and_returned_as_float32(tmp_path):
    poses, k = good()
    write(tmp_path, poses.astype(np.float64), k.astype(np.float64))
    cam = load_camera_folder(tmp_path)
    assert cam.poses.dtype == np.float32 and cam.intrinsics.dtype == np.float32


# ---- bad input ---------------------------------------------------------------------------------------------


def test_missing_folder_and_missing_files(tmp_path):
    with pytest.raises(CameraFileNotFoundError, match="camera folder not found"):
        load_camera_folder(tmp_path / "nope")
    poses, _ = good()
    tmp_path.joinpath("only_poses").mkdir()
    np.save(tmp_path / "only_poses" / POSES_FILE, poses)
    with pytest.raises(CameraFileNotFoundError, match=r"only_poses has no intrinsics\.npy"):
        load_camera_folder(tmp_path / "only_poses")
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(CameraFileNotFoundError, match=r"no poses\.npy and no intrinsics\.npy"):
        load_camera(tmp_path / "empty")
    with pytest.raises(CameraFileNotFoundError, match="camera file not found"):
        load_camera_files(tmp_path / "only_poses" / POSES_FILE, tmp_path / "k.npy")
    with pytest.raises(CameraFileError, match="is a file"):
        load_camera(tmp_path / "only_poses" / POSES_FILE)


@pytest.mark.parametrize(
    "which, array, pattern",
    [
        ("poses", np.zeros((9, 3, 4), np.float32), r"poses\.npy: shape \(9, 3, 4\) is not \[N, 4, 4\]"),
        ("poses", np.zeros((4, 4), np.float32), r"poses\.npy: shape \(4, 4\) is not \[N, 4, 4\]"),
        ("intrinsics", np.zeros((9, 3), np.float32), r"intrinsics\.npy: shape \(9, 3\) is not \[N, 4\]"),
        ("intrinsics", np.zeros((9, 4, 1), np.float32), r"intrinsics\.npy: shape \(9, 4, 1\)"),
        ("poses", np.repeat(np.eye(4, dtype=np.int64)[None], 9, 0), r"poses\.npy: dtype int64 is not floating"),
        ("intrinsics", np.zeros((9, 4), np.complex64), r"intrinsics\.npy: dtype complex64 is not floating"),
        ("intrinsics", np.full((9, 4), "500"), r"intrinsics\.npy: dtype <U3 is not floating"),
    ],
)
def test_wrong_shapes_and_dtypes(tmp_path, which, array, pattern):
    poses, k = good()
    write(tmp_path, array if which == "poses" else poses, array if which == "intrinsics" else k)
    with pytest.raises(CameraFileError, match=pattern):
        load_camera_folder(tmp_path)


def test_nan_and_inf(tmp_path):
    poses, k = good()
    poses[3, 0, 3] = np.nan
    write(tmp_path / "a", poses, k)
    with pytest.raises(CameraFileError, match=r"poses\.npy: NaN or inf in pose\(s\) 3"):
        load_camera_folder(tmp_path / "a")
    poses, k = good()
    k[5, 2] = np.inf
    write(tmp_path / "b", poses, k)
    with pytest.raises(CameraFileError, match=r"intrinsics\.npy: NaN or inf in row\(s\) 5"):
        load_camera_folder(tmp_path / "b")


def test_slightly_off_rotations_are_renormalised_with_a_warning(tmp_path):
    poses, k = good()
    poses[2, :3, :3] *= 1.001  # |R^T R - I| ~ 2e-3: numeric drift, not a different matrix
    write(tmp_path, poses, k)
    with pytest.warns(UserWarning, match=r"poses\.npy: rotation\(s\) of pose\(s\) 2 are not orthonormal"):
        cam = load_camera_folder(tmp_path)
    r = cam.poses[2, :3, :3].astype(np.float64)
    assert np.abs(r.T @ r - np.eye(3)).max() < 1e-6
    np.testing.assert_allclose(r, np.eye(3), atol=1e-6)
    # exact files stay silent
    write(tmp_path, *good())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_camera_folder(tmp_path)


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda p: p.__setitem__((4, slice(0, 3), slice(0, 3)), p[4, :3, :3] * 1.5), r"pose\(s\) 4 is not a rotation"),
        (lambda p: p.__setitem__((1, 0, 0), -1.0), r"pose\(s\) 1 is not a rotation .*det = -1"),  # mirror
        (lambda p: p.__setitem__((6, 3, 0), 0.5), r"bottom row of pose\(s\) 6 is not \(0, 0, 0, 1\)"),
    ],
)
def test_non_rotations_are_refused(tmp_path, edit, pattern):
    poses, k = good()
    edit(poses)
    write(tmp_path, poses, k)
    with pytest.raises(CameraFileError, match=r"poses\.npy: .*" + pattern):
        load_camera_folder(tmp_path)


def test_non_positive_focal_lengths(tmp_path):
    poses, k = good()
    k[2, 0] = 0.0
    k[7, 1] = -500.0
    write(tmp_path, poses, k)
    with pytest.raises(CameraFileError, match=r"intrinsics\.npy: focal length fx or fy <= 0 in row\(s\) 2, 7"):
        load_camera_folder(tmp_path)


def test_intrinsics_count_must_match_poses(tmp_path):
    poses, k = good(9)
    write(tmp_path, poses, k[:7])
    with pytest.raises(CameraFileError, match=r"intrinsics\.npy: 7 rows but there are 9 poses"):
        load_camera_folder(tmp_path)


def test_fewer_poses_than_one_latent_step(tmp_path):
    poses, k = good(4)
    write(tmp_path, poses, k)
    cam = load_camera_folder(tmp_path)  # a valid file...
    with pytest.raises(CameraInputError, match="4 camera pose.*81-frame video needs at least 5"):
        camera_condition(*cam, 32, 48, 81)  # ...that cannot drive a video


def test_files_that_are_not_plain_npy(tmp_path):
    poses, k = good()
    write(tmp_path, poses, k)
    (tmp_path / POSES_FILE).write_bytes(b"this is not numpy")
    with pytest.raises(CameraFileError, match=r"poses\.npy: not a \.npy file"):
        load_camera_folder(tmp_path)
    np.savez(tmp_path / "z.npz", poses=poses)
    (tmp_path / "z.npz").rename(tmp_path / POSES_FILE)
    with pytest.raises(CameraFileError, match=r"poses\.npy: is an \.npz archive"):
        load_camera_folder(tmp_path)
    np.save(tmp_path / POSES_FILE, poses)
    data = (tmp_path / POSES_FILE).read_bytes()
    (tmp_path / POSES_FILE).write_bytes(data[:200])
    with pytest.raises(CameraFileError, match=r"poses\.npy: damaged or truncated"):
        load_camera_folder(tmp_path)


def test_save_validates_before_writing(tmp_path):
    poses, k = good()
    with pytest.raises(CameraInputError, match="intrinsics to save in .*: 3 rows but there are 9 poses"):
        save_camera_folder(tmp_path / "out", poses, k[:3])
    assert not (tmp_path / "out").exists()


def test_save_is_atomic_per_file(tmp_path, monkeypatch):
    """A write that fails half-way (disk full, Ctrl-C) leaves the previous trajectory readable and no temp file."""
    poses, k = good()
    folder = save_camera_folder(tmp_path / "traj", poses, k)
    before = load_camera_folder(folder)
    real_save = np.save

    def half_then_fail(fh, arr, **kw):
        real_save(fh, arr[: len(arr) // 2], **kw)
        raise OSError(28, "No space left on device")

    import lingbot_world.loaders.camera_files as cf

    monkeypatch.setattr(cf.np, "save", half_then_fail)
    with pytest.raises(OSError, match=r"^no space left on the disk .* while writing \S+poses\.npy; free some space"):
        save_camera_folder(folder, poses[::-1].copy(), k)  # named by the file, not the temp it was written to
    monkeypatch.undo()
    after = load_camera_folder(folder)
    assert np.array_equal(after.poses, before.poses) and np.array_equal(after.intrinsics, before.intrinsics)
    assert sorted(p.name for p in folder.iterdir()) == [INTRINSICS_FILE, POSES_FILE]

"""The trajectory picture: size, markers, axis orientation, IMAGE tensor conversion, committed example."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.wan.control.camera_presets import preset_camera
from lingbot_world.wan.control.trajectory_plot import END, START, image_to_tensor, plot_trajectory

DOC_PICTURE = Path(__file__).resolve().parents[1] / "docs" / "trajectory_example_01.png"


def marker_centres(img: Image.Image, colour) -> list:
    """Centroid (x, y) of the pixels of exactly `colour` in the left and the right panel."""
    a = np.asarray(img)[: img.height - 30]  # leave out the legend strip at the bottom
    ys, xs = np.nonzero((a == np.array(colour, dtype=np.uint8)).all(-1))
    half = img.width // 2
    out = []
    for sel in (xs < half, xs >= half):
        assert sel.sum() > 20, f"marker {colour} missing from a panel"
        out.append((xs[sel].mean(), ys[sel].mean()))
    return out


def test_image_size_and_content():
    img = plot_trajectory(*preset_camera("dolly_in+pan_right", frames=81), title="t", size=(800, 400))
    assert img.mode == "RGB" and img.size == (800, 400)
    assert len(np.unique(np.asarray(img).reshape(-1, 3), axis=0)) > 50  # drawn, not blank
    marker_centres(img, START)
    marker_centres(img, END)


@pytest.mark.parametrize(
    "preset, top_dx, top_dy, side_dx, side_dy",
    [
        ("dolly_in", 0, -1, 1, 0),  # forward: up the top view, right in the side view
        ("truck_right", 1, 0, 0, 0),  # right: right in the top view, hidden in the side view
        ("pedestal_up", 0, 0, 0, -1),  # up (-y): up the side view
    ],
)
def test_axes_point_the_documented_way(preset, top_dx, top_dy, side_dx, side_dy):
    img = plot_trajectory(*preset_camera(preset, frames=41))
    (s_top, s_side), (e_top, e_side) = marker_centres(img, START), marker_centres(img, END)
    for (s, e, dx, dy) in [(s_top, e_top, top_dx, top_dy), (s_side, e_side, side_dx, side_dy)]:
        mx, my = e[0] - s[0], e[1] - s[1]
        assert (np.sign(round(mx)) if abs(mx) > 20 else 0) == dx, (preset, mx, my)
        assert (np.sign(round(my)) if abs(my) > 20 else 0) == dy, (preset, mx, my)


def test_degenerate_paths_still_draw():
    plot_trajectory(np.eye(4, dtype=np.float32)[None])  # a single pose
    img = plot_trajectory(*preset_camera("static", frames=9))
    # start drawn on top of end when the camera never moves
    (s, _), (e, _) = marker_centres(img, START), marker_centres(img, END)
    assert abs(s[0] - e[0]) < 2 and abs(s[1] - e[1]) < 2
    with pytest.raises(ValueError, match=r"\[N, 4, 4\]"):
        plot_trajectory(np.zeros((3, 3)))


def test_image_to_tensor():
    img = plot_trajectory(*preset_camera("orbit_left", frames=41), size=(320, 200))
    t = image_to_tensor(img)
    assert t.shape == (1, 200, 320, 3) and t.dtype == torch.float32
    assert 0 <= t.min() and t.max() <= 1
    np.testing.assert_array_equal((t[0].numpy() * 255).round().astype(np.uint8), np.asarray(img))


def test_committed_example_picture():
    assert DOC_PICTURE.is_file(), "render docs/trajectory_example_01.png from example 01"
    assert DOC_PICTURE.stat().st_size < 200_000
    with Image.open(DOC_PICTURE) as im:
        assert im.format == "PNG" and im.width >= 640


def test_key_timeline_under_the_path():
    from lingbot_world.wan.control.act_to_camera import keys_to_camera
    from lingbot_world.wan.control.actions import KeyTimeline
    from lingbot_world.wan.control.trajectory_plot import BACKGROUND, TIMELINE_ORDER, TIMELINE_ROW, plot_key_timeline

    keys = KeyTimeline.from_string("w-10,none-10,jl-5,i-15")
    path, _ = keys_to_camera(keys)
    img = plot_trajectory(path.poses, path.intrinsics, size=(800, 400), keys=keys)
    strip = plot_key_timeline(keys, 800)
    assert img.size == (800, 400 + strip.height)
    np.testing.assert_array_equal(np.asarray(img)[400:], np.asarray(strip))
    a = np.asarray(strip)
    x0, x1, top = 96, 800 - 16, 24  # the strip's plot area (see plot_key_timeline)
    scale = (x1 - x0) / keys.frames

    def held(key: str, frame: int) -> bool:
        y = top + TIMELINE_ORDER.index(key) * TIMELINE_ROW + TIMELINE_ROW // 2
        x = int(x0 + (frame + 0.5) * scale)
        return tuple(a[y, x]) != BACKGROUND and tuple(a[y, x]) != (228, 228, 228)

    assert held("w", 0) and held("w", 9) and not held("w", 10) and not held("s", 3)
    assert held("j", 22) and held("l", 22) and not held("j", 30)  # both held (they cancel in the walk)
    assert held("i", 39) and not held("k", 39)


def test_committed_keys_picture():
    picture = DOC_PICTURE.with_name("trajectory_keys_example.png")
    assert picture.is_file() and picture.stat().st_size < 200_000
    with Image.open(picture) as im:
        assert im.format == "PNG" and im.width == 960 and im.height > 480


def test_a_long_path_is_drawn_through_at_most_two_poses_per_pixel(monkeypatch):
    """A played video's minimap is drawn after every chunk: its cost must not grow with the video. A path of 2,637
    poses is drawn through evenly spaced ones (first and last kept) and looks like the path drawn through all."""
    from lingbot_world.wan.control import trajectory_plot
    from lingbot_world.wan.control.act_to_camera import keys_to_camera
    from lingbot_world.wan.control.actions import KeyTimeline

    assert trajectory_plot._drawn_points(5, 10) == [0, 1, 2, 3, 4]
    drawn = trajectory_plot._drawn_points(2637, 172)
    assert drawn[0] == 0 and drawn[-1] == 2636 and len(drawn) <= 172 and drawn == sorted(set(drawn))
    path, _ = keys_to_camera(KeyTimeline.from_string(",".join(["w-6,wl-6", "d-12", "wj-12"] * 73 + ["w-9"])))
    args = (np.asarray(path.poses), np.asarray(path.intrinsics[0]))
    lines: list[int] = []  # the width of every line drawn
    real_line = trajectory_plot.ImageDraw.ImageDraw.line

    def counted_line(self, xy, *a, **kw):
        lines.append(kw.get("width"))
        return real_line(self, xy, *a, **kw)

    monkeypatch.setattr(trajectory_plot.ImageDraw.ImageDraw, "line", counted_line)
    few = np.asarray(plot_trajectory(*args, size=(320, 320), key_frames=3))
    assert 0 < lines.count(3) <= 2 * 2 * 86  # the path's segments (width 3) in both 86-pixel panels
    monkeypatch.setattr(trajectory_plot, "POINTS_PER_PIXEL", 10**6)
    every = np.asarray(plot_trajectory(*args, size=(320, 320), key_frames=3))
    for colour in (START, END):
        assert np.allclose(marker_centres(Image.fromarray(few), colour), marker_centres(Image.fromarray(every), colour))
    assert (few != every).any(-1).mean() < 0.02  # the same picture but for the path's finest wiggles


@pytest.mark.parametrize("size", [(320, 320), (960, 480)])
def test_every_text_fits_the_picture_and_none_overlaps(monkeypatch, size):
    """The player's 320x320 minimap: the title and the path's numbers were drawn over each other and the legend ran
    off the right edge. Every text drawn on the picture is recorded with its box."""
    from PIL import ImageDraw

    from lingbot_world.wan.control.act_to_camera import keys_to_camera
    from lingbot_world.wan.control.actions import KeyTimeline

    boxes = []
    real_text = ImageDraw.ImageDraw.text

    def text(self, xy, content, *a, **kw):
        if self.im.size == size:  # the picture itself, not a rotated axis label drawn apart
            boxes.append((content, self.textbbox(xy, content, font=kw.get("font"), anchor=kw.get("anchor"))))
        return real_text(self, xy, content, *a, **kw)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)
    path, _ = keys_to_camera(KeyTimeline.from_string("w-20,j-12,wj-20,d-8"), None)
    plot_trajectory(path.poses, path.intrinsics, size=size, key_frames=3)
    texts = [t for t, _ in boxes]
    assert any(t.startswith("frustums at frames") or t.startswith("frustums") for t in texts)
    for t, (x0, y0, x1, y1) in boxes:
        assert 0 <= x0 and x1 <= size[0] and 0 <= y0 and y1 <= size[1], (t, (x0, y0, x1, y1), size)
    words = [(t, b) for t, b in boxes if not t.replace(".", "").replace("-", "").isdigit()]  # tick labels apart
    for i, (a, (ax0, ay0, ax1, ay1)) in enumerate(words):
        for b, (bx0, by0, bx1, by1) in words[i + 1:]:
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, (a, b)

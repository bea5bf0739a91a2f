"""A picture of a camera path (PIL only): a top view and a side view with small frustums at key frames.

Everything is drawn in the axes of the FIRST camera (OpenCV: x right, y down, z forward), so the picture
reads the same whatever the world frame of poses.npy is:
- top view: x (right) horizontal, z (forward) pointing up the picture;
- side view: z (forward) horizontal, -y (up) pointing up the picture, i.e. seen from the camera's right.
Both panels use equal scales on their two axes. The path is coloured from blue (start) to orange (end);
the start is a green dot, the end a red square.

For a path built from keys (`keys=`), a key timeline sits under the views: one row per key (W A S D move,
I K look up/down, J L turn), a filled cell for every frame the key is held, in the same time colours as the path.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from .actions import KEYS, KeyTimeline
from .camera import INTRINSICS_HEIGHT, INTRINSICS_WIDTH, invert_rigid

ArrayLike = Union[np.ndarray, torch.Tensor]

BACKGROUND = (255, 255, 255)
GRID = (228, 228, 228)
AXIS = (120, 120, 120)
TEXT = (30, 30, 30)
START = (30, 160, 60)
END = (210, 40, 40)
PATH_FROM = (40, 90, 200)
PATH_TO = (240, 140, 20)
DEFAULT_INTRINSICS = (502.9116, 503.10812, 415.77786, 239.77779)  # examples' calibration at 480x832
KEY_LABELS = {"w": "W: forward", "a": "A: left", "s": "S: back", "d": "D: right",
              "i": "I: look up", "k": "K: look down", "j": "J: turn left", "l": "L: turn right"}
TIMELINE_ORDER = "wsadikjl"  # opposite keys next to each other
TIMELINE_ROW = 15
POINTS_PER_PIXEL = 2  # a path longer than this per pixel of its panel's width is drawn through evenly spaced poses

# (title, horizontal axis, vertical axis): axis = (index into x,y,z, sign, label)
VIEWS = (
    ("top view (x-z)", (0, 1.0, "x (right)"), (2, 1.0, "z (forward)")),
    ("side view (z-y)", (2, 1.0, "z (forward)"), (1, -1.0, "-y (up)")),
)


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the fixed bitmap font
        return ImageFont.load_default()


def _nice_step(span: float, target_ticks: int = 5) -> float:
    raw = span / max(target_ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def _fmt(v: float, step: float) -> str:
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{decimals}f}"


def _lerp_colour(a: tuple, b: tuple, t: float) -> tuple:
    return tuple(int(round(x + (y - x) * t)) for x, y in zip(a, b))


def _frustum_points(rel: np.ndarray, intrinsics: Sequence[float], depth: float) -> np.ndarray:
    """Camera centre + 4 image-corner points at `depth`, in first-camera axes: [5, 3]."""
    fx, fy, cx, cy = intrinsics
    corners = np.array(
        [[0, 0], [INTRINSICS_WIDTH, 0], [INTRINSICS_WIDTH, INTRINSICS_HEIGHT], [0, INTRINSICS_HEIGHT]], dtype=float
    )
    cam = np.stack([(corners[:, 0] - cx) / fx, (corners[:, 1] - cy) / fy, np.ones(4)], axis=1) * depth
    pts = np.concatenate([np.zeros((1, 3)), cam]) @ rel[:3, :3].T + rel[:3, 3]
    return pts


def _drawn_points(n: int, limit: int) -> list[int]:
    """Which of a path's n poses are drawn: all of them, or `limit` evenly spaced ones (first and last kept), so a
    long path costs what its panel's pixels can show."""
    if n <= limit:
        return list(range(n))
    return np.unique(np.round(np.linspace(0, n - 1, max(limit, 2))).astype(int)).tolist()


def _key_frames(n: int, count: int) -> list[int]:
    if n <= count:
        return list(range(n))
    return sorted({int(round(i * (n - 1) / (count - 1))) for i in range(count)})


def plot_key_timeline(keys: KeyTimeline, width: int = 960) -> Image.Image:
    """The key timeline strip: one row per key, a cell per frame the key is held (colour = time, as the path)."""
    n = keys.frames
    label_w, right, top = 96, 16, 24
    bottom = 26
    height = top + TIMELINE_ROW * len(TIMELINE_ORDER) + bottom
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    font, small = _font(13), _font(11)
    draw.text((12, 4), f"keys per frame ({n} frames)", fill=TEXT, font=font)
    x0, x1 = label_w, width - right
    scale = (x1 - x0) / max(n, 1)
    step = _nice_step(max(n, 1), 8)
    step = max(1, int(round(step)))
    y_end = top + TIMELINE_ROW * len(TIMELINE_ORDER)
    for t in range(0, n + 1, step):
        x = x0 + t * scale
        draw.line([(x, top), (x, y_end)], fill=GRID)
        draw.text((x, y_end + 4), str(t), fill=AXIS, font=small, anchor="ma")
    for r, key in enumerate(TIMELINE_ORDER):
        y = top + r * TIMELINE_ROW
        draw.text((8, y + TIMELINE_ROW / 2), KEY_LABELS[key], fill=TEXT, font=small, anchor="lm")
        held = keys.pressed[:, KEYS.index(key)]
        for f in np.flatnonzero(held):
            colour = _lerp_colour(PATH_FROM, PATH_TO, f / max(n - 1, 1))
            draw.rectangle([x0 + f * scale, y + 2, max(x0 + (f + 1) * scale - 1, x0 + f * scale), y + TIMELINE_ROW - 2],
                           fill=colour)
        draw.line([(x0, y + TIMELINE_ROW), (x1, y + TIMELINE_ROW)], fill=GRID)
    draw.rectangle([x0, top, x1, y_end], outline=AXIS)
    draw.text((x1, y_end + 4), "frame", fill=AXIS, font=small, anchor="ra")
    return img


def plot_trajectory(
    poses: ArrayLike,
    intrinsics: Optional[ArrayLike] = None,
    title: Optional[str] = None,
    size: tuple[int, int] = (960, 480),
    key_frames: int = 7,
    keys: Optional[KeyTimeline] = None,
) -> Image.Image:
    """Top and side views of a camera path [N, 4, 4] (camera-to-world, OpenCV) as an RGB PIL image.

    intrinsics: [4] or [N, 4] at 480x832 (first row shapes the frustums; default: the examples').
    key_frames: how many evenly spaced poses get a frustum (first and last included).
    keys: the keys the path was built from; adds the key timeline under the views (the image grows taller).
    """
    if keys is not None:
        views = plot_trajectory(poses, intrinsics, title, size, key_frames)
        timeline = plot_key_timeline(keys, size[0])
        out = Image.new("RGB", (size[0], views.height + timeline.height), BACKGROUND)
        out.paste(views, (0, 0))
        out.paste(timeline, (0, views.height))
        return out
    c2w = torch.as_tensor(np.asarray(poses), dtype=torch.float64)
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4) or c2w.shape[0] < 1:
        raise ValueError(f"poses must be [N, 4, 4], got {tuple(c2w.shape)}")
    rel = (invert_rigid(c2w[:1]) @ c2w).numpy()
    k = DEFAULT_INTRINSICS if intrinsics is None else tuple(np.asarray(intrinsics, dtype=float).reshape(-1, 4)[0])
    n = rel.shape[0]
    centres = rel[:, :3, 3]

    extent = float(np.ptp(centres, axis=0).max()) if n > 1 else 0.0
    depth = 0.08 * extent if extent > 0 else 1.0
    keys = _key_frames(n, key_frames)
    frustums = {i: _frustum_points(rel[i], k, depth) for i in keys}
    every = np.concatenate([centres] + list(frustums.values()))

    width, height = size
    img = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(img)
    font, small = _font(15), _font(12)
    heading = title or "camera path"
    info = f"{n} poses, path length {np.linalg.norm(np.diff(centres, axis=0), axis=1).sum():.3g} (first-camera axes)"
    frames_note = f"frustums at frames {', '.join(str(i) for i in keys)}; colour = time (blue -> orange)"
    header = _draw_header(draw, heading, info, width, font, small)
    notes = _wrap(draw, frames_note, small, width - 24) if draw.textlength(frames_note, font=small) > width - 146 \
        else []
    footer = 24 + LINE * len(notes)

    panel_w = width // len(VIEWS)
    for v, (name, (hi, hs, hlabel), (vi, vs, vlabel)) in enumerate(VIEWS):
        left, right = v * panel_w + 58, (v + 1) * panel_w - 16
        top, bottom = header + 22, height - footer - 34
        hvals, vvals = every[:, hi] * hs, every[:, vi] * vs
        hmid, vmid = (hvals.max() + hvals.min()) / 2, (vvals.max() + vvals.min()) / 2
        span = max(np.ptp(hvals) / (right - left), np.ptp(vvals) / (bottom - top), 1e-9) * 1.1
        scale = 1.0 / span  # pixels per scene unit, equal on both axes
        if not np.isfinite(scale) or np.ptp(every) == 0:
            scale = 1.0

        def to_px(p: np.ndarray) -> tuple[float, float]:
            return (
                (left + right) / 2 + (p[hi] * hs - hmid) * scale,
                (top + bottom) / 2 - (p[vi] * vs - vmid) * scale,
            )

        # grid and tick labels
        hlo, hhi = hmid - (right - left) / 2 / scale, hmid + (right - left) / 2 / scale
        vlo, vhi = vmid - (bottom - top) / 2 / scale, vmid + (bottom - top) / 2 / scale
        step = _nice_step(max(hhi - hlo, vhi - vlo))
        for t in np.arange(math.ceil(hlo / step) * step, hhi + 1e-9 * step, step):
            x = (left + right) / 2 + (t - hmid) * scale
            draw.line([(x, top), (x, bottom)], fill=AXIS if abs(t) < step * 1e-6 else GRID)
            draw.text((x, bottom + 4), _fmt(t, step), fill=AXIS, font=small, anchor="ma")
        for t in np.arange(math.ceil(vlo / step) * step, vhi + 1e-9 * step, step):
            y = (top + bottom) / 2 - (t - vmid) * scale
            draw.line([(left, y), (right, y)], fill=AXIS if abs(t) < step * 1e-6 else GRID)
            draw.text((left - 5, y), _fmt(t, step), fill=AXIS, font=small, anchor="rm")
        draw.rectangle([left, top, right, bottom], outline=AXIS)
        draw.text(((left + right) / 2, header + 2), name, fill=TEXT, font=font, anchor="ma")
        draw.text(((left + right) / 2, bottom + 20), hlabel, fill=TEXT, font=small, anchor="ma")
        label = Image.new("RGB", (int(draw.textlength(vlabel, font=small)) + 4, 16), BACKGROUND)
        ImageDraw.Draw(label).text((2, 1), vlabel, fill=TEXT, font=small)
        label = label.rotate(90, expand=True)
        img.paste(label, (v * panel_w + 4, int((top + bottom) / 2 - label.height / 2)))

        # frustums, path, start and end markers
        for i, pts in frustums.items():
            colour = _lerp_colour(PATH_FROM, PATH_TO, i / max(n - 1, 1))
            px = [to_px(p) for p in pts]
            for c in px[1:]:
                draw.line([px[0], c], fill=colour, width=1)
            draw.line(px[1:] + [px[1]], fill=colour, width=2)
        drawn = _drawn_points(n, POINTS_PER_PIXEL * (right - left))
        path = [to_px(centres[i]) for i in drawn]
        for j in range(len(path) - 1):
            draw.line([path[j], path[j + 1]], fill=_lerp_colour(PATH_FROM, PATH_TO, drawn[j] / max(n - 2, 1)),
                      width=3)
        ex, ey = path[-1]
        draw.rectangle([ex - 7, ey - 7, ex + 7, ey + 7], fill=END, outline=TEXT)
        sx, sy = path[0]  # drawn last so that it stays visible when the camera returns (or never moves)
        draw.ellipse([sx - 5, sy - 5, sx + 5, sy + 5], fill=START, outline=TEXT)

    legend_y = height - footer + 4
    draw.ellipse([12, legend_y + 2, 24, legend_y + 14], fill=START, outline=TEXT)
    draw.text((30, legend_y), "start", fill=TEXT, font=small)
    draw.rectangle([78, legend_y + 3, 88, legend_y + 13], fill=END, outline=TEXT)
    draw.text((94, legend_y), "end", fill=TEXT, font=small)
    if not notes:  # room beside the markers; else it goes under them, wrapped to the picture's width
        draw.text((134, legend_y), frames_note, fill=AXIS, font=small)
    for i, line in enumerate(notes):
        draw.text((12, legend_y + LINE * (i + 1)), line, fill=AXIS, font=small)
    return img


LINE = 15  # a line of the small text


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> list[str]:
    """`text` broken at spaces into lines no wider than `width` (a single longer word keeps a line of its own)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def _draw_header(draw: ImageDraw.ImageDraw, heading: str, info: str, width: int, font, small) -> int:
    """The title, with the path's numbers right of it where they fit, else on lines under it; the header's
    height."""
    title_w = draw.textlength(heading, font=font)
    draw.text((12, 7), heading, fill=TEXT, font=font)
    if 12 + title_w + 16 + draw.textlength(info, font=small) <= width - 12:
        draw.text((width - 12, 9), info, fill=AXIS, font=small, anchor="ra")
        return 30
    lines = _wrap(draw, info, small, width - 24)
    for i, line in enumerate(lines):
        draw.text((12, 27 + LINE * i), line, fill=AXIS, font=small)
    return 30 + LINE * len(lines)


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> float32 [1, H, W, 3] in 0..1 (a ComfyUI IMAGE batch of one)."""
    arr = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).unsqueeze(0)

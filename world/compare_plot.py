"""The picture of a preset comparison (PIL only): two panels over the chunks, every preset against the first.

- top: the frames: PSNR in dB (solid, left axis) and SSIM (dashed, right axis, 0..1). A chunk whose frames equal the
  reference's (PSNR infinite) is a triangle on the top edge.
- bottom: the K/V cache: relative L2 (solid) and 1 - cosine (dashed) on one axis from 0.

One colour per preset (the legend under the panels); the reference itself is not drawn (it is identical to
itself: PSNR inf, SSIM 1, drift 0).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (255, 255, 255)
GRID = (228, 228, 228)
AXIS = (120, 120, 120)
TEXT = (30, 30, 30)
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207),
           (140, 86, 75), (227, 119, 194))
SIZE = (960, 720)
LEFT, RIGHT, TOP = 72, 72, 72
PANEL_GAP = 64
LEGEND_ROW = 18


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the fixed bitmap font
        return ImageFont.load_default()


def colour(index: int) -> tuple[int, int, int]:
    """The colour of the preset at `index` (1: the first compared with the reference)."""
    return COLOURS[(index - 1) % len(COLOURS)]


def panel_boxes(size: tuple[int, int] = SIZE, presets: int = 2) -> list[tuple[int, int, int, int]]:
    """The plot areas (x0, y0, x1, y1) of the frames panel and the K/V panel in a picture of `size` comparing
    `presets` presets (the legend below them takes a row per preset compared)."""
    w, h = size
    legend = LEGEND_ROW * (presets + 1) + 40
    panel = (h - TOP - PANEL_GAP - legend - 30) // 2
    top0 = TOP
    top1 = top0 + panel + PANEL_GAP
    return [(LEFT, top0, w - RIGHT, top0 + panel), (LEFT, top1, w - RIGHT, top1 + panel)]


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = max(span, 1e-12) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """(lo, hi) widened to whole steps, and the ticks between."""
    if not hi > lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    step = _nice_step(hi - lo)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    n = int(round((hi - lo) / step))
    return lo, hi, [lo + i * step for i in range(n + 1)]


def _label(v: float, ticks: Sequence[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{decimals}f}"


class _Panel:
    def __init__(self, draw: ImageDraw.ImageDraw, box, chunks: int, lo: float, hi: float, title: str, y_label: str):
        self.draw, self.box, self.chunks = draw, box, chunks
        self.lo, self.hi, self.ticks = _ticks(lo, hi)
        x0, y0, x1, y1 = box
        font, small = _font(14), _font(11)
        draw.text((x0, y0 - 24), title, fill=TEXT, font=font)
        for t in self.ticks:
            y = self.y(t, self.lo, self.hi)
            draw.line([(x0, y), (x1, y)], fill=GRID)
            draw.text((x0 - 6, y), _label(t, self.ticks), fill=AXIS, font=small, anchor="rm")
        for c in range(chunks):
            x = self.x(c)
            draw.line([(x, y1), (x, y1 + 4)], fill=AXIS)
            if chunks <= 24 or c % math.ceil(chunks / 24) == 0:
                draw.text((x, y1 + 6), str(c), fill=AXIS, font=small, anchor="ma")
        draw.text(((x0 + x1) / 2, y1 + 22), "chunk", fill=AXIS, font=small, anchor="ma")
        draw.text((x0 - 6, y0 - 8), y_label, fill=AXIS, font=small, anchor="rb")
        draw.rectangle(box, outline=AXIS)

    def x(self, chunk: int) -> float:
        x0, _, x1, _ = self.box
        pad = 16
        return x0 + pad + (x1 - x0 - 2 * pad) * (chunk / max(self.chunks - 1, 1))

    def y(self, v: float, lo: float, hi: float) -> float:
        _, y0, _, y1 = self.box
        return y1 - (y1 - y0) * (v - lo) / (hi - lo)

    def right_axis(self, lo: float, hi: float, label: str) -> tuple[float, float]:
        lo, hi, ticks = _ticks(lo, hi)
        _, y0, x1, _ = self.box
        small = _font(11)
        for t in ticks:
            y = self.y(t, lo, hi)
            self.draw.line([(x1, y), (x1 + 4, y)], fill=AXIS)
            self.draw.text((x1 + 6, y), _label(t, ticks), fill=AXIS, font=small, anchor="lm")
        self.draw.text((x1 + 6, y0 - 8), label, fill=AXIS, font=small, anchor="lb")
        return lo, hi

    def series(self, values: Sequence[Optional[float]], lo: float, hi: float, fill, dashed: bool = False) -> None:
        """A line through the chunks' values; None: on the top edge with a triangle (identical frames)."""
        _, y0, _, _ = self.box
        points = [(self.x(c), y0 if v is None else self.y(v, lo, hi)) for c, v in enumerate(values)]
        for a, b in zip(points, points[1:]):
            _line(self.draw, a, b, fill, dashed)
        for (x, y), v in zip(points, values):
            if v is None:
                self.draw.polygon([(x - 5, y + 9), (x + 5, y + 9), (x, y + 1)], fill=fill)
            elif dashed:
                self.draw.rectangle([x - 3, y - 3, x + 3, y + 3], outline=fill, width=2)
            else:
                self.draw.ellipse([x - 3.5, y - 3.5, x + 3.5, y + 3.5], fill=fill)


def _line(draw: ImageDraw.ImageDraw, a, b, fill, dashed: bool, dash: float = 7.0) -> None:
    if not dashed:
        draw.line([a, b], fill=fill, width=2)
        return
    length = math.hypot(b[0] - a[0], b[1] - a[1])
    n = max(1, int(length // dash))
    for i in range(0, n, 2):
        s, e = i / n, min(1.0, (i + 1) / n)
        draw.line([(a[0] + (b[0] - a[0]) * s, a[1] + (b[1] - a[1]) * s),
                   (a[0] + (b[0] - a[0]) * e, a[1] + (b[1] - a[1]) * e)], fill=fill, width=2)


def plot_comparison(result, size: tuple[int, int] = SIZE) -> Image.Image:
    """The picture of a world.compare.Comparison (see the module docstring)."""
    others = result.variants[1:]
    chunks = len(result.reference.chunks)
    img = Image.new("RGB", size, BACKGROUND)
    draw = ImageDraw.Draw(img)
    boxes = panel_boxes(size, len(result.variants))
    ref = result.reference.variant.label
    draw.text((LEFT, 8), f"{result.title}, {result.height}x{result.width}, seed {result.seed}: presets against {ref}",
              fill=TEXT, font=_font(15))

    psnrs = [[None if math.isinf(c.quality.psnr) else c.quality.psnr for c in v.chunks] for v in others]
    finite = [p for row in psnrs for p in row if p is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 60.0)
    frames = _Panel(draw, boxes[0], chunks, lo, hi, f"frames against {ref}: PSNR (solid, left) and SSIM (dashed, "
                    "right); a triangle on the top edge: identical frames", "PSNR dB")
    ssims = [[c.quality.ssim for c in v.chunks] for v in others]
    s_lo, s_hi = frames.right_axis(min(min(r) for r in ssims), max(max(r) for r in ssims), "SSIM")
    measured = all(c.drift is not None for v in others for c in v.chunks)
    drifts = [[c.drift.rel_l2 for c in v.chunks] for v in others] if measured else []
    angles = [[1.0 - c.drift.cosine for c in v.chunks] for v in others] if measured else []
    top = max(max(max(r) for r in drifts), max(max(r) for r in angles)) if measured else 1.0
    kv = _Panel(draw, boxes[1], chunks, 0.0, top if top > 0 else 1.0, f"K/V cache against {ref}: relative L2 "
                "(solid) and 1 - cosine (dashed), mean over layers", "drift")
    if not measured:
        x0, y0, x1, y1 = boxes[1]
        draw.text(((x0 + x1) / 2, (y0 + y1) / 2), "not measured (--kv-drift off)", fill=AXIS, font=_font(14),
                  anchor="mm")
    for i in range(len(others)):
        fill = colour(i + 1)
        frames.series(psnrs[i], frames.lo, frames.hi, fill)
        frames.series(ssims[i], s_lo, s_hi, fill, dashed=True)
        if measured:
            kv.series(drifts[i], kv.lo, kv.hi, fill)
            kv.series(angles[i], kv.lo, kv.hi, fill, dashed=True)
    _legend(draw, result, boxes[1][3] + 44, size[0])
    return img


def fit_text(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> str:
    """`text`, cut at the end with an ellipsis where it is wider than `width` pixels (a preset's whole settings are
    in compare.json; the picture keeps its label and as much of them as fits)."""
    if draw.textlength(text, font=font) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if draw.textlength(text[:mid].rstrip() + "…", font=font) <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "…"


def _legend(draw: ImageDraw.ImageDraw, result, y: float, width: int) -> None:
    font = _font(12)
    room = width - LEFT - 30 - 12
    for i, v in enumerate(result.variants):
        row = y + i * LEGEND_ROW
        if i == 0:
            draw.text((LEFT + 30, row), fit_text(draw, f"{v.variant.label}: the reference ({v.summary})", font, room),
                      fill=TEXT, font=font)
            continue
        fill = colour(i)
        draw.line([(LEFT, row + 7), (LEFT + 22, row + 7)], fill=fill, width=3)
        draw.text((LEFT + 30, row), fit_text(draw, f"{v.variant.label} ({v.summary})", font, room), fill=TEXT,
                  font=font)

"""What a played session's latency was, from both ends: the server's clock and the page's.

Per chunk the server knows when the page's request arrived and when the first decoded frame was ready; only the
page knows when the user pressed the key and when that chunk's first frame reached the screen (after the JPEG
decode and the frames of the chunk still playing ahead of it). The page reports its numbers over the socket after
it shows each chunk it asked for; both are kept here per chunk, summarised live on the page and at the end of a run.
The page's clock and the server's are never compared with each other: each side measures durations on its own.

With previews (a tiny decoder: the chunk's frames after its first denoising step, shown until its real frames
come) a chunk has two moments on screen: its first picture (`*_preview_s`: the preview's, or the real frame's when
those overtook it) and its first real frame (`*_screen_s`, as without previews).
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

PAGE_FIELDS = ("request_to_arrival_s", "request_to_screen_s", "key_to_screen_s", "fps", "request_to_preview_s",
               "key_to_preview_s")
MAX_SECONDS = 3600.0  # a report beyond an hour is not a measurement
MAX_ROWS = 100_000  # an endless session keeps a bounded record


@dataclass
class ChunkTiming:
    chunk: int
    server_first_frame_s: Optional[float] = None  # request arrived -> first frame ready to send (server clock)
    server_total_s: Optional[float] = None  # request arrived -> chunk committed (server clock)
    request_to_arrival_s: Optional[float] = None  # page sent the keys -> first real frame arrived (page clock)
    request_to_screen_s: Optional[float] = None  # page sent the keys -> first real frame on screen (page clock)
    key_to_screen_s: Optional[float] = None  # a key pressed or released -> the chunk it steered on screen
    fps: Optional[float] = None  # frames shown per second over the last 2 s, at that moment
    # with previews (None without): the server's request -> preview ready, and the page's -> the chunk's first
    # picture on screen (its preview, or its real frame when that came first)
    server_preview_s: Optional[float] = None
    request_to_preview_s: Optional[float] = None
    key_to_preview_s: Optional[float] = None


def _seconds(value, name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"timing: {name} must be a number of seconds in 0 .. {MAX_SECONDS:.0f}, got {value!r}")
    return float(value)


def _stats(values: list[float]) -> Optional[dict]:
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {"n": len(values), "median": round(statistics.median(values), 4), "p90": round(p90, 4),
            "max": round(ordered[-1], 4)}


class PlayTimings:
    def __init__(self):
        self._rows: dict[int, ChunkTiming] = {}

    def _row(self, chunk: int) -> ChunkTiming:
        if chunk not in self._rows and len(self._rows) >= MAX_ROWS:
            self._rows.pop(next(iter(self._rows)))
        return self._rows.setdefault(chunk, ChunkTiming(chunk))

    def server(self, chunk: int, first_frame_s: float, total_s: float, preview_s: Optional[float] = None) -> None:
        row = self._row(chunk)
        row.server_first_frame_s, row.server_total_s = round(first_frame_s, 4), round(total_s, 4)
        row.server_preview_s = None if preview_s is None else round(preview_s, 4)

    def page(self, report: dict) -> ChunkTiming:
        """The page's numbers for one chunk it showed (a socket message: checked, one line when wrong)."""
        chunk = report.get("chunk")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"timing: 'chunk' must be a chunk number >= 1, got {chunk!r}")
        values = {name: _seconds(report.get(name), name) for name in PAGE_FIELDS}
        row = self._row(chunk)
        for name, value in values.items():
            if value is not None:
                setattr(row, name, round(value, 4))
        return row

    def forget_after(self, chunks: int) -> None:
        """A rewind: the chunks past the boundary are played again and measured again."""
        for chunk in [c for c in self._rows if c > chunks]:
            del self._rows[chunk]

    def row(self, chunk: int) -> Optional[ChunkTiming]:
        return self._rows.get(chunk)

    @property
    def rows(self) -> list[ChunkTiming]:
        return [self._rows[c] for c in sorted(self._rows)]

    def summary(self) -> dict:
        rows = self.rows
        out: dict = {"chunks": len(rows)}
        for name in ("server_first_frame_s", "server_total_s", "server_preview_s", *PAGE_FIELDS):
            out[name] = _stats([getattr(r, name) for r in rows if getattr(r, name) is not None])
        return out

    def line(self) -> str:
        """One line for the end of a run (what the page measured, if a page played)."""
        s = self.summary()
        if not s["chunks"]:
            return "player timings: no chunk was measured"

        def part(label: str, name: str) -> str:
            st = s[name]
            return f"{label} {st['median']:.2f} s (p90 {st['p90']:.2f})" if st else f"{label} -"

        fps = s["fps"]
        previews = "".join(f"{part(label, name)}, " for label, name in (
            ("key -> preview", "key_to_preview_s"), ("server preview", "server_preview_s")) if s[name])
        return ("player timings over {} chunks: {}, {}, {}, {}page {} fps".format(
            s["chunks"], part("key -> screen", "key_to_screen_s"), part("request -> screen", "request_to_screen_s"),
            part("server first frame", "server_first_frame_s"), previews, f"{fps['median']:.1f}" if fps else "-"))

    def write(self, path: Path) -> Path:
        """The summary and every chunk's row as JSON, written atomically (an existing file is only replaced whole)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.part")
        try:
            tmp.write_text(json.dumps({"summary": self.summary(), "chunks": [asdict(r) for r in self.rows]},
                                      indent=1), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

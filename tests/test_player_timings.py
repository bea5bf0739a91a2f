"""The player's latency record (player/timings.py): the page's and the server's numbers per chunk, checked
reports, a rewind forgets what is played again, a summary line and an atomic JSON file."""
from __future__ import annotations

import json

import pytest

from lingbot_world.player.timings import PlayTimings


def _played(n: int) -> PlayTimings:
    t = PlayTimings()
    for c in range(1, n + 1):
        t.server(c, first_frame_s=0.1 * c, total_s=0.2 * c)
        t.page({"chunk": c, "request_to_arrival_s": 0.1 * c + 0.01, "request_to_screen_s": 0.1 * c + 0.5,
                "key_to_screen_s": 1.0 + c if c % 2 else None, "fps": 16})
    return t


def test_rows_keep_both_clocks_and_the_summary_counts_key_changes_only():
    t = _played(10)
    rows = t.rows
    assert [r.chunk for r in rows] == list(range(1, 11))
    assert rows[2].server_first_frame_s == pytest.approx(0.3) and rows[2].request_to_screen_s == pytest.approx(0.8)
    s = t.summary()
    assert s["chunks"] == 10 and s["key_to_screen_s"]["n"] == 5  # chunks 1, 3, 5, 7, 9 followed a key change
    assert s["key_to_screen_s"]["median"] == pytest.approx(6.0) and s["key_to_screen_s"]["max"] == pytest.approx(10.0)
    assert s["server_first_frame_s"]["p90"] == pytest.approx(0.9)
    line = t.line()
    assert line.startswith("player timings over 10 chunks: key -> screen 6.00 s (p90 10.00)") and "16.0 fps" in line


@pytest.mark.parametrize("report, name", [
    ({"chunk": 0}, "'chunk'"), ({"chunk": True}, "'chunk'"), ({"chunk": "2"}, "'chunk'"),
    ({"chunk": 1, "request_to_screen_s": -1}, "request_to_screen_s"),
    ({"chunk": 1, "key_to_screen_s": float("nan")}, "key_to_screen_s"),
    ({"chunk": 1, "fps": "fast"}, "fps"), ({"chunk": 1, "request_to_arrival_s": 1e9}, "request_to_arrival_s")])
def test_a_bad_report_is_one_line_naming_the_field(report, name):
    with pytest.raises(ValueError, match=name):
        PlayTimings().page(report)


def test_a_rewind_forgets_the_chunks_played_again():
    t = _played(6)
    t.forget_after(4)
    assert [r.chunk for r in t.rows] == [1, 2, 3, 4]
    t.forget_after(0)
    assert t.rows == [] and t.line() == "player timings: no chunk was measured"


def test_the_json_record_is_written_whole(tmp_path):
    target = tmp_path / "timings.json"
    target.write_text("old")
    _played(3).write(target)
    data = json.loads(target.read_text())
    assert data["summary"]["chunks"] == 3 and [r["chunk"] for r in data["chunks"]] == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["timings.json"]


def test_previews_add_their_own_moments_and_a_run_without_them_reads_as_before():
    t = _played(4)
    without = t.line()
    assert "preview" not in without and t.summary()["key_to_preview_s"] is None
    for c in (1, 2):
        t.server(c, first_frame_s=0.5, total_s=0.6, preview_s=0.2)
        t.page({"chunk": c, "request_to_preview_s": 0.25, "key_to_preview_s": 0.3 * c})
    row = t.row(2)
    assert (row.server_preview_s, row.request_to_preview_s, row.key_to_preview_s) == (0.2, 0.25, 0.6)
    assert row.request_to_screen_s == pytest.approx(0.7)  # the real frames' moment is kept beside the preview's
    s = t.summary()
    assert s["key_to_preview_s"]["n"] == 2 and s["server_preview_s"]["median"] == pytest.approx(0.2)
    line = t.line()
    assert "key -> preview 0.45 s (p90 0.60), server preview 0.20 s (p90 0.20), page 16.0 fps" in line, line
    with pytest.raises(ValueError, match="key_to_preview_s"):
        t.page({"chunk": 1, "key_to_preview_s": -0.1})

"""bench/bench_play.py --tiny: the player's chunk loop on the CPU (random tiny Fast model), as CI runs it."""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_bench_play_tiny_writes_per_chunk_latency_fps_and_memory(tmp_path):
    from lingbot_world.bench.bench_play import main

    out = tmp_path / "play.json"
    env = dict(os.environ)
    assert main(["--tiny", "--chunks", "5", "--warmup", "1", "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    # its child processes ran with one thread, this process's environment is as it was: processes started later
    # inherit it (the player tests' server and batch run must compute with the same threads)
    assert dict(os.environ) == env
    res = json.loads(out.read_text())
    rows = res["per_chunk"]
    assert [r["chunk"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["frames"] for r in rows] == [9, 12, 12, 12, 12]
    assert rows[0]["keys"] == "w-8" and all(r["keys"] for r in rows)
    for r in rows:
        assert 0 < r["key_to_first_frame_s"] <= r["total_s"] and r["rss"] > 0
        assert {"session_dit_s", "session_decode_s", "session_total_s"} <= set(r)
    s = res["summary"]
    assert s["chunks"] == 5 and s["steady_chunks"] == 4 and s["sustained_fps"] > 0
    assert s["key_to_first_frame_median_s"] <= s["key_to_first_frame_p90_s"]
    assert isinstance(s["rss_flat"], bool) and "window" in res["args"] and res["args"]["window"] == 6
    assert res["plan"] and res["load_s"] >= 0

"""bench/bench_play.py --tiny: the player's chunk loop on the CPU (random tiny Fast model), as CI runs it."""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_bench_play_tiny_writes_per_chunk_latency_fps_and_memory(tmp_path, monkeypatch):
    from lingbot_world.bench.bench_play import main

    out = tmp_path / "play.json"
    # as a caller that chose no thread count (the suite's workers choose one, tests/conftest.py): --tiny sets one
    # for its children, and must take it away again
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
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


def test_bench_play_v2_tiny_plays_16_frame_chunks_through_the_models_window(tmp_path, monkeypatch):
    from lingbot_world.bench import bench_play as bp

    writes = []
    real_write = bp.write_json
    monkeypatch.setattr(bp, "SAVE_EVERY", 2)  # the results written every 2 chunks as well as at the end
    monkeypatch.setattr(bp, "write_json", lambda path, obj: (writes.append(len(obj["per_chunk"])),
                                                             real_write(path, obj)))
    out = tmp_path / "play_v2.json"
    assert bp.main(["--tiny", "--model", "v2-1.3b", "--chunks", "3", "--warmup", "1", "--workdir",
                    str(tmp_path / "w"), "--out", str(out)]) == 0
    assert writes == [2, 3]
    res = json.loads(out.read_text())
    assert res["model"] == "v2-1.3b" and res["recipe"]["chunk_frames"] == 4 and res["recipe"]["camera_form"] == "v2"
    assert res["played"] == {"window": 10, "sink": 2, "chunk_frames": 4}
    assert (tmp_path / "w" / "v2-1.3b_bnb_nf4" / "model.safetensors").is_file()
    rows = res["per_chunk"]
    # the session asks for 12 frames of keys first (its first latent frame is the image), then 16 a chunk
    assert [r["frames"] for r in rows] == [13, 16, 16]
    assert [len(r["keys"]) > 0 for r in rows] == [True] * 3 and rows[0]["keys"] == "w-12"
    assert rows[2]["keys"] == "w-6,wl-6,w-4"  # a pattern repeated to fill a chunk's 16 frames
    assert all(r["t_s"] > 0 and r["rss"] > 0 for r in rows) and rows[0]["t_s"] < rows[-1]["t_s"]
    assert res["summary"]["chunks"] == 3 and res["summary"]["sustained_fps"] > 0


def test_summary_says_whether_torch_nvidia_smi_and_rss_stay_flat():
    from lingbot_world.bench.bench_play import summarize

    mib = 2**20
    rows = [{"chunk": i + 1, "frames": 16, "key_to_first_frame_s": 0.1, "total_s": 0.5, "rss": 10_000 * mib,
             "peak_reserved": 20_000 * mib, "smi_used": (21_000 + (400 if i >= 6 else 0)) * mib} for i in range(9)]
    s = summarize(rows, warmup=1, slack_mib=256)
    assert s["steady_chunks"] == 8 and s["sustained_fps"] == 32.0
    assert s["rss_flat"] and s["peak_reserved_flat"] and not s["smi_used_flat"]
    assert "peak_allocated_flat" not in s  # not read (no CUDA)

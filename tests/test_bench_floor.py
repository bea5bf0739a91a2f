"""bench_floor's arithmetic on the CPU: which timed shape each call of a row's chunks reads, the sums over a chunk
and a video, the peak bound, the link and the verdict against the target; the v2 models' chunks of 4 through their
18-frame window; and its one-line refusals."""
from __future__ import annotations

import json

import pytest

from lingbot_world.bench import bench_floor as bf
from lingbot_world.bench import chunk_work as cw
from lingbot_world.wan.dit.model import DiTConfig

CFG = DiTConfig(causal=True)


def _all_keys() -> dict:
    keys = {}
    for row in bf.ROWS:
        for work in bf.row_video(row, CFG) + [bf.row_rolled(row, CFG)]:
            for key, w in bf.work_keys(work, row, CFG.text_len):
                keys[key] = w
    return keys


def test_shapes_a_row_reads():
    keys = _all_keys()
    # FP8 where _scaled_mm takes the shape; the one-row time embedding and the text's cross-attention stay bf16
    assert "gemm 4680x5120x5120 fp8" in keys and "gemm 4680x5120x5120 bf16" in keys
    assert "gemm 1x30720x5120 bf16" in keys and "gemm 1x30720x5120 fp8" not in keys
    assert "attention 4680x512 h40 bf16" in keys and not any(k.startswith("attention 4680x512 ") and "fp8" in k
                                                             for k in keys)
    # the played chunks: fast's 21-frame window, draft's 15; Ulysses: half the heads, half the rows
    assert "attention 4680x32760 h40 bf16" in keys and "attention 4680x23400 h40 bf16" in keys
    assert "attention 4680x32760 h20 bf16" in keys and "gemm 2340x13824x5120 bf16" in keys
    assert "attention 4680x32760 h40 fp8" in keys


def test_floor_sums_calls_times_milliseconds():
    ms = {key: 1.0 for key in _all_keys()}  # every call 1 ms: the floor counts calls
    exact = bf.ROWS[0]
    video = bf.row_video(exact, CFG)
    mid = bf.chunk_floor(video[3], exact, CFG.text_len, ms)
    gemm_calls = sum(w.calls for w in video[3] if isinstance(w, cw.Gemm))
    attention_calls = sum(w.calls for w in video[3] if isinstance(w, cw.Attention))
    assert attention_calls == 5 * 40 * 2  # 4 steps + the context pass, self and cross, 40 blocks
    assert mid.gemm_s == pytest.approx(gemm_calls / 1e3) and mid.attention_s == pytest.approx(attention_calls / 1e3)
    assert not mid.missing
    mean = bf.mean_floor(video, exact, CFG.text_len, ms)
    assert mean.gemm_flops == pytest.approx(sum(cw.flops(c, cw.Gemm) for c in video) / 7)
    missing = bf.chunk_floor(video[0], exact, CFG.text_len, {})
    assert missing.kernels_s == 0 and "attention 4680x4680 h40 bf16" in missing.missing


def test_summary_verdicts():
    keys = _all_keys()
    ms = {key: (0.5 if key.endswith("fp8") else 1.0) for key in keys}
    measured = {"auto": {"mean_dit_s": 1.96, "mean_chunk_s": 2.19, "mean_decode_s": 0.23,
                         "uploaded_gb_per_chunk": 57.5},
                "fast": {"mean_dit_s": 1.82, "mean_decode_s": 0.23, "uploaded_gb_per_chunk": 29.0}}
    rows = bf.summarize(CFG, ms, measured, h2d_gbps=50.0, peaks=bf.PEAKS["H100"])
    exact = rows["exact"]
    assert exact["link_s"] == pytest.approx(57.5 / 50.0, abs=1e-4)
    assert exact["floor_s"] == pytest.approx(max(exact["kernels_s"], exact["link_s"]) + 0.23, abs=1e-3)
    assert exact["reachable"] is (exact["floor_s"] <= 1.6)
    assert exact["measured_over_floor"] == round(1.96 / exact["kernels_s"], 2)
    assert 0 < exact["peak_s"] < exact["kernels_s"]
    assert rows["fast_fp8_attention"]["decode_s"] == 0.23 and "measured_dit_s" not in rows["fast_fp8_attention"]
    assert rows["exact_2gpu"]["decode_s"] == 0.23  # auto's decode stands in
    assert "floor_s" not in rows["draft"]  # nothing measured for it
    assert rows["fast"]["kernels_s"] < exact["kernels_s"]
    # the 2-GPU rank's share: about half the one-GPU kernels (at equal per-call times: the same call count)
    assert rows["exact_2gpu"]["kernels_s"] == pytest.approx(exact["kernels_s"], rel=0.01)


def test_refusals_name_the_problem(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    assert bf.main(["--measured", str(bad)]) == 2
    assert "--measured" in capsys.readouterr().err
    monkeypatch.setattr(bf.torch.cuda, "is_available", lambda: False)
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"summary": {}}))
    assert bf.main(["--measured", str(good)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _keys(cfg, geo) -> dict:
    return bf.needed_shapes(cfg, geo)


def test_v2_1_3b_rows_read_chunks_of_4_through_the_window():
    from lingbot_world.bench.bench_models import bench_model

    bm = bench_model("v2-1.3b")
    geo = bf.Geometry.of(bm)
    assert (geo.latent_frames, geo.window, geo.chunk_frames, geo.frame_tokens) == (20, 18, 4, 1560)
    keys = _keys(bm.cfg, geo)
    # 6,240 queries (4 frames of 1,560 tokens); the 5th chunk over the window's 18 frames, draft's over 15; 12 heads
    assert "gemm 6240x8960x1536 fp8" in keys and "gemm 6240x1536x8960 bf16" in keys
    assert "attention 6240x28080 h12 bf16" in keys and "attention 6240x23400 h12 bf16" in keys
    assert "attention 6240x28080 h6 bf16" in keys  # two GPUs: half the heads
    assert not any(" h40 " in k for k in keys)
    ms = {key: 1.0 for key in keys}
    rows = bf.summarize(bm.cfg, ms, {"auto": {"mean_dit_s": 0.5, "mean_chunk_s": 0.6, "mean_decode_s": 0.1}}, None,
                        bf.PEAKS["H200"], geo)
    exact = rows["exact"]
    assert exact["target_s"] == 0.60 and exact["window_frames"] == 18 and "missing" not in exact
    assert exact["floor_s"] == pytest.approx(exact["kernels_s"] + 0.1, abs=1e-3)
    assert rows["draft_steps2_tiny_vae"]["target_s"] == 0.30 and rows["draft"]["target_s"] is None
    assert rows["draft"]["window_frames"] == 15 and rows["exact_2gpu"]["target_s"] is None
    # a mid chunk: 4 steps + the context pass, self and cross, 30 blocks
    video = bf.row_video(bf.ROWS[0], bm.cfg, geo)
    assert len(video) == 5 and sum(w.calls for w in video[2] if isinstance(w, cw.Attention)) == 5 * 30 * 2


def test_v2_14b_and_v1_geometries_differ_only_where_the_recipe_does():
    from lingbot_world.bench.bench_models import bench_model

    v1, v2 = bench_model("fast"), bench_model("v2-14b")
    assert bf.Geometry.of(v1) == bf.V1 and v1.cfg == v2.cfg
    keys = _keys(v2.cfg, bf.Geometry.of(v2))
    assert "attention 6240x28080 h40 bf16" in keys and "gemm 6240x13824x5120 fp8" in keys
    assert bf.row_target(bf.ROWS[0], bf.Geometry.of(v2)) == 2.9


def test_list_runs_without_a_gpu_and_a_measured_file_of_another_model_is_refused(tmp_path, capsys, monkeypatch):
    assert bf.main(["--model", "v2-1.3b", "--list"]) == 0
    out = capsys.readouterr().out
    assert "draft_steps2_tiny_vae" in out and "attention 6240x28080 h12 bf16" in out
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({"summary": {}}))  # written before --model: v1 Fast's
    assert bf.main(["--model", "v2-1.3b", "--measured", str(v1)]) == 2
    assert "not v2-1.3b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bf.main(["--model", "v1-base-cam", "--list"])
    assert "base model" in capsys.readouterr().err

"""bench_fast_speed's parent side (issue 26): cases checked first, errors against the exact case from the saved
outputs, the per-chunk summary (an overlapped decode counted through the whole video), and the RTX projection over
the committed H100 results; the v2 models (--model): 16-frame chunks, their targets, one model per results file, a
tiny v2 1.3B run on the CPU, and the projection of a v2 model's results."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.bench import bench_fast_speed as bfs
from lingbot_world.bench import fast_projection


def test_an_unknown_case_is_refused_before_any_work(capsys, tmp_path):
    with pytest.raises(SystemExit):
        bfs.main(["--cases", "nope", "--out", str(tmp_path / "r.json"), "--workdir", str(tmp_path / "w")])
    assert "unknown case(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _outputs(path, latent, first):
    save_file({"latent": latent.contiguous(), "first_call": first.contiguous()}, str(path))


def test_errors_against_the_reference_per_forward_chunk_and_video(tmp_path):
    g = torch.Generator().manual_seed(0)
    ref, first = torch.randn(1, 16, 6, 4, 4, generator=g), torch.randn(1, 16, 3, 4, 4, generator=g)
    mine = ref.clone()
    mine[:, :, 3:] *= 1.5  # the second chunk off by half its norm
    _outputs(tmp_path / "outputs_exact.safetensors", ref, first)
    _outputs(tmp_path / "outputs_x.safetensors", mine, first * 1.01)
    e = bfs.errors_against_reference(tmp_path, "x")
    assert e["error_forward"] == pytest.approx(0.01, abs=1e-6)
    assert e["error_chunks"][0] == 0 and e["error_chunks"][1] == pytest.approx(0.5, abs=1e-6)
    expected = (0.5 * ref[:, :, 3:].norm() / ref.norm()).item()
    assert e["error_video"] == pytest.approx(expected, abs=1e-6)
    assert bfs.errors_against_reference(tmp_path, "exact") == {}  # the reference itself
    assert bfs.errors_against_reference(tmp_path, "missing") == {}


def _case(chunk_s, video_s, overlap=False):
    return {"speed": {"preset": "auto", "compile": "blocks", "compute": "bf16", "attention": "sdpa",
                      "levers": {"decode_overlap": overlap}},
            "chunk_s": chunk_s, "dit_s": [c - 0.1 for c in chunk_s], "decode_s": [0.1] * len(chunk_s),
            "video_s": video_s, "calls_per_chunk": 5.0, "plan": {"cache_layers_on_gpu": 4},
            "uploaded_bytes_timed": 3e9, "peak_reserved": 2e9}


def test_summary_takes_the_whole_video_over_its_chunks(tmp_path):
    res = {"cases": {"auto": _case([2.0, 3.0], 5.0), "auto_overlap": _case([1.5, 2.5], 4.6, overlap=True)}}
    s = bfs.summarize(res, tmp_path)
    assert s["auto"]["mean_chunk_s"] == 2.5 and s["auto"]["target_s"] == 1.6 and s["auto"]["met"] is False
    assert s["auto_overlap"]["mean_chunk_s"] == 2.3  # the last chunk's decode is in video_s
    assert s["auto"]["uploaded_gb_per_chunk"] == 1.5 and s["auto"]["full_window_chunk_s"] == 3.0
    assert s["auto"]["s_per_call"] == round(2.4 / 5, 4) and s["auto"]["fps"] == round(12 / 2.5, 2)


def test_rolling_cases_sum_the_chunks_after_the_capture_and_compare_with_their_named_reference(tmp_path):
    g = torch.Generator().manual_seed(1)
    latent, first = torch.randn(1, 16, 12, 4, 4, generator=g), torch.randn(1, 16, 3, 4, 4, generator=g)
    _outputs(tmp_path / "outputs_exact.safetensors", latent[:, :, :6], first)  # another length: not compared
    _outputs(tmp_path / "outputs_draft_rolling.safetensors", latent, first)
    _outputs(tmp_path / "outputs_draft_rolling_graphs.safetensors", latent.clone(), first.clone())
    case = {**_case([3.0, 1.0, 1.0, 2.5, 1.2, 1.4], 10.1), "rolled_from_chunk": 3,
            "graphs": {"captures": 40, "replays": 400, "graphed_forwards": 10, "disabled": None}}
    s = bfs.summarize({"cases": {"draft_rolling_graphs": case}}, tmp_path)["draft_rolling_graphs"]
    assert s["capture_chunk_s"] == 2.5 and s["rolling_chunks"] == 2 and s["rolling_chunk_s"] == 1.3
    assert s["graphs"]["captures"] == 40
    assert s["error_reference"] == "draft_rolling" and s["error_video"] == 0 and s["error_forward"] == 0
    assert bfs.errors_against_reference(tmp_path, "draft_rolling") == {}  # exact's video is shorter


def test_projection_of_the_committed_results_is_slower_on_the_rtx_cards():
    res = fast_projection.run()
    h100 = res["h100_measured"]
    for card, rows in res["rows"].items():
        auto = rows["auto (exact, compiled)"]
        assert auto["chunk_s"][0] > h100["auto"] and auto["chunk_s"][0] <= auto["chunk_s"][1]
        draft = next(v for k, v in rows.items() if k.startswith("draft"))
        assert draft["chunk_s"][0] < auto["chunk_s"][0]
        # the camera FiLM kept in RAM: fewer GEMM seconds, more bytes over the link, still compute-bound there
        film = rows["auto (exact, compiled), FiLM in RAM"]
        assert film["compute_s"] < auto["compute_s"] and film["copies_s"] > auto["copies_s"]
        expected = 1 - fast_projection.FILM_GEMM_SHARE * 4 / 5  # kept in 4 of the chunk's 5 calls
        gemm_card = res["h100_split_s"]["auto"]["gemm"] * res["cards"]["H100 SXM"]["bf16"] / res["cards"][card]["bf16"]
        assert auto["compute_s"] - film["compute_s"] == pytest.approx(gemm_card * (1 - expected), abs=0.02)
        assert film["dit_s"] == film["compute_s"]


def test_v2_summary_counts_16_frame_chunks_and_slices_errors_by_4(tmp_path):
    g = torch.Generator().manual_seed(2)
    ref, first = torch.randn(1, 16, 8, 4, 4, generator=g), torch.randn(1, 16, 4, 4, 4, generator=g)
    mine = ref.clone()
    mine[:, :, 4:] *= 1.5  # the second 4-frame chunk off by half its norm
    model = "v2-1.3b"
    _outputs(tmp_path / f"outputs_{model}_exact.safetensors", ref, first)
    _outputs(tmp_path / f"outputs_{model}_auto.safetensors", mine, first)
    _outputs(tmp_path / "outputs_auto.safetensors", ref, first)  # v1 Fast's, beside it in the same workdir
    res = {"model": model, "recipe": {"chunk_frames": 4}, "cases": {"auto": _case([0.5, 0.7], 1.4)}}
    s = bfs.summarize(res, tmp_path)["auto"]
    assert s["error_chunks"] == [0.0, pytest.approx(0.5, abs=1e-6)]
    assert s["fps"] == round(16 / 0.6, 2) and s["target_s"] == 0.60 and s["met"] is False
    assert bfs.errors_against_reference(tmp_path, "auto") == {}  # v1 Fast's auto has no exact of its own here


def test_results_of_another_model_are_not_mixed(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text('{"bench": "fast_speed", "cases": {"exact": {}}}')  # written before --model: v1 Fast's
    with pytest.raises(SystemExit):
        bfs.main(["--model", "v2-14b", "--out", str(out), "--workdir", str(tmp_path / "w")])
    assert "holds cases of v1-fast, not v2-14b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bfs.main(["--model", "nope", "--workdir", str(tmp_path / "w")])
    assert "no model called 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_v2_1_3b_tiny_cases_run_its_recipe_on_the_cpu(tmp_path):
    out, workdir = tmp_path / "v2.json", tmp_path / "w"
    assert bfs.main(["--tiny", "--model", "v2-1.3b", "--cases", "exact,draft_steps2_tiny_vae", "--workdir",
                     str(workdir), "--keep", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "v2-1.3b" and res["recipe"]["chunk_frames"] == 4 and res["recipe"]["camera_form"] == "v2"
    assert (res["window"], res["sink"], res["video"]["frames"]) == (10, 2, 45)
    assert (workdir / "v2-1.3b_bnb_nf4" / "model.safetensors").is_file()
    for name, calls in (("exact", 5.0), ("draft_steps2_tiny_vae", 2.0)):
        r = res["cases"][name]
        assert "error" not in r, r.get("error")
        assert (r["frames"], r["latent_frames"], r["chunks"], r["calls_per_chunk"]) == (45, 12, 3, calls)
        assert r["rolled_from_chunk"] == 2 and r["layout"]["evict"] and r["finite"]
        assert r["frames_out"] == 45  # the decoder (the VAE's, the tiny one) gave every frame of the 4-frame chunks
    assert res["cases"]["draft_steps2_tiny_vae"]["kv_fp8_ops"]  # the FP8 cache of draft, on chunks of 4
    s = res["summary"]["draft_steps2_tiny_vae"]
    assert len(s["error_chunks"]) == 3 and s["target_s"] == 0.30 and s["error_reference"] == "exact"


def _v2_results(tmp_path, model="v2-1.3b"):
    split = {"attention": 0.15, "gemm": 0.2, "dequant": 0.02, "elementwise": 0.05}
    row = {"mean_dit_s": 0.5, "mean_chunk_s": 0.6, "mean_decode_s": 0.1, "uploaded_gb_per_chunk": 0.0}
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"model": model, "machine": {"gpu": "NVIDIA H200"}, "summary": {
        "auto": {**row, "speed": {"compute": "bf16"}}, "fast": {**row, "speed": {"compute": "fp8"}},
        "draft_steps2_tiny_vae": {**row, "mean_dit_s": 0.3, "speed": {"compute": "fp8"}}}}))
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"model": model, "machine": {"gpu": "NVIDIA H200"}, "summary": {
        "auto_profile": {"device_split_s": split}, "draft_steps2_tiny_vae_profile": {"device_split_s": split}}}))
    return rows, profiles, split


def test_projection_of_a_v2_models_h200_results(tmp_path):
    rows, profiles, split = _v2_results(tmp_path)
    res = fast_projection.run_results("v2-1.3b", [rows, profiles])
    assert res["source"] == "H200 SXM" and set(res["measured"]) == {"auto", "draft_steps2_tiny_vae"}  # no fast profile
    assert res["host_s"]["auto"] == pytest.approx(0.5 - 0.42, abs=1e-3)
    cards, h200 = res["cards"], res["cards"]["H200 SXM"]
    auto_4090 = res["rows"]["RTX 4090"]["auto (bf16 GEMMs)"]
    tc, bw = h200["bf16"] / cards["RTX 4090"]["bf16"], h200["bandwidth"] / cards["RTX 4090"]["bandwidth"]
    expected = (split["gemm"] + split["attention"]) * tc + (split["dequant"] + split["elementwise"]) * bw + 0.08
    assert auto_4090["compute_s"] == pytest.approx(expected, abs=0.01) and auto_4090["copies_s"] == 0
    assert "draft_steps2_tiny_vae (int8 GEMMs)" in res["rows"]["RTX 3090"]  # no FP8 there
    chunk = {card: res["rows"][card]["auto (bf16 GEMMs)"]["chunk_s"][0] for card in ("RTX 5090", "RTX 4090",
                                                                                     "RTX 3090")}
    assert 0.6 < chunk["RTX 5090"] < chunk["RTX 4090"] < chunk["RTX 3090"]


def test_projection_refuses_another_models_results(tmp_path, capsys):
    rows, profiles, _ = _v2_results(tmp_path, model="v2-14b")
    with pytest.raises(SystemExit):
        fast_projection.main(["--model", "v2-1.3b", "--results", str(rows)])
    assert "holds v2-14b's cases, not v2-1.3b's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fast_projection.main(["--model", "v2-1.3b"])
    assert "give --results" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert fast_projection.main(["--model", "v2-14b", "--results", str(rows), "--results", str(profiles),
                                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["model"] == "v2-14b"


def test_projection_of_sage_attention_and_a_row_played_another_way(tmp_path):
    """SageAttention's seconds scale by the cards' INT8 rates (not bf16's), a profiled preset can take its host
    seconds from another case's row (--row), and an FP8-GEMM preset gets a bf16-GEMM variant."""
    split = {"attention": 0.1, "gemm": 0.03, "dequant": 0.0, "elementwise": 0.06}
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"model": "v2-1.3b", "machine": {"gpu": "NVIDIA H200"}, "summary": {
        "draft_sage": {"mean_dit_s": 0.5, "mean_chunk_s": 0.52, "mean_decode_s": 0.02,
                       "speed": {"compute": "fp8", "attention": "sage"}},
        "draft_sage_played": {"mean_dit_s": 0.3, "mean_chunk_s": 0.32, "mean_decode_s": 0.02},
        "draft_sage_profile": {"device_split_s": split}}}))
    res = fast_projection.run_results("v2-1.3b", [rows], {"draft_sage": "draft_sage_played"})
    assert res["host_s"]["draft_sage"] == pytest.approx(0.3 - 0.19, abs=1e-3)
    assert res["measured"]["draft_sage"] == 0.32
    cards, h200 = res["cards"], res["cards"]["H200 SXM"]
    c4090 = cards["RTX 4090"]
    row = res["rows"]["RTX 4090"]["draft_sage (fp8 GEMMs, SageAttention INT8)"]
    expected = (split["gemm"] * h200["fp8"] / c4090["fp8"] + split["attention"] * h200["int8"] / c4090["int8"]
                + split["elementwise"] * h200["bandwidth"] / c4090["bandwidth"] + 0.11)
    assert row["compute_s"] == pytest.approx(expected, abs=0.01)
    bf16 = res["rows"]["RTX 4090"]["draft_sage (bf16 GEMMs, SageAttention INT8)"]
    assert bf16["compute_s"] == pytest.approx(expected + split["gemm"] * (h200["fp8"] / c4090["bf16"]
                                                                        - h200["fp8"] / c4090["fp8"]), abs=0.01)
    with pytest.raises(SystemExit):
        fast_projection.main(["--model", "v2-1.3b", "--results", str(rows), "--row", "draft_sage"])
    with pytest.raises(ValueError, match="no row 'nothing'"):
        fast_projection.run_results("v2-1.3b", [rows], {"draft_sage": "nothing"})


def test_a_rolled_profile_is_paired_with_its_rows_rolled_chunks(tmp_path):
    """A profile of a chunk after the window rolled (the player's steady state) takes its host and decode seconds
    from the rolled chunks of its row, not from the whole video's mean (which holds the chunks before the roll,
    whose attention is shorter and which no graphs replay)."""
    split = {"attention": 0.1, "gemm": 0.03, "dequant": 0.0, "elementwise": 0.05}
    row = {"mean_dit_s": 0.4, "mean_chunk_s": 0.45, "mean_decode_s": 0.05, "rolling_dit_s": 0.2,
           "rolling_decode_s": 0.02, "rolling_chunk_s": 0.22, "speed": {"compute": "bf16"}}
    res_file = tmp_path / "rolled.json"
    res_file.write_text(json.dumps({
        "model": "v2-1.3b", "machine": {"gpu": "NVIDIA H200"},
        "cases": {"draft_profile": {"rolled_from_chunk": 4, "profile": {"chunk": 8}},
                  "auto_profile": {"rolled_from_chunk": 4, "profile": {"chunk": 2}}},
        "summary": {"draft": row, "draft_profile": {"device_split_s": split},
                    "auto": row, "auto_profile": {"device_split_s": split}}}))
    res = fast_projection.run_results("v2-1.3b", [res_file])
    assert res["host_s"]["draft"] == pytest.approx(0.2 - 0.18, abs=1e-3) and res["measured"]["draft"] == 0.22
    assert res["host_s"]["auto"] == pytest.approx(0.4 - 0.18, abs=1e-3) and res["measured"]["auto"] == 0.45
    bw = res["cards"]["H200 SXM"]["bandwidth"] / res["cards"]["RTX 4090"]["bandwidth"]
    assert res["rows"]["RTX 4090"]["draft (bf16 GEMMs)"]["decode_s"][0] == pytest.approx(0.02 * bw, abs=0.01)

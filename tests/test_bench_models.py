"""bench/bench_models.py: what a benchmark of each causal registry model runs (its DiT, recipe, window, sink, video,
expert folder), full size and tiny."""
from __future__ import annotations

import pytest

from lingbot_world.bench.bench_models import bench_model, model_names
from lingbot_world.wan.dit.kv_cache import cache_layout
from lingbot_world.wan.sampling.fast_sampler import fast_frames
from lingbot_world.world.models import model


def test_every_causal_model_has_a_benchmark_and_base_models_are_refused():
    assert model_names() == ["v1-fast", "v2-14b", "v2-1.3b"]
    with pytest.raises(ValueError, match="base model"):
        bench_model("v1-base-cam")
    with pytest.raises(KeyError):
        bench_model("v3")


def test_full_size_videos_windows_and_folders():
    v1, v14, v13 = bench_model("fast"), bench_model("v2-14b"), bench_model("v2-1b3")
    # v1 keeps issue 26's conditions and the folder earlier workdirs hold
    assert v1.name == "v1-fast" and v1.video() == (81, 480, 832) and (v1.window, v1.sink) == (21, 3)
    assert v1.folder() == "lingbot_world_fast_bnb_nf4" and v1.folder("fp8") == "lingbot_world_fast_fp8"
    assert v1.video(16) == (189, 480, 832) and v1.chunk_video_frames == 12
    assert v1.cfg == model("v1-fast").dit and v1.cfg.causal
    # v2: 77 frames = 5 chunks of 4, the play window 18 + sink 6; one folder per model
    for bm, dim in ((v14, 5120), (v13, 1536)):
        assert bm.video() == (77, 480, 832) and (bm.window, bm.sink) == (18, 6) and bm.cfg.dim == dim
        assert bm.cfg.causal and bm.chunk_video_frames == 16 and bm.recipe.camera_form == "v2"
        assert bm.video(16) == (4 * (4 * 16 - 1) + 1, 480, 832)
        fr = fast_frames(bm.video()[0], chunk=bm.chunk_frames)
        assert (fr.latent_frames, fr.chunks, fr.frames) == (20, 5, 77)
    assert v14.folder() == "v2-14b_bnb_nf4" and v13.folder("int8") == "v2-1.3b_int8"
    assert v13.fps(0.5) == 32.0 and v1.fps(0.5) == 24.0
    # v1's window covers its whole video; v2's 5th chunk is the first past its window
    assert not cache_layout(21, 1560, 3, window_frames=21, sink_frames=3).evict
    assert cache_layout(20, 1560, 4, window_frames=18, sink_frames=6, release=(18, 6)).evict


def test_tiny_setups_evict_and_are_valid_layouts():
    for name, frames, window, sink in (("fast", 33, 6, 1), ("v2-14b", 45, 10, 2), ("v2-1.3b", 45, 10, 2)):
        bm = bench_model(name, tiny=True)
        assert bm.tiny and bm.video() == (frames, 64, 112) and (bm.window, bm.sink) == (window, sink)
        fr = fast_frames(frames, chunk=bm.chunk_frames)
        layout = cache_layout(fr.latent_frames, 4 * 7, bm.chunk_frames, window_frames=window, sink_frames=sink)
        assert layout.evict and bm.chunk_frames * 3 > window >= bm.chunk_frames * 2  # the 3rd chunk rolls
    assert bench_model("v2-1.3b", tiny=True).describe()["recipe"]["chunk_frames"] == 4


def test_bench_size_takes_h_times_w_in_multiples_of_16():
    import argparse

    from lingbot_world.bench.bench_models import parse_bench_size

    p = argparse.ArgumentParser()
    assert parse_bench_size(p, "304*528") == (304, 528) and parse_bench_size(p, "480x832") == (480, 832)
    for bad in ("300*528", "304", "a*b", "0*16"):
        with pytest.raises(SystemExit):
            parse_bench_size(p, bad)

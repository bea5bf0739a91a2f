"""Parity with upstream LingBot-World v2 (robbyant/lingbot-world-v2 main 2648877), CPU, float32, tiny random weights.

The expected values were produced by upstream's own code (tests/fixtures/v2/make_fixtures.py, run by hand; its
docstring says how and what it patches); this file recomputes ours and compares. Weights and inputs are not stored:
tests/fixtures/v2/tiny_model.py makes them from seeds for both sides. Bitwise where the arithmetic is the same
(schedule, cache bookkeeping, poses, intrinsics, Plücker rays, RoPE angles), 1e-5 relative where it is not (the
DiT: upstream rotates q/k in float64, we in float32; its per-token time embedding runs one GEMM row per token).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from einops import rearrange
from safetensors.torch import load_file

from lingbot_world.loaders.camera_files import load_camera_folder
from lingbot_world.loaders.expert_format import infer_config
from lingbot_world.wan.control.camera import camera_condition, camera_geometry, packed_plucker
from lingbot_world.wan.dit import kv_cache as kv_module
from lingbot_world.wan.dit.kv_cache import KVCache, cache_layout
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.dit.rope import RopeCache, frame_angles, space_angles
from lingbot_world.wan.i2v import first_frame_mask
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, fast_frames, fast_schedule, make_generator
from lingbot_world.wan.sampling.unipc import flow_timesteps

from tests.conftest import load_sibling

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "v2"
V2_STEPS = (0, 250, 500, 750)


tiny = load_sibling("fixtures/v2/tiny_model")
CFG = DiTConfig(dim=tiny.DIM, ffn_dim=tiny.FFN, freq_dim=tiny.FREQ_DIM, num_heads=tiny.HEADS, num_layers=tiny.LAYERS,
                text_dim=tiny.TEXT_DIM, text_len=tiny.TEXT_LEN, causal=True)
FSL = tiny.FRAME_TOKENS


@pytest.fixture(scope="module")
def up():
    return load_file(str(FIXTURES / "upstream.safetensors")), json.loads((FIXTURES / "upstream.json").read_text())


@pytest.fixture(scope="module")
def model():
    m = WanDiT(CFG).eval()
    m.load_state_dict(tiny.weights({k: tuple(v.shape) for k, v in m.state_dict().items()}), strict=True)
    return m


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def unpack(plucker: torch.Tensor) -> torch.Tensor:
    """[1, 384, F, h/8, w/8] (channel c*64 + py*8 + px) -> upstream's per-pixel field [F, h, w, 6]."""
    return rearrange(plucker[0], "(c py px) f lh lw -> f (lh py) (lw px) c", py=8, px=8)


# ---- fixtures and weights -----------------------------------------------------------------------------------------
def test_fixtures_are_small_and_pickle_free():
    files = sorted(p for p in FIXTURES.iterdir() if p.is_file())
    assert {p.suffix for p in files} <= {".safetensors", ".json", ".py"}
    assert sum(p.stat().st_size for p in files) < 1_000_000


def test_state_dicts_are_upstreams_names_and_shapes(up):
    _, info = up
    assert {k: list(v.shape) for k, v in WanDiT(CFG).state_dict().items()} == info["shapes"]["tiny"]
    big = DiTConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30, causal=True)
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in WanDiT(big).state_dict().items()}
    assert ours == info["shapes"]["1.3B"] and len(ours) == 1071
    assert sum(math.prod(s) for s in ours.values()) == 1_709_502_016  # the count of the released weights


def test_1_3b_config_from_shapes_alone(up):
    """No config.json beside the 1.3B: everything from the shapes, heads = dim / 128."""
    _, info = up
    cfg = infer_config(info["shapes"]["1.3B"], "1.3B shapes")
    assert (cfg.dim, cfg.num_heads, cfg.num_layers, cfg.ffn_dim, cfg.head_dim) == (1536, 12, 30, 8960, 128)
    assert (cfg.freq_dim, cfg.text_dim, cfg.in_dim, cfg.out_dim, cfg.control_in) == (256, 4096, 36, 16, 1536)
    small = infer_config(info["shapes"]["tiny"], "tiny shapes")
    assert (small.dim, small.num_heads, small.ffn_dim, small.num_layers) == (tiny.DIM, tiny.HEADS, tiny.FFN, tiny.LAYERS)


# ---- schedule ---------------------------------------------------------------------------------------------------
# lingbot-world-v2.md §4.5, printed to 7 digits: t, sigma for x0, sigma for re-noising (steps 1..3)
SPEC = {10.0: ((999, 967, 908, 768), (0.9998999, 0.9679494, 0.9089255, 0.7689939), (0.9677834, 0.9085941, 0.7680442)),
        5.0: ((999, 937, 833, 624), (0.9997998, 0.9378895, 0.8336104, 0.6246874), (0.9375778, 0.8330554, 0.6246874))}


@pytest.mark.parametrize("shift", [10.0, 5.0])
def test_schedule_equals_upstreams_scheduler(up, shift):
    tensors, info = up
    want = info["schedule"][f"{shift:g}"]
    timesteps, sigmas = flow_timesteps(1000, shift, 1000)
    assert torch.equal(timesteps, tensors[f"schedule{shift:g}.timesteps"])
    assert torch.equal(sigmas, tensors[f"schedule{shift:g}.sigmas"])
    s = fast_schedule(V2_STEPS, shift)
    assert list(s.timesteps) == want["timesteps"]
    assert list(s.sigma_x0) == want["sigma_x0"]  # the same float32 values, exactly
    assert list(s.renoise_indices) == want["renoise_index"][1:]
    assert list(s.sigma_renoise) == want["sigma_renoise"][1:]
    t, a, b = SPEC[shift]
    assert s.timesteps == t
    np.testing.assert_allclose(s.sigma_x0, a, rtol=0, atol=6e-8)
    np.testing.assert_allclose(s.sigma_renoise, b, rtol=0, atol=6e-8)


# ---- cache bookkeeping: chunk 4, window 18, sink 6 ---------------------------------------------------------------
@pytest.mark.parametrize("max_attention", [None, "capacity"])
def test_cache_bookkeeping_equals_upstreams(up, monkeypatch, max_attention):
    _, info = up
    bk = info["bookkeeping"]
    fsl, chunk = bk["frame_tokens"], bk["chunk"]
    layout = cache_layout(8 * chunk, fsl, chunk_frames=chunk, window_frames=bk["window"], sink_frames=bk["sink"])
    assert (layout.capacity, layout.sink_tokens, layout.evict) == (36, 12, True)
    cache = KVCache([torch.zeros(1, layout.capacity, 1, 1)], [torch.zeros(1, layout.capacity, 1, 1)],
                    sink_tokens=layout.sink_tokens, evict=True,
                    max_attention=None if max_attention is None else layout.capacity)
    seen = []
    monkeypatch.setattr(kv_module, "self_attention", lambda q, k, v: seen.append(k[0, :, 0, 0].tolist()) or q)
    length = chunk * fsl
    for call in bk["calls"]:  # per chunk: 4 denoising calls and the context pass, all at the chunk's start
        start = call["start"]
        ids = (torch.arange(start, start + length) + 1 + 1000 * call["call"]).float().view(1, length, 1, 1)
        cache.begin(start, length, final=call["call"] == len(V2_STEPS))
        cache.attend(0, ids, ids, ids)
        cache.end()
        where = (call["chunk"], call["call"])
        assert [int(i) for i in seen[-1]] == call["attended"], where
        assert [int(i) for i in cache.k[0][0, :, 0, 0].tolist()] == call["slots"], where
        assert (cache.local_end, cache.global_end) == (call["local_end"], call["global_end"]), where


# ---- the DiT ---------------------------------------------------------------------------------------------------
def test_forward_on_an_empty_and_a_filled_cache(up, model):
    tensors, _ = up
    cache = cache_layout(8, FSL, chunk_frames=4, window_frames=18, sink_frames=6).make(
        CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    ctx = pad_context(tiny.text(), CFG.text_len)
    calls = [("chunk0_t999", 0, 999, 1, False), ("chunk0_context", 0, 0, 2, True),
             ("chunk1_t967", 1, 967, 3, False), ("chunk1_t908", 1, 908, 4, False)]
    for name, chunk, t, seed, final in calls:
        inp = tiny.chunk_inputs(seed)
        with torch.no_grad():
            v = model(inp["x"][None], torch.tensor([t]), ctx, inp["y"][None], camera=inp["camera"][None],
                      kv_cache=cache, start_frame=4 * chunk, cache_final=final)
        want = tensors[f"forward.{name}"]
        err = rel_err(v[0], want)
        print(f"{name}: relative error {err:.2e}")
        assert v.shape[1:] == want.shape and err < 1e-5, name


def _y(latent_frames: int) -> torch.Tensor:
    mask = first_frame_mask(latent_frames, tiny.LAT_H, tiny.LAT_W)
    return torch.cat([mask, tiny.image_latent(latent_frames)])[None]


def test_three_chunk_loop_with_eviction_equals_upstreams(up, model, examples_dir):
    """Upstream's _generate_causal_fast (window 7 / sink 2: the cache rolls from chunk 1 on) vs our FastRun."""
    tensors, info = up
    loop = info["loop"]
    cam_in = load_camera_folder(examples_dir / loop["example"])
    frames = fast_frames(loop["frame_num"], cam_in.poses.shape[0], chunk=4)
    assert (frames.frames, frames.latent_frames, frames.chunks) == (45, 12, 3)
    cam = camera_condition(cam_in.poses, cam_in.intrinsics, tiny.IMAGE_H, tiny.IMAGE_W, frames.pose_frames,
                           latent_frames=frames.latent_frames, form="v2").plucker
    assert list(cam.shape) == loop["camera_shape"] and sha(cam) == loop["camera_sha256"]

    gen = make_generator(loop["seed"], "cpu")
    noise = draw(gen, (1, CFG.out_dim, frames.latent_frames, tiny.LAT_H, tiny.LAT_W))
    layout = cache_layout(frames.latent_frames, FSL, chunk_frames=4, window_frames=loop["window"],
                          sink_frames=loop["sink"])
    cache = layout.make(CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    calls = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: calls.append([int(a[1].reshape(-1)[0]), kw["start_frame"] * FSL]), with_kwargs=True)
    try:
        run = FastRun(model, noise, pad_context(tiny.text(), CFG.text_len), _y(frames.latent_frames), cam, cache,
                      gen, schedule=fast_schedule(V2_STEPS, loop["shift"]), chunk_frames=4)
        latent = run.run()
    finally:
        hook.remove()
    assert calls == loop["calls"]  # 4 steps + the context pass per chunk, at the chunk's token offset
    want = tensors["loop.latent"]
    for c in range(frames.chunks):
        err = rel_err(latent[0, :, 4 * c:4 * c + 4], want[:, 4 * c:4 * c + 4])
        print(f"chunk {c}: x0 relative error {err:.2e}")
        assert err < 1e-5, c


# ---- camera ------------------------------------------------------------------------------------------------------
def test_v2_plucker_of_example_03_is_bit_identical(up, examples_dir):
    """All 269 frames of example 03 at the release's 464 x 832: poses, intrinsics and every frame's rays."""
    tensors, info = up
    want = info["plucker03"]
    cam_in = load_camera_folder(examples_dir / "03")
    frames = fast_frames(want["frame_num"], cam_in.poses.shape[0], chunk=4)
    assert frames.frames == want["frames"] == 269 and frames.latent_frames == want["shape"][0] == 68
    h, w = want["height"], want["width"]
    geo = camera_geometry(cam_in.poses, cam_in.intrinsics, h, w, frames.pose_frames,
                          latent_frames=frames.latent_frames, form="v2")
    assert torch.equal(geo.relative_poses, tensors["plucker03.relative_poses"])
    assert torch.equal(geo.scaled_intrinsics[0], tensors["plucker03.intrinsics"])
    got = []
    for i in range(0, frames.latent_frames, 17):  # camera_condition's packing, a quarter of the frames at a time
        part = packed_plucker(geo.relative_poses[i:i + 17], geo.scaled_intrinsics[i:i + 17], h, w, form="v2")
        got += [sha(f) for f in unpack(part)]
        del part
    assert [frames.latent_frames, h, w, 6] == want["shape"] and got == want["frame_sha256"]
    # this project's v1 rounding (float64 directions and intrinsics, rounded) is not v2's to the bit
    geo = camera_geometry(cam_in.poses, cam_in.intrinsics, h, w, frames.pose_frames,
                          latent_frames=frames.latent_frames)
    v1 = unpack(packed_plucker(geo.relative_poses[:2], geo.scaled_intrinsics[:2], h, w))
    assert [sha(f) for f in v1] != want["frame_sha256"][:2]


@pytest.mark.parametrize("case", range(5))
def test_frame_rounding_and_poses_equal_upstreams(up, examples_dir, case):
    """361 -> 349, 81 -> 77, 269 -> 269 with chunk 4; and poses shorter than the frames asked for."""
    tensors, info = up
    c = info["frames"][case]
    name = c["example"]
    cam_in = load_camera_folder(examples_dir / name[:2])
    poses, k = (cam_in.poses[:100], cam_in.intrinsics[:100]) if name.endswith("[:100]") else (cam_in.poses,
                                                                                                cam_in.intrinsics)
    frames = fast_frames(c["frame_num"], poses.shape[0], chunk=4)
    assert (frames.frames, frames.latent_frames) == (c["frames"], c["latent_frames"])
    geo = camera_geometry(poses, k, c["height"], c["width"], frames.pose_frames, latent_frames=frames.latent_frames,
                          form="v2")
    assert torch.equal(geo.relative_poses, tensors[c["key"] + ".relative_poses"])
    assert torch.equal(geo.scaled_intrinsics[0], tensors[c["key"] + ".intrinsics"])


def test_release_frame_counts():
    assert [fast_frames(n, chunk=4).frames for n in (361, 81, 269)] == [349, 77, 269]
    assert fast_frames(361, 269, chunk=4).frames == 269 and fast_frames(361, 100, chunk=4).frames == 93
    assert fast_frames(361, chunk=4).chunks == 22


# ---- RoPE -------------------------------------------------------------------------------------------------------
def test_rope_angles_are_upstreams_table_and_go_on_past_it(up):
    tensors, info = up
    rope = info["rope"]
    d = CFG.head_dim
    # upstream's table: polar(1, positions x freqs) per axis, rows 0..1023, frame | height | width columns
    angles = torch.cat([frame_angles(1024, d), space_angles(1024, 1, d)[:, :21], space_angles(1, 1024, d)[:, 21:]],
                       dim=1)
    table = torch.view_as_real(torch.polar(torch.ones_like(angles), angles))
    assert list(table.shape) == rope["table_shape"] and sha(table) == rope["table_sha256"]
    assert torch.equal(table[[0, 1, 2, 1019, 1023]], tensors["rope.rows"])
    # upstream cannot place a 4-frame chunk past its 1024 rows; ours has no table to run out of
    assert rope["chunk_of_4_at_frame"]["1020"] is None and "invalid" in rope["chunk_of_4_at_frame"]["1021"]
    freqs = 1.0 / torch.pow(10000.0, torch.arange(0, 44, 2, dtype=torch.float64) / 44)
    far = frame_angles(4, d, frame_offset=4000)
    assert torch.equal(far, torch.outer(torch.arange(4000, 4004, dtype=torch.float64), freqs))
    assert torch.equal(frame_angles(4, d, frame_offset=1016), angles[1016:1020, :22])
    cos, sin = RopeCache(d).get((4, 2, 3), "cpu", frame_offset=4000)
    assert torch.equal(cos[::6, :22], far.cos().float()) and torch.equal(sin[::6, :22], far.sin().float())


def test_a_chunk_at_latent_frame_4000_runs_in_a_window(model):
    """Where upstream's 1024-row table stops (fixture: a 4-frame chunk at frame 1021 raises), ours goes on: a window
    cache in its steady state (the sink, then the latest frames) takes a chunk at latent frame 4000."""
    layout = cache_layout(4004, FSL, chunk_frames=4, window_frames=7, sink_frames=2)
    cache = layout.make(CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    ctx = pad_context(tiny.text(), CFG.text_len)
    inp = tiny.chunk_inputs(5)
    with torch.no_grad():
        model(inp["x"][None], torch.tensor([0]), ctx, inp["y"][None], camera=inp["camera"][None], kv_cache=cache)
        cache.global_end = 4000 * FSL  # as if chunks 1..999 had run: same slots, later positions
        v = model(inp["x"][None], torch.tensor([999]), ctx, inp["y"][None], camera=inp["camera"][None],
                  kv_cache=cache, start_frame=4000)
    assert torch.isfinite(v).all() and (cache.global_end, cache.local_end) == (4004 * FSL, 7 * FSL)
    assert ((4, tiny.LAT_H // 2, tiny.LAT_W // 2), "cpu", 4000) in model.rope._tables  # rows 4000..4003

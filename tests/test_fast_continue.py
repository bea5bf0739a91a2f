"""Continuing a Fast video (issue #17 part 2): a chain of parts equals one run of the concatenated keys, bit for bit.

Tiny random model on the CPU. Each part restores the cache of the one before from host memory (memory/kv_park.py)
into a bigger cache, the generator from its saved state, the camera from the track; the whole-video run gets the
concatenated keys at once. Also: the camera track's rule, the conditioning track and the exact decode of a part
against whole-video encodes/decodes of the tiny VAE, and the reference-rule first part against the release's run.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_world.memory.kv_park import ParkedKVError, copy_out, filled_bytes, park, placement_layers
from lingbot_world.memory.fast_plan import FastMemoryPlan
from lingbot_world.memory.kv_placement import CachePlacement
from lingbot_world.memory.kv_stream import KVStreamer
from lingbot_world.wan.control.act_to_camera import keys_to_camera
from lingbot_world.wan.control.actions import KeyTimeline
from lingbot_world.wan.control.camera import camera_condition
from lingbot_world.wan.control.camera_presets import preset_camera
from lingbot_world.wan.control.camera_track import KEY_STEP, CameraTrack
from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context
from lingbot_world.wan.sampling.fast_sampler import FastRun, draw, make_generator
from lingbot_world.wan.sampling.fast_parts import CameraSource, finish_part, plan_first_part, plan_next_part, start_part
from lingbot_world.wan.sampling.fast_state import FastSettings
from lingbot_world.world.models import V1_FAST

CFG = DiTConfig.tiny(num_layers=2, text_dim=16, text_len=8, causal=True)
H, W = 64, 96  # latent 8 x 12 -> 24 tokens per latent frame
LAT_H, LAT_W = H // 8, W // 8
KEYS = "w-7,wl-6,iw-9,none-3,a-8,j-4,sd-5"  # 42 frames: 8 + 12 + 12 + 10 -> parts of 1, 1, 1 chunks (+ padding)


@pytest.fixture(scope="module")
def model():
    m = WanDiT(CFG).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 1 / p[0].numel() ** 0.5))
    return m


def settings(mode="continuable", **kw):
    return FastSettings(H, W, seed=kw.pop("seed", 11), noise_source="cpu", mode=mode, cache_dtype="float32",
                        recipe=kw.pop("recipe", V1_FAST.recipe), **kw)


def conditioning(latent_frames):
    g = torch.Generator().manual_seed(5)
    return torch.randn(1, 20, latent_frames, LAT_H, LAT_W, generator=g)


CTX = torch.randn(5, CFG.text_dim, generator=torch.Generator().manual_seed(9))


def plan_for(layout):
    return FastMemoryPlan("gpu", CFG.num_layers, True, None, layout, "test")


def new_cache(layout, fill=None, host_layers=None):
    """A cache of `layout`, all layers on the CPU "device", or the last ones in host buffers behind a streamer."""
    if host_layers is None:
        return CachePlacement(layout.make(CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32,
                                          fill=fill))
    s = KVStreamer.build(layout, CFG.num_layers, CFG.num_heads, CFG.head_dim, device="cpu",
                         layers_on_device=CFG.num_layers - host_layers, dtype=torch.float32, pin=False, fill=fill)
    return CachePlacement(s.cache, s)


def run_part(model, st, plan, state, y_all, host_layers=None, parked=None, move=True):
    """One part: restore `parked` into a cache for the video so far + the part, run it, park it again."""
    start = 0 if state is None else state.latent_frames
    layout = st.layout(start + plan.latent_frames)
    fill = None if parked is None else (lambda i, k, v: parked.fill(i, k, v, move=move))
    placement = new_cache(layout, fill, host_layers)
    if placement.streamer is not None:
        placement.streamer.install(model)
    try:
        if parked is not None:
            parked.restore_counters(placement.cache)
        ctx = pad_context([CTX], CFG.text_len)
        run = start_part(model, plan, st, y_all[:, :, start:start + plan.latent_frames], ctx, placement.cache, state)
        with torch.no_grad():
            run.run()
        new = finish_part(run, plan, st, state, context=CTX, prompt="p")
        return new, park(placement)
    finally:
        placement.close()


def chain(model, st, parts, y_all, host_layers=None, move=True):
    """Parts given as (keys, frames) one after another; returns the states."""
    states, state, parked = [], None, None
    for keys, frames in parts:
        src = CameraSource(keys=keys) if keys is not None else CameraSource()
        plan = plan_first_part(src, frames, st) if state is None else plan_next_part(state, src, frames)
        state, parked = run_part(model, st, plan, state, y_all, host_layers, parked, move)
        states.append(state)
    return states


def test_a_chain_of_parts_is_one_run_of_the_concatenated_keys(model):
    keys = KeyTimeline.from_string(KEYS)
    st = settings()
    # one run: 42 frames of keys -> 4 chunks (45 frames, keys for frames 1..44)
    whole_plan = plan_first_part(CameraSource(keys=keys), None, st)
    assert (whole_plan.chunks, whole_plan.frames) == (4, 45)
    y = conditioning(12)
    whole, _ = run_part(model, st, whole_plan, None, y)
    # the same keys as 8 + 12 + 12 + 10 (padded) frames, parked between the parts; streamed host layers too
    parts = [(keys[0:8], None), (keys[8:20], None), (keys[20:32], None), (keys[32:], None)]
    for host_layers in (None, 1):
        states = chain(model, st, parts, y, host_layers)
        assert [s.chunks for s in states] == [1, 2, 3, 4]
        assert torch.equal(states[-1].latent(), whole.latent())
        assert torch.equal(states[-1].generator, whole.generator)
        np.testing.assert_array_equal(states[-1].camera.anchor, whole.camera.anchor)
        assert states[-1].frames == 45
    # any other cut gives the same video: 20 + 22 (two chunks, then two)
    states = chain(model, st, [(keys[0:20], None), (keys[20:], None)], y)
    assert torch.equal(states[-1].latent(), whole.latent())


def test_parts_without_keys_and_with_a_camera_continue_the_video(model):
    st = settings(seed=3)
    y = conditioning(9)
    cam = preset_camera("dolly_in+pan_right", frames=25)
    # no camera for the first part, a camera file for the second, nothing for the third (stands still)
    states = chain(model, st, [(None, 9), (None, None)], y)
    assert not states[-1].has_camera and states[-1].chunks == 2
    src = CameraSource(poses=cam.poses, intrinsics=cam.intrinsics, label="preset")
    plan = plan_next_part(states[0], src)
    assert plan.chunks == 2 and plan.frames == 24  # 25 poses: the first is where the video is
    plan = plan_next_part(states[0], src, frames=12)
    assert plan.chunks == 1 and plan.camera.shape == (1, 384, 3, LAT_H, LAT_W)
    with pytest.raises(ValueError, match="less than one chunk"):
        plan_next_part(states[0], src, frames=5)


def test_the_track_continues_a_walk_exactly_and_normalises_by_the_key_step():
    keys = KeyTimeline.from_string("w-4,dw-8,ik-4,i-48,l-8")
    whole = CameraTrack(H, W)
    a = whole.keys(keys[:keys.frames], 19)  # 72 frames of keys = 18 steps after latent frame 0
    parts = CameraTrack(H, W)
    b1 = parts.keys(keys[:8], 3)
    b2 = parts.keys(keys[8:56], 12)
    b3 = parts.keys(keys[56:], 4)
    torch.testing.assert_close(torch.cat([b1.plucker, b2.plucker, b3.plucker], dim=2), a.plucker, rtol=0, atol=0)
    # the walk, written out: pose 4l of the release's walk; steps framewise in float32 divided by 4 x 0.05
    poses = keys_to_camera(keys)[0].poses[::4].astype(np.float32)
    rel = np.linalg.inv(poses[0]) @ poses
    step = np.concatenate([np.eye(4, dtype=np.float32)[None], np.linalg.inv(rel[:-1]) @ rel[1:]])
    step[:, :3, 3] /= np.float32(KEY_STEP)
    np.testing.assert_allclose(a.steps.numpy(), step, atol=2e-6)
    norms = np.linalg.norm(step[:, :3, 3], axis=1)
    assert abs(norms[1] - 1) < 1e-5 and abs(norms[2] - np.sqrt(2)) < 1e-4  # w: 1, w+d: sqrt(2)
    # the +-85 degree pitch rule holds across parts: 48 frames of looking up (96 degrees) stop at 84
    assert np.rad2deg(parts.walker.pitch) == pytest.approx(84.0, abs=1e-9)


def test_a_camera_part_starts_where_the_video_is():
    cam = preset_camera("dolly_in+pan_right", frames=25)
    t = CameraTrack(H, W)
    t.keys(KeyTimeline.from_string("l-8"), 3)  # turned right by 16 degrees
    part = t.poses(cam.poses, cam.intrinsics, 3)
    before = keys_to_camera(KeyTimeline.from_string("l-8"))[0].poses[-1]
    np.testing.assert_allclose(part.path[0], before, atol=1e-12)
    # the part's own steps, normalised by its largest: the same as the preset alone from the identity
    alone = CameraTrack(H, W)
    alone.skip(1)
    ref = alone.poses(cam.poses, cam.intrinsics, 3)
    torch.testing.assert_close(part.steps, ref.steps, atol=1e-5, rtol=0)


def test_reference_first_part_is_the_released_run(model):
    """mode 'reference': the first part's camera is camera_condition's and its noise is drawn for the whole part."""
    keys = KeyTimeline.from_string("w-10,j-10,w-5")  # 25 -> 25 frames -> 7 latent -> 6: compressed as the release
    st = settings("reference")
    plan = plan_first_part(CameraSource(keys=keys), None, st)
    path, _ = keys_to_camera(keys)
    ref = camera_condition(path.poses, path.intrinsics, H, W, 25, includes_end_pose=True, latent_frames=6)
    torch.testing.assert_close(plan.camera, ref.plucker, rtol=0, atol=0)
    assert (plan.chunks, plan.frames) == (2, 21)
    y = conditioning(6)
    state, parked = run_part(model, st, plan, None, y)
    g = make_generator(11, "cpu")
    noise = draw(g, (1, 16, 6, LAT_H, LAT_W))
    cache = st.layout(6).make(CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    with torch.no_grad():
        z = FastRun(model, noise, pad_context([CTX], CFG.text_len), y, ref.plucker, cache, g,
                    schedule=V1_FAST.recipe.schedule(), chunk_frames=V1_FAST.recipe.chunk_frames).run()
    assert torch.equal(state.latent(), z)
    # and it can be continued (the continuable rule from its last latent frame)
    nxt = plan_next_part(state, CameraSource(keys=KeyTimeline.from_string("w-12")))
    assert nxt.chunks == 1 and nxt.track.latent_frames == 9


def chain_state():
    """A state after one chunk (no model run: the planning needs only the track)."""
    from lingbot_world.wan.sampling.fast_state import FastState

    st = settings()
    plan = plan_first_part(CameraSource(keys=KeyTimeline.from_string("w-8")), None, st)
    return FastState(st, 1, torch.zeros(1, dtype=torch.uint8), CTX, "p", plan.track, True)


def test_first_part_frame_rules():
    st = settings()
    k = KeyTimeline.from_string("w-10")
    p = plan_first_part(CameraSource(keys=k), None, st)
    assert (p.chunks, p.frames, p.keys.frames) == (2, 21, 20) and "padded" in p.note
    assert plan_first_part(CameraSource(keys=k), 33, st).chunks == 3
    cut = plan_first_part(CameraSource(keys=KeyTimeline.from_string("w-30")), 9, st)  # the video decides
    assert cut.chunks == 1 and cut.keys.frames == 8 and "the last 22 frame(s) of keys are not used" in cut.note
    trailing = plan_first_part(CameraSource(keys=KeyTimeline.from_string("w-8,none-3")), 9, st)
    assert trailing.chunks == 1 and trailing.note is None  # cutting frames without keys needs no word
    nxt = plan_next_part(chain_state(), CameraSource(keys=KeyTimeline.from_string("w-13")))
    assert nxt.chunks == 2 and "padded with 11" in nxt.note
    assert plan_first_part(CameraSource(), 25, st).chunks == 2


def test_parked_cache_moves_layer_by_layer_and_refuses_misuse(model):
    st = settings()
    y = conditioning(6)
    plan = plan_first_part(CameraSource(keys=KeyTimeline.from_string("w-8")), None, st)
    state, parked = run_part(model, st, plan, None, y)
    assert parked.tokens == 3 * 24 and parked.complete and parked.global_end == 72
    copy = parked.copy()
    seen = []

    def fill(i, k, v):
        copy.fill(i, k, v, move=True)
        seen.append(sum(t is not None for t in copy.k))  # the saved layer is gone as soon as it is restored

    layout = st.layout(6)
    placement = new_cache(layout, fill)
    assert seen == [1, 0]
    with pytest.raises(ParkedKVError, match="moved out already"):
        copy.fill(0, placement.cache.k[0], placement.cache.v[0])
    small = st.layout(3).make(CFG.num_layers, CFG.num_heads, CFG.head_dim, dtype=torch.float32)
    with pytest.raises(ParkedKVError, match="cannot take"):
        parked.fill(0, small.k[0][:, :10], small.v[0][:, :10])
    back = parked.truncated(24, 24)
    assert back.tokens == 24 and back.k[0].shape[1] == 24


@pytest.mark.parametrize("host_layers", [None, 1])
def test_a_copied_out_cache_stays_as_it_was_while_the_video_goes_on(model, host_layers):
    """copy_out (LingBot Play's state): the cache's filled slots as park gives them, in tensors of their own, the
    placement untouched; the third chunk evicts (the device layer shifts, the host ring turns) without changing
    the earlier copy."""
    st = settings(window=6, sink=3)
    y = conditioning(9)
    keys = KeyTimeline.from_string("w-8,a-12,d-12")
    placement = new_cache(st.layout(9), host_layers=host_layers)
    if placement.streamer is not None:
        placement.streamer.install(model)
    ctx = pad_context([CTX], CFG.text_len)
    try:
        state, copies = None, []
        for part_keys, start in ((keys[:20], 0), (keys[20:], 6)):
            src = CameraSource(keys=part_keys)
            plan = plan_first_part(src, None, st) if state is None else plan_next_part(state, src)
            run = start_part(model, plan, st, y[:, :, start:start + plan.latent_frames], ctx, placement.cache, state)
            with torch.no_grad():
                run.run()
            state = finish_part(run, plan, st, state, context=CTX, prompt="p")
            copy = copy_out(placement)
            assert (copy.global_end, copy.local_end) == (state.kv_global_end, state.kv_local_end)
            assert copy.nbytes == filled_bytes(placement.cache) == 2 * CFG.num_layers * copy.tokens * CFG.dim * 4
            copies.append((copy, [t.clone() for layer in placement_layers(placement) for t in layer]))
        assert placement.cache.global_end > placement.cache.local_end  # the window evicted
        for copy, then in copies:
            assert all(torch.equal(a, b) for a, b in zip([t for kv in zip(copy.k, copy.v) for t in kv], then))
        parked = park(placement)
        last = copies[-1][0]
        assert all(torch.equal(a, b) for a, b in zip((*last.k, *last.v), (*parked.k, *parked.v)))
    finally:
        placement.close()


# ---- the VAE side: conditioning of later frames, decoding a part alone --------------------------------------------
@pytest.fixture(scope="module")
def vae():
    from lingbot_world.wan.vae.model import VAEConfig, WanVAE

    v = WanVAE(VAEConfig.tiny()).eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in v.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return v


def test_vae_reach_is_traced_from_the_architecture(vae):
    from lingbot_world.wan.vae.reach import decoder_reach, encoder_reach

    assert (encoder_reach(vae.cfg), decoder_reach(vae.cfg)) == (20, 30)  # the tiny config's temporal structure


def test_conditioning_track_gives_every_frame_of_a_longer_video(vae):
    from lingbot_world.wan.i2v import ConditionTrack, build_i2v_condition

    image = torch.rand(3, 20, 28, generator=torch.Generator().manual_seed(1)) * 2 - 1
    track = ConditionTrack.build(vae, image, 16, 16)
    assert track.stationary_from == 21
    longer = build_i2v_condition(vae, image, 16, 16, 4 * 26 + 1)  # 27 latent frames
    for start, count in ((0, 6), (3, 12), (18, 9), (21, 6), (24, 3)):
        torch.testing.assert_close(track.frames(start, count), longer[:, :, start:start + count], rtol=0, atol=0)
    assert track.frames(100, 3).shape[2] == 3


def test_a_part_decodes_alone_to_its_frames_of_the_whole_video(vae):
    from lingbot_world.wan.vae.streaming import context_latents, decode_part

    z = torch.randn(1, 16, 35, 1, 1, generator=torch.Generator().manual_seed(4))
    whole = vae.decode(z)
    # the reach plus one (31 here), then back to a latent frame that is a multiple of 3 (the decoder's rings)
    assert [context_latents(vae.cfg, n) for n in (33, 40, 41, 42, 5)] == [33, 31, 32, 33, 5]
    part = decode_part(vae, z[:, :, :33], z[:, :, 33:])
    torch.testing.assert_close(part, whole[:, :, 1 + 4 * 32:], rtol=0, atol=0)
    late = decode_part(vae, z[:, :, :34], z[:, :, 34:])  # its decode starts at latent frame 34 - 31 = 3
    torch.testing.assert_close(late, whole[:, :, 1 + 4 * 33:], rtol=0, atol=0)
    short = decode_part(vae, z[:, :, :6], z[:, :, 6:9])  # fewer latents before than the reach: all of them
    torch.testing.assert_close(short, vae.decode(z[:, :, :9])[:, :, 1 + 4 * 5:], rtol=0, atol=0)

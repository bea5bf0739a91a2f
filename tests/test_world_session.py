"""The World session on the tiny demo (CPU, float32): a played video equals the batch run of its keys bit for bit,
with and without a window (eviction), through a growing cache, after rewinds and after an interrupted chunk;
saving, continuing a saved state from the CLI, LoRA on the Fast model, and nothing left after close."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from lingbot_world.cli import main
from lingbot_world.wan.control.actions import ActionStringError, KeyInputError
from lingbot_world.wan.sampling.fast_parts import CameraSource
from lingbot_world.wan.sampling.sampler import Cancelled
from lingbot_world.world import WorldFiles, TextSettings, WorldError, WorldSession, WorldSettings, open_session

IMAGE = "assets/examples/00/image.jpg"
PROMPT = "a lake with a lone tree"
SIZE = "64*112"  # 48x112 from example 00's image: 21 tokens per latent frame
KEYS = ["w-8", "wj-6,none-6", None, "a-12", "i-3,l-9"]


@pytest.fixture(scope="module")
def files(demo_ckpt):
    return WorldFiles.demo(demo_ckpt)


def _settings(cache_dir, **kw) -> WorldSettings:
    return WorldSettings(size=SIZE, text=TextSettings(device="cpu", cache_dir=cache_dir), **kw)


def _open(files, tmp_path, **kw) -> WorldSession:
    s = open_session(files, _settings(tmp_path.parent / "world_text_cache", **kw), device="cpu")
    s.start(IMAGE, PROMPT)
    return s


def _play(session, keys) -> np.ndarray:
    out = []
    for k in keys:
        for batch in session.step(k):
            assert batch.frames.dtype == np.uint8 and batch.frames.shape[1:] == (session.height, session.width, 3)
            out.append(batch.frames)
    return np.concatenate(out)


def _png_frames(folder) -> np.ndarray:
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


def _batch(demo_ckpt, tmp_path, actions: str, *extra) -> np.ndarray:
    out = tmp_path / "batch"
    code = main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--rule", "continuable",
                 "--actions", actions, "--image", IMAGE, "--prompt", PROMPT, "--size", SIZE, "--quiet",
                 "--cache-dir", str(tmp_path.parent / "world_text_cache"), "--out", str(out), *extra])
    assert code == 0
    return _png_frames(out)


def test_a_played_video_equals_the_batch_run_of_its_keys(files, demo_ckpt, tmp_path):
    with _open(files, tmp_path, window=6, sink=3) as s:
        assert s.keys_for_next_chunk() == 8
        played = _play(s, KEYS)
        assert s.keys_for_next_chunk() == 12 and s.chunks == 5 and s.frames == 57 == played.shape[0]
        assert s.cache.global_end > s.cache.local_end  # the window evicted tokens
        actions = s.action_string()
    assert actions == "w-8,wj-6,none-18,a-12,i-3,l-9"
    assert np.array_equal(played, _batch(demo_ckpt, tmp_path, actions, "--window", "6", "--sink", "3"))


def test_a_cache_without_window_grows_and_gives_the_same_latents(files, tmp_path, monkeypatch):
    import lingbot_world.world.cache as cache_mod
    import lingbot_world.world.plan as plan_mod

    grow_every_chunk = lambda settings: settings.chunk_frames  # noqa: E731
    monkeypatch.setattr(plan_mod, "grow_latent_frames", grow_every_chunk)
    monkeypatch.setattr(cache_mod, "grow_latent_frames", grow_every_chunk)
    with _open(files, tmp_path) as s:
        _play(s, KEYS[:4])
        capacities = s.cache.capacity
        played = s.latent()
        keys = s.keys()
    assert capacities >= 12 * 21
    with _open(files, tmp_path) as b:  # one part of the concatenated keys, cache sized for it at once
        source = CameraSource(keys=keys, label="keys")
        b.run_part(b.plan_part(source), source)
        assert torch.equal(b.latent(), played)


def test_rewind_is_exact_before_and_after_an_eviction(files, tmp_path):
    with _open(files, tmp_path, window=6, sink=3) as s:
        played = _play(s, KEYS)
        s.rewind(4)  # no eviction since chunk 4? there was: the cache is rebuilt from the context passes
        assert s.chunks == 4 and s.frames == 45
        assert np.array_equal(_play(s, KEYS[4:]), played[45:])
        s.rewind(1)
        again = _play(s, KEYS[1:])
        assert np.array_equal(again, played[9:])
        s.rewind(0)
        assert s.chunks == 0 and s.keys_for_next_chunk() == 8
        assert np.array_equal(_play(s, KEYS[:2]), played[:21])
        with pytest.raises(WorldError, match="chunk boundary from 0 to 2"):
            s.rewind(5)


def test_the_camera_path_walks_only_new_frames_and_equals_the_whole_walk(files, tmp_path, monkeypatch):
    """camera_path() (the player's minimap, after every chunk) continues its walk from the last call's end: the
    poses equal a walk of all the keys bit for bit after every chunk, a rewind and a new video."""
    from lingbot_world.wan.control import act_to_camera

    walked: list[int] = []
    real = act_to_camera.keys_to_camera

    def counting(keys, *a, **kw):
        walked.append(keys.frames)
        return real(keys, *a, **kw)

    def check(s):
        poses, intrinsics = s.camera_path()
        ref = real(s.keys())[0]
        assert np.array_equal(poses, ref.poses) and np.array_equal(intrinsics, ref.intrinsics[0])

    with _open(files, tmp_path, window=6, sink=3) as s:
        assert s.camera_path() is None
        monkeypatch.setattr(act_to_camera, "keys_to_camera", counting)
        for k in KEYS:
            _play(s, [k])
            check(s)
        assert walked == [8, 12, 12, 12, 12]  # each call walked its chunk's frames only
        s.rewind(2)
        check(s)
        assert walked[-1] == 20  # a rewind walks again from the start
        _play(s, KEYS[2:3])
        check(s)
        assert walked[-1] == 12
        s.start(IMAGE, PROMPT)  # a new video with the same first keys
        _play(s, KEYS[:1])
        check(s)


def test_rewind_without_eviction_sets_the_counters_back(files, tmp_path):
    with _open(files, tmp_path) as s:
        played = _play(s, KEYS[:3])
        cache = s.cache
        s.rewind(2)
        assert s.cache is cache and cache.local_end == 2 * 3 * 21 - 21 * 0  # 2 chunks' tokens, same tensors
        assert np.array_equal(_play(s, KEYS[2:3]), played[21:])


def test_an_interrupted_chunk_leaves_the_video_at_its_last_chunk(files, tmp_path):
    with _open(files, tmp_path, window=6, sink=3) as s:
        reference = _play(s, KEYS)
    with _open(files, tmp_path, window=6, sink=3) as s:
        _play(s, KEYS[:3])
        calls = []
        s.cancel_check = lambda: len(calls) > 2 or calls.append(1)
        with pytest.raises(Cancelled):
            _play(s, KEYS[3:4])
        s.cancel_check = None
        assert s.chunks == 3
        assert np.array_equal(_play(s, KEYS[3:]), reference[33:])


def test_a_chunk_that_comes_out_as_nan_stops_with_one_line_and_the_video_stays_whole(files, tmp_path):
    """A model whose output turns non-finite (fp16 passing 65504 on real weights, a broken file) would make black
    frames and poison every later chunk through the cache: the session stops at that chunk with one line naming
    the cause, before its frames are decoded or shown, and the video stays at its last whole chunk."""
    with _open(files, tmp_path, window=6, sink=3) as s:
        reference = _play(s, KEYS)
    with _open(files, tmp_path, window=6, sink=3) as s:
        _play(s, KEYS[:3])
        hook = s.model.register_forward_hook(lambda mod, args, out: out * float("nan"))
        try:
            with pytest.raises(WorldError, match=r"chunk 1 of this part came out as inf/NaN: .*check-expert"):
                _play(s, KEYS[3:4])
        finally:
            hook.remove()
        assert s.chunks == 3
        assert np.array_equal(_play(s, KEYS[3:]), reference[33:])


def test_a_non_finite_chunk_under_fp16acc_points_at_bf16():
    from lingbot_world.world.errors import check_finite_chunk

    check_finite_chunk(torch.zeros(1, 16, 1, 2, 2), 0, "fp16acc")  # finite: nothing
    bad = torch.zeros(1, 16, 1, 2, 2)
    bad[0, 3, 0, 1, 1] = float("inf")
    with pytest.raises(WorldError, match=r"chunk 3 .*fp16.*65504.*--compute bf16"):
        check_finite_chunk(bad, 2, "fp16acc")


def test_bad_keys_are_refused_before_any_work(files, tmp_path):
    with _open(files, tmp_path) as s:
        with pytest.raises(KeyInputError, match="9 frames of keys for one chunk, which takes 8"):
            next(s.step("w-9"))
        with pytest.raises(ActionStringError, match="key"):
            next(s.step("x-3"))
        assert s.chunks == 0


def test_save_and_continue_the_saved_state_from_the_cli(files, demo_ckpt, tmp_path):
    written = {}

    def write_video(frames, path, fps):
        written["frames"] = np.concatenate(list(frames))
        np.save(path.with_suffix(".npy"), written["frames"])
        return path.with_suffix(".npy")

    with _open(files, tmp_path, window=6, sink=3) as s:
        played = _play(s, KEYS[:3])
        saved = s.save(tmp_path / "walk", write_video=write_video, state=True)
        more = _play(s, KEYS[3:])
    assert np.array_equal(written["frames"], played)
    assert saved.actions.read_text().strip() == "w-8,wj-6,none-18"
    poses = np.load(saved.camera / "poses.npy")
    assert poses.shape == (33, 4, 4) and np.load(saved.camera / "intrinsics.npy").shape == (33, 4)
    out = tmp_path / "part2"
    assert main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--continue-from",
                 str(saved.state), "--actions", "a-12,i-3,l-9", "--quiet", "--out", str(out)]) == 0
    assert np.array_equal(_png_frames(out), more)


def test_close_frees_the_model_and_the_cache(files, tmp_path):
    s = _open(files, tmp_path)
    _play(s, KEYS[:1])
    placement = s.placement
    s.close()
    s.close()  # idempotent
    assert placement.model is None and placement.placement is None and s.cache is None and s.decoder is None
    with pytest.raises(WorldError, match="closed"):
        next(s.step("w-8"))


def _tiny_lora(path, cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = cfg.dim
    sd = {}
    for i in range(cfg.num_layers):
        name = f"diffusion_model.blocks.{i}.self_attn.q"
        sd[f"{name}.lora_down.weight"] = torch.randn(4, d, generator=g) / d**0.5
        sd[f"{name}.lora_up.weight"] = torch.randn(d, 4, generator=g)
    save_file(sd, str(path))
    return path


def test_lora_on_the_fast_model(files, demo_ckpt, tmp_path):
    fmt, _, _ = files.check()
    lora = _tiny_lora(tmp_path / "fast_lora.safetensors", fmt.config)
    plain = _batch(demo_ckpt, tmp_path, "w-8")
    assert np.array_equal(_batch(demo_ckpt, tmp_path, "w-8", "--lora", f"{lora}:0"), plain)
    with_lora = _batch(demo_ckpt, tmp_path, "w-8", "--lora", f"{lora}:1")
    assert not np.array_equal(with_lora, plain)
    with _open(files, tmp_path, loras=((lora, 1.0),)) as s:  # the session applies it the same way
        assert np.array_equal(_play(s, ["w-8"]), with_lora)


def test_lora_high_or_low_on_the_fast_model_is_refused(demo_ckpt, tmp_path, capsys):
    code = main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--lora-high", "x.safetensors",
                 "--out", str(tmp_path / "x.mp4")])
    assert code == 2
    assert "--lora-high: the Fast model is one model; use --lora" in capsys.readouterr().err


@pytest.mark.parametrize("chunk_steps", [None, 2])
def test_the_draft_preset_plays_like_its_batch_run_and_rewinds_exactly(files, demo_ckpt, tmp_path, chunk_steps):
    """draft as it is, and in 2 steps per chunk (--chunk-steps 2, on the batch run's command line too)."""
    import torch as _torch

    from lingbot_world.speed.presets import resolve_preset

    speed = resolve_preset("draft", _torch.device("cpu"), chunk_steps=chunk_steps)
    steps_args = ("--chunk-steps", str(chunk_steps)) if chunk_steps else ()
    with _open(files, tmp_path, window=6, sink=3, speed=speed) as s:
        assert s.settings.window == 6  # the preset's cap (15) leaves a smaller window alone
        played = _play(s, KEYS[:4])
        assert s.parts[-1].folded  # the folded context pass: what rebuilds the cache
        s.rewind(2)
        assert np.array_equal(_play(s, KEYS[2:4]), played[21:])
        actions = s.action_string()
    batch = _batch(demo_ckpt, tmp_path, actions, "--window", "6", "--sink", "3", "--speed", "draft", *steps_args)
    assert np.array_equal(played, batch)


class _Held:
    """A model lock that says whether this thread holds it (an RLock whose depth is counted)."""

    def __init__(self):
        import threading

        self._lock, self.depth, self.entries = threading.RLock(), 0, 0

    def acquire(self, blocking=True, timeout=-1):
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.depth += 1
            self.entries += 1
        return got

    def release(self):
        self.depth -= 1
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def test_every_use_of_the_model_holds_the_model_lock(files, tmp_path):
    """A door sharing one model between sessions (ComfyUI: Play beside Fast Continue) passes its lock: every forward,
    a rewind's rebuild included, runs while the session holds it."""
    with _open(files, tmp_path, window=4, sink=1) as s:
        held = s.model_lock = _Held()
        s.load()
        outside = []
        s.model.register_forward_pre_hook(lambda *_: outside.append(held.depth == 0))
        _play(s, KEYS[:3])  # 3 chunks in a 4-frame window: chunk 1's tokens are evicted
        s.rewind(2)  # evicted since: the cache is rebuilt by replaying the context passes
        _play(s, KEYS[2:3])
        assert outside and not any(outside) and held.depth == 0 and held.entries >= 6


def test_the_camera_film_kept_per_chunk_changes_no_bit(files, tmp_path, monkeypatch):
    """The memory plan's film_blocks: each chunk's first call keeps the camera FiLM for its other calls. A played
    video with it equals one whose plan keeps none, bit for bit (and the cache was read, not only filled)."""
    from dataclasses import replace

    from lingbot_world.memory.fast_plan import FastMemoryPlan

    made = []
    make_film = FastMemoryPlan.make_film

    def recording(plan, device=None, host_store=None, device_store=None):
        film = make_film(plan, device, host_store, device_store)
        made.append(film)
        return film

    monkeypatch.setattr(FastMemoryPlan, "make_film", recording)
    with _open(files, tmp_path, window=6, sink=3) as s:
        assert s.placement.plan.film_blocks == s.placement.plan.num_layers  # a CPU run: all of them, in RAM
        kept = _play(s, KEYS[:2])
        store = s._film_device_store
        addresses = {i: (a.data_ptr(), b.data_ptr()) for i, (a, b) in store.values.items()}
        kept = np.concatenate([kept, _play(s, KEYS[2:3])])
        # one store for the video, its tensors the same every chunk (CUDA graphs replay over their addresses)
        assert s._film_device_store is store and len(addresses) == s.placement.plan.num_layers
        assert {i: (a.data_ptr(), b.data_ptr()) for i, (a, b) in store.values.items()} == addresses
        kept_latent = s.latent()
    assert store.values == {}  # freed with the session
    assert made and all(f is not None and f.stats["read"] > 0 for f in made)
    with _open(files, tmp_path, window=6, sink=3) as s:
        s.placement.plan = replace(s.placement.plan, film_blocks=0)
        computed = _play(s, KEYS[:3])
        assert torch.equal(s.latent(), kept_latent)
    assert np.array_equal(kept, computed)


def test_the_camera_film_kept_in_host_ram_changes_no_bit(files, tmp_path):
    """A plan whose FiLM lives partly in (pinned) host RAM, as on a 24 GB card: the session keeps one store for every
    chunk (allocated once, not per played chunk), closes it with the video, and the frames equal the run that
    computes the FiLM at every call."""
    from dataclasses import replace

    with _open(files, tmp_path, window=6, sink=3) as s:
        n = s.placement.plan.num_layers
        s.placement.plan = replace(s.placement.plan, film_blocks=0)
        computed = _play(s, KEYS[:3])
        computed_latent = s.latent()
    with _open(files, tmp_path, window=6, sink=3) as s:
        s.placement.plan = replace(s.placement.plan, film_blocks=1, film_host_blocks=n - 1)
        kept = _play(s, KEYS[:2])
        store = s._film_store
        assert store is not None and store.uploads > 0 and store.host_bytes > 0
        buffers = dict(store.host)
        kept = np.concatenate([kept, _play(s, KEYS[2:3])])
        assert s._film_store is store and store.host == buffers  # pinned once for every chunk
        assert torch.equal(s.latent(), computed_latent)
        s.rewind(0)  # a new video: its store goes with the cache
        assert s._film_store is None and store.host_bytes == 0
        _play(s, KEYS[:1])
        store = s._film_store
        assert store is not None and store.host_bytes > 0
    assert store.host_bytes == 0  # and with the session
    assert np.array_equal(kept, computed)


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory):
    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    return write_random_tiny_vae(tmp_path_factory.mktemp("tiny_vae") / "taew2_1.safetensors")


def test_a_tiny_decoder_plays_like_its_batch_run_and_rewinds_exactly(files, demo_ckpt, tmp_path, tiny_vae):
    with _open(files, tmp_path, window=6, sink=3, tiny_vae=tiny_vae) as s:
        assert s.tiny_decoder is not None
        played = _play(s, KEYS)
        s.rewind(4)  # 12 latent frames: the new decoder starts mid-video from its reach's frames
        assert np.array_equal(_play(s, KEYS[4:]), played[45:])
        s.rewind(2)
        assert np.array_equal(_play(s, KEYS[2:]), played[21:])
        assert np.array_equal(np.concatenate(list(s.video_frames())), played)
        actions = s.action_string()
    window = ("--window", "6", "--sink", "3")
    assert np.array_equal(played, _batch(demo_ckpt, tmp_path, actions, *window, "--tiny-vae", str(tiny_vae)))
    assert not np.array_equal(played, _batch(demo_ckpt, tmp_path, actions, *window))  # the VAE decodes otherwise


def test_a_continuation_with_a_tiny_decoder_writes_the_whole_video_of_one_run(files, demo_ckpt, tmp_path, tiny_vae):
    with _open(files, tmp_path, window=6, sink=3, tiny_vae=tiny_vae) as s:
        _play(s, KEYS[:3])
        saved = s.save(tmp_path / "walk", write_video=lambda frames, path, fps: path, state=True)
        _play(s, KEYS[3:])
        whole = np.concatenate(list(s.video_frames()))
    out, everything = tmp_path / "part2", tmp_path / "whole"
    assert main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_ckpt), "--continue-from",
                 str(saved.state), "--actions", "a-12,i-3,l-9", "--quiet", "--out", str(out),
                 "--whole-video", str(everything), "--tiny-vae", str(tiny_vae)]) == 0
    assert np.array_equal(_png_frames(out), whole[33:])
    assert np.array_equal(_png_frames(everything), whole)


def test_tiny_vae_flags_are_refused_in_one_line(demo_ckpt, tmp_path, tiny_vae, capsys):
    base = ["generate", "--demo", "--demo-dir", str(demo_ckpt), "--out", str(tmp_path / "x.mp4")]
    assert main(base + ["--tiny-vae", str(tiny_vae)]) == 2
    assert "--tiny-vae is a flag of the Fast model: add --model fast" in capsys.readouterr().err
    assert main(base + ["--model", "fast", "--tiny-vae", str(tiny_vae), "--stream-decode", "off"]) == 2
    assert "leave --stream-decode off out" in capsys.readouterr().err
    bad = tmp_path / "taew2_2.safetensors"
    save_file({"decoder.1.weight": torch.zeros(8, 48, 3, 3)}, str(bad))
    assert main(base + ["--model", "fast", "--tiny-vae", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--tiny-vae: {bad}: a tiny decoder for 48-channel latents" in err and not (tmp_path / "x.mp4").exists()
    assert main(["play", "--demo", "--demo-dir", str(demo_ckpt), "--no-browser",
                 "--tiny-vae", str(tmp_path / "missing.safetensors")]) == 2
    assert "--tiny-vae: tiny VAE file" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_tiny_decoder_played_on_the_gpu_equals_its_batch_run(files, demo_ckpt, tmp_path, tiny_vae):
    settings = _settings(tmp_path.parent / "world_text_cache", window=6, sink=3, tiny_vae=tiny_vae)
    with open_session(files, settings, device="cuda") as s:
        s.start(IMAGE, PROMPT)
        played = _play(s, KEYS)
        s.rewind(4)
        assert np.array_equal(_play(s, KEYS[4:]), played[45:])
        actions = s.action_string()
    # a session without a speed plan runs the exact defaults, float32 decode included: `--speed exact` (without
    # --speed the CLI's flags are auto's, whose decode is fp16 on a GPU)
    batch = _batch(demo_ckpt, tmp_path, actions, "--window", "6", "--sink", "3", "--tiny-vae", str(tiny_vae),
                   "--device", "cuda", "--noise", "cpu", "--speed", "exact")
    assert np.array_equal(played, batch)


def test_a_chunks_preview_is_its_first_steps_x0_and_changes_no_frame(files, demo_ckpt, tmp_path, tiny_vae):
    """step(on_preview=...) with a tiny decoder: once per chunk, from inside its run right after the first model
    call, the chunk's frames as a fork of the tiny decoder decodes that call's x0; the real frames (through a rewind)
    are still the batch run's bit for bit, and the session's own callback sees every step."""
    from lingbot_world.wan.vae.tiny import TinyStreamingDecoder
    from lingbot_world.world.frames import to_uint8

    events, steps, first_x0 = [], [], []

    def callback(info):
        steps.append(info.step)
        if info.step == 0:
            first_x0.append(info.x0.clone())

    def play(s, keys) -> np.ndarray:
        out = []
        for k in keys:
            made, before = s.chunks, (s.latent() if s.chunks else None)
            for batch in s.step(k, on_preview=lambda p: events.append(("preview", p, s.chunks))):
                assert not batch.preview
                events.append(("frames", batch, s.chunks))
                out.append(batch.frames)
            kinds = [e[0] for e in events]
            assert kinds[0] == "preview" and kinds.count("preview") == 1, kinds  # first, and once
            preview, during = events[0][1], events[0][2]
            real = np.concatenate([e[1].frames for e in events[1:]])
            assert during == made and preview.preview and preview.chunk == made  # called inside the run
            assert preview.first_frame == events[1][1].first_frame and preview.frames.shape == real.shape
            fork = TinyStreamingDecoder(s.tiny_decoder)  # where the session's decoder was: the video before
            if before is not None:
                fork.decode(before)
            assert np.array_equal(preview.frames, to_uint8(fork.decode(first_x0[-1])))
            assert not np.array_equal(preview.frames, real)  # one step of several: a rougher picture
            assert s.last_times.preview > 0 and "preview" in s.last_times.to_json()
            events.clear()
        return np.concatenate(out)

    with _open(files, tmp_path, window=6, sink=3, tiny_vae=tiny_vae) as s:
        s.callback = callback
        played = play(s, KEYS)
        assert steps == list(range(s.steps_per_chunk)) * len(KEYS)
        s.rewind(2)  # a new decoder, warmed up on the frames before: its fork previews from there
        assert np.array_equal(play(s, KEYS[2:]), played[21:])
        actions = s.action_string()
    window = ("--window", "6", "--sink", "3")
    assert np.array_equal(played, _batch(demo_ckpt, tmp_path, actions, *window, "--tiny-vae", str(tiny_vae)))


def test_a_session_decoding_with_the_vae_makes_no_preview(files, tmp_path):
    previews = []
    with _open(files, tmp_path) as s:
        frames = [b for b in s.step("w-8", on_preview=previews.append)]
        assert frames and not previews and "preview" not in s.last_times.to_json()

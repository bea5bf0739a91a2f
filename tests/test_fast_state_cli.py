"""`generate --model fast` with keys, `--save-state` and `--continue-from` on the tiny demo (CPU): a chain of runs
through state files equals one run of the concatenated keys frame for frame, and every bad state is one clear line
before anything loads."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.loaders.fast_state_file import StateFile
from lingbot_world.loaders.safetensors_stream import SafetensorsWriter, iter_tensors, read_header


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tmp_path_factory.mktemp("fast_state_demo")


def gen(demo, *extra):
    return main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo / "ckpt"), "--quiet",
                 "--cache-dir", str(demo / "text_cache"), *extra])


def frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


@pytest.fixture(scope="module")
def chain(demo):
    """One run of 44 frames of keys, and the same keys as 20 + 24 through a state file."""
    assert gen(demo, "--actions", "w-10,l-10,a-12,iw-12", "--rule", "continuable", "--out", str(demo / "one")) == 0
    assert gen(demo, "--actions", "w-10,l-10", "--rule", "continuable", "--out", str(demo / "p1"),
               "--save-state", str(demo / "s1.state")) == 0
    assert gen(demo, "--continue-from", str(demo / "s1.state"), "--actions", "a-12,iw-12", "--out", str(demo / "p2"),
               "--whole-video", str(demo / "whole"), "--save-state", str(demo / "s2.state")) == 0
    return demo


def test_continuing_through_state_files_equals_one_run(chain):
    one = frames(chain / "one")
    assert one.shape[0] == 45  # 44 frames of keys move the camera into frames 1..44
    assert np.array_equal(frames(chain / "whole"), one)
    assert np.array_equal(frames(chain / "p1"), one[:21])
    assert np.array_equal(frames(chain / "p2"), one[21:])  # the new part alone, decoded exactly
    s2 = StateFile(chain / "s2.state").state
    assert (s2.chunks, s2.frames, s2.settings.mode) == (4, 45, "continuable")
    assert s2.settings.compile == "off"  # the kernels it was made with (a continuation under auto follows them)
    assert [p["chunks"] for p in s2.parts] == [2, 2]


def test_state_round_trip_keeps_everything(chain):
    sf = StateFile(chain / "s1.state")
    st = sf.state
    assert st.chunks == 2 and st.latent().shape[2] == 6 and st.has_camera
    assert sf.num_layers == 2 and sf.kv_bytes == 2 * 2 * st.kv_local_end * sf.heads * sf.head_dim * 4
    k, v = sf.layer(1)
    assert k.shape == (1, st.kv_local_end, sf.heads, sf.head_dim) and k.abs().sum() > 0
    g = st.generator_for()
    assert torch.equal(g.get_state(), st.generator)
    assert st.condition.stationary_from > 6 and st.camera.latent_frames == 6


def test_fast_takes_keys_with_the_release_rule_by_default(chain, capsys):
    out = chain / "keys"
    assert gen(chain, "--actions", "w-10,j-10,w-5", "--out", str(out), "--trajectory-picture") == 0
    assert frames(out).shape[0] == 21  # 25 frames of keys -> 7 latent frames -> 6: 21 frames, camera compressed
    assert (chain / "keys_trajectory.png").is_file()


def _rewrite(src, dst, metadata=None, drop=(), change=None):
    header = read_header(src)
    meta = dict(header.metadata)
    if metadata:
        meta.update(metadata(meta))
    with SafetensorsWriter(dst, meta) as w:
        for name, t in iter_tensors(header):
            if name in drop:
                continue
            if change and name in change:
                t = change[name](t)
            w.add(name, t)
    return dst


def test_bad_states_are_refused_in_one_line(chain, tmp_path, capsys):
    s1 = chain / "s1.state"

    def refused(path, *extra):
        rc = gen(chain, "--continue-from", str(path), "--actions", "w-12", "--out", str(tmp_path / "x"), *extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        return err[0]

    assert "state file not found" in refused(tmp_path / "missing.state")
    assert "not a LingBot-World Fast state file" in refused(chain / "ckpt" / "lingbot_world_fast_bnb_nf4" / "model.safetensors")
    bumped = _rewrite(s1, tmp_path / "v2.state", metadata=lambda m: {"version": "2"})
    assert "state format version 2" in refused(bumped)
    cut = tmp_path / "cut.state"
    cut.write_bytes(s1.read_bytes()[:-1000])
    assert "not a complete Fast state file" in refused(cut)
    flipped = _rewrite(s1, tmp_path / "flip.state", change={"latents": lambda t: t + 1})
    assert "'latents' is damaged" in refused(flipped)
    other = _rewrite(s1, tmp_path / "other.state", metadata=lambda m: {"state": json.dumps(
        {**json.loads(m["state"]), "settings": {**json.loads(m["state"])["settings"], "model": "0" * 64,
                                                "model_label": "another_model"}})})
    assert "made with another Fast model (another_model)" in refused(other)
    assert "weights nf4, this run uses bf16" in refused(s1, "--weights", "bf16")
    assert "--window 3: the video was started with --window None" in refused(s1, "--window", "3")


def test_a_damaged_cache_layer_stops_the_restore(chain, tmp_path, capsys):
    bad = _rewrite(chain / "s1.state", tmp_path / "kv.state", change={"kv.001.v.h0": lambda t: t * 2})
    rc = gen(chain, "--continue-from", str(bad), "--actions", "w-12", "--out", str(tmp_path / "y"))
    assert rc == 2 and "'kv.001.v.h0' is damaged" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


def test_another_model_file_is_refused(chain, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(chain / "ckpt", ckpt)
    model = ckpt / "lingbot_world_fast_bnb_nf4" / "model.safetensors"
    data = bytearray(model.read_bytes())
    start = read_header(model).data_start
    data[start + 10] ^= 0xFF  # one weight byte in the first sampled block
    model.write_bytes(bytes(data))
    rc = main(["generate", "--demo", "--model", "fast", "--demo-dir", str(ckpt), "--quiet", "--continue-from",
               str(chain / "s1.state"), "--out", str(tmp_path / "z")])
    assert rc == 2 and "made with another Fast model" in capsys.readouterr().err


def test_a_continuation_follows_the_speed_preset_and_steps_the_video_was_made_with(demo, capsys):
    """A draft video in 2 steps per chunk, continued without --speed / --chunk-steps, is one run of all its keys
    (every decode of it in draft's bf16: streamed, afterwards, the whole video); a continuation that asks for other
    steps runs them and says the whole video is then another one."""
    fast = ("--speed", "draft", "--chunk-steps", "2", "--rule", "continuable", "--window", "6", "--sink", "3")
    assert gen(demo, "--actions", "w-10,l-10,a-12,iw-12", *fast, "--out", str(demo / "d_one")) == 0
    assert gen(demo, "--actions", "w-10,l-10", *fast, "--out", str(demo / "d_p1"),
               "--save-state", str(demo / "d1.state")) == 0
    st = StateFile(demo / "d1.state").state.settings
    assert (st.speed, st.chunk_steps) == ("draft", 2)
    capsys.readouterr()
    assert main(["generate", "--demo", "--model", "fast", "--demo-dir", str(demo / "ckpt"),  # not --quiet: the note
                 "--cache-dir", str(demo / "text_cache"), "--continue-from", str(demo / "d1.state"), "--actions",
                 "a-12,iw-12", "--out", str(demo / "d_p2"), "--whole-video", str(demo / "d_whole")]) == 0
    out = capsys.readouterr()
    assert "--speed draft --chunk-steps 2, as the continued video was made" in out.out + out.err
    assert np.array_equal(frames(demo / "d_whole"), frames(demo / "d_one"))  # the whole video decoded in bf16 too
    assert gen(demo, "--actions", "w-10,l-10,a-12,iw-12", *fast, "--stream-decode", "off",
               "--out", str(demo / "d_after")) == 0  # decoded after sampling, not chunk by chunk: the same frames
    assert np.array_equal(frames(demo / "d_after"), frames(demo / "d_one"))
    assert gen(demo, "--continue-from", str(demo / "d1.state"), "--actions", "a-12,iw-12", "--out", str(demo / "d_p3"),
               "--chunk-steps", "3") == 0
    err = capsys.readouterr().err  # a warning: shown even with --quiet
    assert ("the continued video was made with --speed draft --chunk-steps 2; this part runs --speed draft "
            "--chunk-steps 3, so the whole video will not be what one run of all its keys makes") in err
    assert not np.array_equal(frames(demo / "d_p3"), frames(demo / "d_p2"))


def test_follow_started_speed_rules():
    from lingbot_world.speed.plans import follow_started_speed

    assert follow_started_speed(None, None, "", 0) == (None, None, None, False)  # an older state: as given
    assert follow_started_speed("fast", 2, "", 0)[:2] == ("fast", 2)
    followed = follow_started_speed(None, None, "draft", 3)
    assert followed[:2] == ("draft", None) and not followed.differs and "--speed draft, as" in followed.note
    assert follow_started_speed("draft", None, "draft", 3) == ("draft", None, None, False)  # as made: nothing to say
    assert follow_started_speed(None, None, "", 4) == (None, None, None, False)  # made without a preset
    assert follow_started_speed(None, None, "", 2)[:2] == (None, 2)  # --chunk-steps 2 without a preset
    differs = follow_started_speed("auto", None, "draft", 3)  # another preset brings its own steps
    assert differs.differs and differs[:2] == ("auto", None)
    assert "made with --speed draft --chunk-steps 3; this part runs --speed auto --chunk-steps 4" in differs.note
    assert follow_started_speed("draft", None, "", 4).differs  # a preset given to a video made without one

"""`lingbot-world generate --model fast`: the Fast path on the tiny demo checkpoint (CPU), and its bad inputs."""
import numpy as np
import pytest
from PIL import Image

from lingbot_world.cli import main


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fast_demo")


def _generate(demo_dir, out, *extra):
    argv = ["generate", "--demo", "--model", "fast", "--demo-dir", str(demo_dir), "--out", str(out), "--quiet",
            "--cache-dir", str(demo_dir / "text_cache"), *extra]
    return main(argv)


def _frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


def test_fast_demo_streams_every_chunk_and_says_how_many_frames(demo_dir, tmp_path, capsys):
    assert _generate(demo_dir, tmp_path / "a", "--frames", "25", "--seed", "3") == 0
    out = capsys.readouterr().out
    assert "generated 21 frames (requested 25)" in out  # 25 -> 7 latent frames -> 6 -> 21 frames
    a = _frames(tmp_path / "a")
    assert a.shape == (21, 48, 112, 3) and a.std() > 0
    # decoding at the end instead of chunk by chunk, with the cache streamed from host memory (a CPU "device"):
    # the same frames
    assert _generate(demo_dir, tmp_path / "b", "--frames", "25", "--seed", "3", "--stream-decode", "off",
                     "--kv-cache", "host", "--kv-layers-on-gpu", "1") == 0
    assert np.array_equal(a, _frames(tmp_path / "b"))


def test_fast_bad_inputs_are_one_clear_line(demo_dir, tmp_path, capsys):
    assert _generate(demo_dir, tmp_path / "x", "--frames", "5") == 2
    assert "no complete chunk" in capsys.readouterr().err
    base = demo_dir / "high_noise_model_bnb_nf4"
    assert _generate(demo_dir, tmp_path / "x", "--fast-model", str(base)) == 2
    err = capsys.readouterr().err
    assert "is a base (high/low-noise) expert" in err and "not the Fast model" in err
    assert _generate(demo_dir, tmp_path / "x", "--window", "4", "--sink", "3") == 2
    assert "cannot hold the 3-frame sink" in capsys.readouterr().err
    # the Fast model given as a base expert
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--high", str(demo_dir / "lingbot_world_fast_bnb_nf4"),
               "--out", str(tmp_path / "y"), "--quiet", "--steps", "2", "--cache-dir", str(demo_dir / "text_cache")])
    assert rc == 2 and "is the Fast (causal) model" in capsys.readouterr().err


def test_fast_model_files(tmp_path):
    from lingbot_world.loaders.checkpoint_dir import find_checkpoint_files
    from lingbot_world.world.files import find_in_folder

    for f in ("models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"):
        (tmp_path / f).write_bytes(b"x")
    (tmp_path / "google" / "umt5-xxl").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no LingBot-World Fast folder.*lingbot_world_fast.*Download "
                                                "robbyant/lingbot-world-fast"):
        find_in_folder(tmp_path, "fast")
    (tmp_path / "lingbot_world_fast").mkdir()
    files = find_in_folder(tmp_path, "fast")
    assert files.dit.name == "lingbot_world_fast" and files.vae.name == "Wan2.1_VAE.pth"
    assert find_in_folder(tmp_path / "lingbot_world_fast", "fast").dit == files.dit  # the folder itself
    (tmp_path / "lingbot_world_fast_bnb_nf4").mkdir()
    assert find_in_folder(tmp_path, "fast").dit.name == "lingbot_world_fast_bnb_nf4"  # NF4 copy wins
    with pytest.raises(FileNotFoundError, match="holds only the Fast model.*--model fast"):
        find_checkpoint_files(tmp_path)

"""`lingbot-world generate --demo`: the whole pipeline on the tiny random-weight checkpoint (CPU)."""
import numpy as np
import pytest
from PIL import Image

from lingbot_world.cli import main


@pytest.fixture(scope="module")
def demo_dir(demo_ckpt, demo_text_cache):
    return demo_ckpt  # its text_cache/ holds the demo prompts


def _frames(folder):
    files = sorted(folder.glob("frame_*.png"))
    return np.stack([np.asarray(Image.open(f)) for f in files])


def _generate(demo_dir, out, *extra):
    argv = ["generate", "--demo", "--demo-dir", str(demo_dir), "--out", str(out), "--quiet",
            "--cache-dir", str(demo_dir / "text_cache"), *extra]
    assert main(argv) == 0
    return _frames(out)


def test_demo_runs_and_is_deterministic(demo_dir, tmp_path):
    a = _generate(demo_dir, tmp_path / "a", "--seed", "3")
    # 17 frames at 48x112 (the demo's 64*112 max area with the 16:9 image), RGB uint8
    assert a.shape == (17, 48, 112, 3) and a.dtype == np.uint8
    assert a.std() > 0  # not a constant image
    b = _generate(demo_dir, tmp_path / "b", "--seed", "3")
    assert np.array_equal(a, b)
    c = _generate(demo_dir, tmp_path / "c", "--seed", "4", "--camera", "static", "--steps", "8")
    assert c.shape == a.shape and not np.array_equal(a, c)


def test_demo_writes_mp4(demo_dir, tmp_path):
    imageio = pytest.importorskip("imageio.v2")
    out = tmp_path / "demo.mp4"
    main(["generate", "--demo", "--demo-dir", str(demo_dir), "--out", str(out), "--quiet", "--steps", "6",
          "--cache-dir", str(demo_dir / "text_cache")])
    frames = imageio.mimread(out)
    assert len(frames) == 17 and frames[0].shape[:2] == (48, 112)


def test_bad_arguments_are_reported(demo_dir, tmp_path, capsys):
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--frames", "10", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "frame count 10" in err and "9" in err and "13" in err  # names the nearest valid counts
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--camera", "no_such_preset"])
    assert rc == 2 and "no_such_preset" in capsys.readouterr().err


def test_lora_flags(demo_dir, tmp_path, capsys):
    """--lora on both experts / --lora-high on one: strength 0 is the plain run, a LoRA changes the video, a LoRA
    for another model stops before any work with one line naming it."""
    import torch
    from safetensors.torch import save_file

    from lingbot_world.loaders.demo_checkpoint import demo_configs
    from lingbot_world.loaders.lora_files import dit_weight_shapes
    from lingbot_world.quant.nf4 import nf4_linear_names

    cfg = demo_configs()[0]
    shapes = dit_weight_shapes(cfg)
    g = torch.Generator().manual_seed(1)
    sd = {}
    for name in nf4_linear_names(cfg.num_layers)[:12]:
        out_f, in_f = shapes[f"{name}.weight"]
        sd[f"lora_unet_{name.replace('.', '_')}.lora_down.weight"] = torch.randn(4, in_f, generator=g) / in_f**0.5
        sd[f"lora_unet_{name.replace('.', '_')}.lora_up.weight"] = torch.randn(out_f, 4, generator=g)
    lora = tmp_path / "style.safetensors"
    save_file(sd, str(lora))
    short = ("--steps", "2", "--frames", "5")
    plain = _generate(demo_dir, tmp_path / "plain", *short)
    off = _generate(demo_dir, tmp_path / "off", *short, "--lora", f"{lora}:0")
    assert np.array_equal(plain, off)
    on = _generate(demo_dir, tmp_path / "on", *short, "--lora", str(lora), "--lora-high", f"{lora}:0.5")
    assert on.shape == plain.shape and not np.array_equal(on, plain)
    wrong = tmp_path / "other.safetensors"
    save_file({"lora_unet_blocks_0_self_attn_q.lora_down.weight": torch.zeros(4, 5120),
               "lora_unet_blocks_0_self_attn_q.lora_up.weight": torch.zeros(5120, 4)}, str(wrong))
    capsys.readouterr()
    rc = main(["generate", "--demo", "--demo-dir", str(demo_dir), "--out", str(tmp_path / "x"), "--quiet",
               "--lora-low", str(wrong)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "--lora-low" in err and "(4, 5120)" in err and "another model" in err

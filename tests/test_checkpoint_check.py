"""loaders/checkpoint_check.py: a truncated or wrong checkpoint file is found in seconds, before any work."""
import time

import pytest
import torch

from lingbot_world.loaders.checkpoint_check import CheckpointFileError, check_checkpoint, check_torch_zip
from lingbot_world.loaders.checkpoint_dir import find_checkpoint_files
from lingbot_world.loaders.demo_checkpoint import demo_vae_config
from lingbot_world.loaders.safetensors_stream import SafetensorsFormatError
from lingbot_world.loaders.vae_files import VAEFileError


def _check(root):
    files = find_checkpoint_files(root)
    return check_checkpoint(files, demo_vae_config(root))


def _truncate(path, keep=0.6):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_complete_demo_passes_quickly(demo_ckpt):
    t0 = time.perf_counter()
    checked = _check(demo_ckpt)
    assert checked.high.kind == "nf4_community" and checked.low.kind == "nf4_community"
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("part", ["high_noise_model_bnb_nf4/model.safetensors", "low_noise_model_bnb_nf4/model.safetensors"])
def test_truncated_expert(copy_demo, part):
    root = copy_demo()
    _truncate(root / part)
    with pytest.raises(SafetensorsFormatError, match="truncated") as e:
        _check(root)
    assert part.split("/")[0] in str(e.value)


@pytest.mark.parametrize("part,what", [("models_t5_umt5-xxl-enc-bf16.pth", "text encoder"), ("Wan2.1_VAE.pth", "VAE")])
@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_torch_files(copy_demo, part, what, keep):
    root = copy_demo()
    _truncate(root / part, keep)
    with pytest.raises(CheckpointFileError) as e:
        _check(root)
    msg = str(e.value)
    assert msg.startswith(f"{what} file ") and part in msg and "download it again" in msg


def test_torch_zip_check_on_any_torch_file(tmp_path):
    p = tmp_path / "model.pt"
    torch.save({"w": torch.randn(64, 64)}, p)
    check_torch_zip(p)  # complete: no error
    _truncate(p, 0.9)
    with pytest.raises(CheckpointFileError, match="no readable zip directory"):
        check_torch_zip(p, "high-noise expert")


def test_wrong_or_missing_parts(copy_demo):
    root = copy_demo()
    files = find_checkpoint_files(root)
    files.vae = files.t5  # the T5 file where the VAE belongs
    with pytest.raises(VAEFileError):
        check_checkpoint(files, demo_vae_config(root))
    files = find_checkpoint_files(root)
    import shutil

    shutil.rmtree(root / "google")
    files.tokenizer = None
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        check_checkpoint(files, demo_vae_config(root))

"""VAE file loading: .pth / .safetensors round trips (fp32, bf16, fp16) and the bad-input messages."""
import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.vae_files import (VAEFileError, check_vae_keys, describe_foreign_checkpoint, load_vae,
                                             read_vae_state_dict)
from lingbot_world.wan.vae.model import VAEConfig, WanVAE

TINY = VAEConfig.tiny()


@pytest.fixture(scope="module")
def tiny_sd():
    torch.manual_seed(0)
    vae = WanVAE(TINY)
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.01 * torch.randn_like(p))  # gammas too, so a dropped or swapped tensor would show
    return {k: v.detach().clone() for k, v in vae.state_dict().items()}


def _same_model(vae: WanVAE, sd: dict, dtype=torch.float32):
    got = vae.state_dict()
    assert got.keys() == sd.keys()
    for k, v in sd.items():
        assert got[k].dtype == torch.float32 and got[k].device.type == "cpu", k
        torch.testing.assert_close(got[k], v.to(dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("zip_format", [True, False])  # the old non-zip format cannot be memory-mapped
def test_pth_round_trip(tmp_path, tiny_sd, zip_format):
    path = tmp_path / "Wan2.1_VAE.pth"
    torch.save(tiny_sd, path, _use_new_zipfile_serialization=zip_format)
    vae = load_vae(path, config=TINY)
    _same_model(vae, tiny_sd)
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())
    assert not any(t.is_meta for t in vae.state_dict().values())
    ref = WanVAE(TINY).eval()
    ref.load_state_dict(tiny_sd)
    z = torch.randn(1, 16, 2, 2, 3)
    torch.testing.assert_close(vae.decode(z), ref.decode(z), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_safetensors_round_trip(tmp_path, tiny_sd, dtype):
    path = tmp_path / "wan_2.1_vae.safetensors"
    save_file({k: v.to(dtype).contiguous() for k, v in tiny_sd.items()}, str(path))
    assert read_vae_state_dict(path)["conv2.weight"].dtype == dtype  # read unchanged
    _same_model(load_vae(path, config=TINY), tiny_sd, dtype)  # upcast on load


def test_dit_file_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"patch_embedding.weight": torch.zeros(4, 36, 1, 2, 2),
               "blocks.0.self_attn.q.weight": torch.zeros(4, 4)}, str(path))
    with pytest.raises(VAEFileError, match="looks like a Wan DiT expert"):
        load_vae(path, config=TINY)


@pytest.mark.parametrize("key", ["blocks.0.attn.q.weight", "encoder.block.0.layer.0.SelfAttention.q.weight"])
def test_t5_file_is_named(tmp_path, key):
    path = tmp_path / "umt5.pth"
    torch.save({key: torch.zeros(4, 4), "token_embedding.weight": torch.zeros(8, 4)}, path)
    with pytest.raises(VAEFileError, match="looks like a umT5 text encoder"):
        load_vae(path, config=TINY)


def test_other_vae_flavours_are_named(tiny_sd):
    wan22 = dict.fromkeys(tiny_sd)
    wan22["decoder.upsamples.0.upsamples.0.residual.2.weight"] = None
    assert "Wan2.2 VAE" in describe_foreign_checkpoint(wan22)
    assert "diffusers" in describe_foreign_checkpoint(["quant_conv.weight", "decoder.up_blocks.0.resnets.0.x"])
    assert "prefix 'vae.'" in describe_foreign_checkpoint(["vae." + k for k in tiny_sd])
    assert describe_foreign_checkpoint(tiny_sd) is None


def test_missing_and_unexpected_keys_are_named(tmp_path, tiny_sd):
    sd = dict(tiny_sd)
    del sd["decoder.head.2.bias"], sd["encoder.middle.1.proj.weight"]
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "broken.pth"
    torch.save(sd, path)
    with pytest.raises(VAEFileError) as e:
        load_vae(path, config=TINY)
    msg = str(e.value)
    assert "2 missing key(s): decoder.head.2.bias, encoder.middle.1.proj.weight" in msg
    assert "1 unexpected key(s): extra.weight" in msg and str(path) in msg


def test_wrong_shapes_are_named(tmp_path, tiny_sd):
    sd = dict(tiny_sd)
    sd["conv2.weight"] = torch.zeros(16, 16, 3, 1, 1)
    path = tmp_path / "bad_shape.safetensors"
    save_file(sd, str(path))
    with pytest.raises(VAEFileError, match=r"conv2\.weight: file \[16, 16, 3, 1, 1\] vs model \[16, 16, 1, 1, 1\]"):
        load_vae(path, config=TINY)
    # a tiny file against the full-size config: many mismatches, summarised
    with pytest.raises(VAEFileError, match=r"shape mismatch\(es\): .*and \d+ more"):
        check_vae_keys({k: tuple(v.shape) for k, v in tiny_sd.items()}, VAEConfig())


class NotATensor:
    pass


def test_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_vae(tmp_path / "nope.pth")
    odd = tmp_path / "vae.onnx"
    odd.write_bytes(b"x")
    with pytest.raises(VAEFileError, match="unknown VAE file type"):
        load_vae(odd)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 32)
    with pytest.raises(VAEFileError, match="not a readable safetensors file"):
        load_vae(junk)
    pickled = tmp_path / "objects.pth"
    torch.save({"x": NotATensor()}, pickled)
    with pytest.raises(VAEFileError, match="only weights are loaded"):
        load_vae(pickled)
    ints = tmp_path / "ints.safetensors"
    save_file({"x": torch.zeros(2, dtype=torch.int64)}, str(ints))
    with pytest.raises(VAEFileError, match="missing key"):
        load_vae(ints, config=TINY)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_streams_to_cuda(tmp_path, tiny_sd):
    path = tmp_path / "wan_2.1_vae.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in tiny_sd.items()}, str(path))
    gpu = load_vae(path, device="cuda", config=TINY)
    assert all(t.device.type == "cuda" and t.dtype == torch.float32 for t in gpu.state_dict().values())
    cpu = load_vae(path, config=TINY)
    z = torch.randn(1, 16, 3, 4, 6)
    out = gpu.decode(z.cuda())
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), cpu.decode(z), rtol=0, atol=2e-3)  # TF32 convs on the GPU
    video = torch.rand(1, 3, 9, 32, 48) * 2 - 1
    torch.testing.assert_close(gpu.encode(video).cpu(), cpu.encode(video), rtol=0, atol=2e-2)

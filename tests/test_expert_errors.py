"""Bad input: each error names the file, the key and what to do."""
import json
import shutil

import pytest
import torch

from lingbot_world.loaders.expert_format import ExpertLoadError, ExpertNotFoundError, detect_format
from lingbot_world.loaders.expert_loader import load_expert
from lingbot_world.quant.nf4 import QUANT_STATE_KEY, NF4FormatError
from lingbot_world.loaders.nf4_writer import make_random_nf4_expert, random_expert_state, write_official_expert
from lingbot_world.loaders.safetensors_stream import SafetensorsFormatError, SafetensorsWriter, iter_tensors
from lingbot_world.wan.dit.model import DiTConfig, StateDictMismatch

CFG = DiTConfig.tiny()


class NotATensor:
    """Pickled inside a model.pt, it makes torch.load execute code to rebuild it: must be refused."""

    def __init__(self):
        self.payload = "anything"


@pytest.fixture(scope="module")
def nf4_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("err") / "high_noise_model_bnb_nf4"
    make_random_nf4_expert(CFG, d, device="cpu", seed=1)
    return d


def _copy_with(src_dir, dst_dir, fn=None):
    """Copy an NF4 folder, rewriting model.safetensors through fn(key, tensor) -> (key, tensor) | None."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "quantization_meta.json"):
        shutil.copy(src_dir / name, dst_dir / name)
    with SafetensorsWriter(dst_dir / "model.safetensors") as w:
        for k, t in iter_tensors(src_dir / "model.safetensors"):
            kt = fn(k, t) if fn else (k, t)
            if kt is not None:
                w.add(*kt)
    return dst_dir


def test_missing_folder_and_files(tmp_path, nf4_dir):
    with pytest.raises(ExpertNotFoundError, match="expert path not found: .*nowhere"):
        load_expert(tmp_path / "nowhere", "cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ExpertNotFoundError, match=r"no DiT expert in .*empty: expected model.safetensors.*found \['config.json'\]"):
        load_expert(empty, "cpu")
    official = tmp_path / "low_noise_model"
    write_official_expert(random_expert_state(CFG), CFG, official, max_shard_bytes=200_000)
    shard = sorted(official.glob("diffusion_pytorch_model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard.name}: shard listed in .*index.json is missing; finish the download"):
        load_expert(official, "cpu")
    root = tmp_path / "release"
    (root / "high_noise_model_bnb_nf4").mkdir(parents=True)
    (root / "low_noise_model_bnb_nf4").mkdir()
    with pytest.raises(ExpertLoadError, match="holds several experts .*pass one of these folders"):
        detect_format(root)


def test_config_that_does_not_match(tmp_path, nf4_dir):
    d = _copy_with(nf4_dir, tmp_path / "x_bnb_nf4")
    cfg = json.loads((d / "config.json").read_text())
    cfg["ffn_dim"] = 256
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StateDictMismatch) as e:
        load_expert(d, "cpu")
    msg = str(e.value)
    assert str(d / "model.safetensors") in msg
    assert "shape mismatch for model.safetensors: blocks.0.ffn.0.bias: file (128,) vs model (256,)" in msg
    assert "blocks.0.ffn.0.weight: file (4096, 1) vs model (8192, 1)" in msg  # packed NF4 shapes
    assert "Check that config.json belongs to these weights" in msg


def test_quantized_linear_with_a_missing_piece(tmp_path, nf4_dir):
    gone = "blocks.1.cross_attn.k.weight.absmax"
    d = _copy_with(nf4_dir, tmp_path / "y_bnb_nf4", lambda k, t: None if k == gone else (k, t))
    with pytest.raises(StateDictMismatch, match=f"missing key {gone} \\(a piece of the NF4 linear blocks.1.cross_attn.k; the file is incomplete\\)"):
        load_expert(d, "cpu")
    d2 = _copy_with(nf4_dir, tmp_path / "z_bnb_nf4", lambda k, t: None if k == "head.modulation" else (k, t))
    with pytest.raises(StateDictMismatch, match=r"missing key head.modulation \(model expects shape \(1, 2, 64\)\)"):
        load_expert(d2, "cpu")


def test_truncated_and_corrupted_files(tmp_path, nf4_dir):
    d = _copy_with(nf4_dir, tmp_path / "t_bnb_nf4")
    f = d / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(SafetensorsFormatError, match=r"model.safetensors, key '.*': data ends at byte \d+ but the file has only \d+ bytes: the file is truncated"):
        load_expert(d, "cpu")
    f.write_bytes(raw[:8] + b"#" * 40 + raw[48:])
    with pytest.raises(SafetensorsFormatError, match="model.safetensors: header is not valid JSON .*download or convert it again"):
        load_expert(d, "cpu")
    # A corrupted quant-state blob deep in the file: found mid-load, named, nothing kept.
    bad = "blocks.1.ffn.2.weight." + QUANT_STATE_KEY
    d2 = _copy_with(nf4_dir, tmp_path / "j_bnb_nf4",
                    lambda k, t: (k, torch.tensor(list(b'{"quant_type": "nf4", "blocks'), dtype=torch.uint8)) if k == bad else (k, t))
    with pytest.raises(NF4FormatError, match=r"j_bnb_nf4/model.safetensors: blocks.1.ffn.2: quant_state is not valid JSON"):
        load_expert(d2, "cpu")


def test_unexpected_dtypes(tmp_path, nf4_dir):
    d = _copy_with(nf4_dir, tmp_path / "d_bnb_nf4", lambda k, t: (k, t.to(torch.int64) if k == "blocks.0.norm3.bias" else t))
    with pytest.raises(StateDictMismatch, match=r"blocks.0.norm3.bias has dtype torch.int64; expected a float tensor"):
        load_expert(d, "cpu")
    key = "blocks.0.self_attn.q.weight.absmax"
    d2 = _copy_with(nf4_dir, tmp_path / "e_bnb_nf4", lambda k, t: (k, t.half() if k == key else t))
    with pytest.raises(StateDictMismatch, match=f"{key} has dtype torch.float16, NF4 stores it as torch.uint8"):
        load_expert(d2, "cpu")


def test_pickle_that_needs_code_execution_is_refused(tmp_path, nf4_dir):
    d = tmp_path / "old_bnb_nf4"
    d.mkdir()
    shutil.copy(nf4_dir / "config.json", d)
    sd = dict(iter_tensors(nf4_dir / "model.safetensors"))
    sd["extra"] = NotATensor()
    torch.save(sd, d / "model.pt")
    with pytest.raises(ExpertLoadError, match=r"model.pt: refused. Loading it would need code execution .*weights_only=True"):
        load_expert(d, "cpu")


def test_folder_holding_another_model(tmp_path):
    vae = tmp_path / "vae"
    vae.mkdir()
    torch.save({"encoder.conv1.weight": torch.zeros(2, 3, 3, 3, 3)}, vae / "Wan2.1_VAE.pth")
    with pytest.raises(ExpertNotFoundError, match=r"no DiT expert in .*Wan2.1_VAE.pth.*looks like a VAE"):
        load_expert(vae, "cpu")
    for keys, what in [
        ({"encoder.conv1.weight": torch.zeros(4, 3), "decoder.conv_out.bias": torch.zeros(3)}, "video VAE"),
        ({"token_embedding.weight": torch.zeros(8, 4), "blocks.0.attn.q.weight": torch.zeros(4, 4)}, "T5 text encoder"),
        ({"patch_embedding.weight": torch.zeros(8, 36, 1, 2, 2), "blocks.0.ffn.0.bias": torch.zeros(8)}, "without LingBot's camera layers"),
    ]:
        d = tmp_path / what.split()[-1]
        d.mkdir()
        with SafetensorsWriter(d / "model.safetensors") as w:
            for k, v in keys.items():
                w.add(k, v)
        with pytest.raises(ExpertLoadError, match=f"model.safetensors does not hold a LingBot-World DiT expert: .*{what}"):
            load_expert(d, "cpu")


def test_bad_arguments(nf4_dir):
    with pytest.raises(ValueError, match="mode 'int4'"):  # (fp8 is a mode now: tests/test_fp8_weights.py)
        load_expert(nf4_dir, "cpu", mode="int4")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available.*device='cpu'"):
            load_expert(nf4_dir, "cuda")

"""umT5 file formats: release .pth, ComfyUI fp16 / scaled-fp8 safetensors, detection of wrong files."""
import pickle
import sys

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.t5_files import T5FormatError, inspect_t5_file, load_umt5
from lingbot_world.wan.text.umt5 import UMT5Config, UMT5Encoder

CFG = UMT5Config.tiny(num_layers=3)

_WAN_TO_HF = {
    "norm1": "layer.0.layer_norm", "attn.q": "layer.0.SelfAttention.q", "attn.k": "layer.0.SelfAttention.k",
    "attn.v": "layer.0.SelfAttention.v", "attn.o": "layer.0.SelfAttention.o",
    "pos_embedding.embedding": "layer.0.SelfAttention.relative_attention_bias",
    "norm2": "layer.1.layer_norm", "ffn.gate.0": "layer.1.DenseReluDense.wi_0",
    "ffn.fc1": "layer.1.DenseReluDense.wi_1", "ffn.fc2": "layer.1.DenseReluDense.wo",
}


def hf_name(name: str) -> str:
    if name == "token_embedding.weight":
        return "shared.weight"
    if name == "norm.weight":
        return "encoder.final_layer_norm.weight"
    _, i, rest = name.split(".", 2)
    return f"encoder.block.{i}.{_WAN_TO_HF[rest[: -len('.weight')]]}.weight"


def is_linear(name: str) -> bool:
    return any(p in name for p in (".attn.", ".ffn."))


@pytest.fixture(scope="module")
def reference() -> dict:
    torch.manual_seed(1)
    model = UMT5Encoder(CFG)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_loaded(model: UMT5Encoder, expected: dict, atol=0.0):
    got = model.state_dict()
    assert set(got) == set(expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k].float(), v.float(), rtol=0, atol=atol, msg=k)


def test_release_pth_bf16(tmp_path, reference):
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save({k: v.bfloat16() for k, v in reference.items()}, path)
    info = inspect_t5_file(path)
    assert (info.container, info.naming, info.config) == ("pth", "wan", CFG)
    model = load_umt5(path, "cpu", torch.bfloat16)
    assert_loaded(model, {k: v.bfloat16() for k, v in reference.items()})
    assert model.compute_dtype == torch.bfloat16 and model.token_embedding.weight.dtype == torch.bfloat16
    ids = torch.randint(3, CFG.vocab_size, (1, 9))
    out = model(ids)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()


def test_release_pth_to_float32_copies(tmp_path, reference):
    path = tmp_path / "t5.pth"
    torch.save({k: v.bfloat16() for k, v in reference.items()}, path)
    model = load_umt5(path, "cpu", torch.float32)
    assert model.blocks[0].attn.q.weight.dtype == torch.float32
    assert_loaded(model, {k: v.bfloat16().float() for k, v in reference.items()})


def test_comfy_fp16_safetensors_with_tokenizer_key(tmp_path, reference):
    path = tmp_path / "umt5_xxl_fp16.safetensors"
    tensors = {hf_name(k): v.half() for k, v in reference.items()}
    tensors["spiece_model"] = torch.frombuffer(bytearray(b"not read by the weight loader"), dtype=torch.uint8)
    save_file(tensors, path)
    info = inspect_t5_file(path)
    assert (info.container, info.naming, info.has_spiece_model) == ("safetensors", "hf", True)
    model = load_umt5(path, "cpu", torch.float32)
    # the embedding table stays in its stored fp16 on the CPU; rows are cast on lookup
    assert model.token_embedding.weight.dtype == torch.float16
    assert_loaded(model, {k: v.half().float() for k, v in reference.items()})

    full = load_umt5(path, "cpu", torch.float32, embedding_device=None)
    assert full.token_embedding.weight.dtype == torch.float32
    ids = torch.randint(3, CFG.vocab_size, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids), full(ids))


def test_hf_tied_embedding_duplicate_is_accepted(tmp_path, reference):
    path = tmp_path / "hf_encoder.safetensors"
    tensors = {hf_name(k): v for k, v in reference.items()}
    tensors["encoder.embed_tokens.weight"] = reference["token_embedding.weight"].clone()
    save_file(tensors, path)
    assert_loaded(load_umt5(path, "cpu", torch.float32), reference)


def test_comfy_scaled_fp8(tmp_path, reference):
    path = tmp_path / "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
    tensors, expected = {}, {}
    for k, v in reference.items():
        name = hf_name(k)
        if is_linear(k):
            scale = v.abs().max().float() / 448.0
            w8 = (v / scale).to(torch.float8_e4m3fn)
            tensors[name] = w8
            tensors[name[: -len(".weight")] + ".scale_weight"] = scale.reshape(())
            tensors[name[: -len(".weight")] + ".scale_input"] = torch.ones(())
            expected[k] = (w8.float() * scale).bfloat16()
        else:
            tensors[name] = v.half()
            expected[k] = v.half().bfloat16()
    tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(tensors, path)
    info = inspect_t5_file(path)
    assert info.scaled_fp8 and info.entries["blocks.0.attn.q.weight"].scale_key.endswith(".scale_weight")
    model = load_umt5(path, "cpu", torch.bfloat16)
    expected["token_embedding.weight"] = reference["token_embedding.weight"].half()  # kept as stored
    assert_loaded(model, expected)


def test_release_naming_in_safetensors(tmp_path, reference):
    path = tmp_path / "t5.safetensors"
    save_file(reference, path)
    info = inspect_t5_file(path)
    assert info.naming == "wan"
    assert_loaded(load_umt5(path, "cpu", torch.float32), reference)
    assert info.device_bytes(torch.bfloat16) == 2 * (CFG.num_params() - CFG.vocab_size * CFG.dim)


def test_float16_compute_is_refused(tmp_path, reference):
    path = tmp_path / "t5.safetensors"
    save_file(reference, path)
    with pytest.raises(ValueError, match="float16"):
        load_umt5(path, "cpu", torch.float16)


@pytest.mark.parametrize(
    "keys, looks_like",
    [
        ({"blocks.0.self_attn.q.weight": (4, 4), "head.modulation": (1, 2, 4), "patch_embedding.weight": (4, 4)},
         "DiT expert"),
        ({"blocks.0.self_attn.q.weight": (8, 1), "blocks.0.self_attn.q.weight.quant_state.bitsandbytes__nf4": (3,)},
         "NF4"),
        ({"decoder.middle.0.residual.0.gamma": (4, 1, 1, 1), "encoder.conv1.weight": (4, 3, 3, 3, 3)}, "Wan VAE"),
        ({"text_model.embeddings.token_embedding.weight": (4, 4)}, "CLIP"),
        ({"foo": (2,), "bar": (3,)}, "unknown model"),
    ],
)
def test_wrong_files_say_what_they_look_like(tmp_path, keys, looks_like):
    path = tmp_path / "wrong.safetensors"
    save_file({k: torch.zeros(s) for k, s in keys.items()}, path)
    with pytest.raises(T5FormatError, match=f"not a umT5-XXL text encoder.*{looks_like}"):
        inspect_t5_file(path)


def test_t5_v11_is_rejected(tmp_path, reference):
    path = tmp_path / "t5xxl_fp16.safetensors"
    tensors = {hf_name(k): v for k, v in reference.items()
               if not ("pos_embedding" in k and not k.startswith("blocks.0."))}
    save_file(tensors, path)
    with pytest.raises(T5FormatError, match="T5 v1.1"):
        inspect_t5_file(path)


def test_missing_tensor_and_bad_shape(tmp_path, reference):
    path = tmp_path / "t5.safetensors"
    save_file({k: v for k, v in reference.items() if k != "blocks.1.ffn.fc2.weight"}, path)
    with pytest.raises(T5FormatError, match="missing.*blocks.1.ffn.fc2.weight"):
        inspect_t5_file(path)
    bad = dict(reference)
    bad["blocks.2.attn.o.weight"] = torch.zeros(3, 3)
    save_file(bad, path)
    with pytest.raises(T5FormatError, match=r"blocks.2.attn.o.weight has shape \[3, 3\]"):
        inspect_t5_file(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inspect_t5_file(tmp_path / "nope.pth")
    legacy = tmp_path / "legacy.pth"
    legacy.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(T5FormatError, match="neither a torch zip"):
        inspect_t5_file(legacy)
    evil = tmp_path / "evil.pth"
    torch.save({"x": torch.zeros(1), "obj": object()}, evil)
    with pytest.raises(T5FormatError, match="weights-only"):
        inspect_t5_file(evil)


def _rss_file_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page accounting via /proc (Linux)")
def test_converted_tensors_leave_the_pth_pages_behind(tmp_path):
    """When tensors are converted (the GPU path, or another dtype), pages of the mmap'ed .pth that were read
    are dropped again, so host RAM in flight stays at one tensor instead of growing to the file size."""
    cfg = UMT5Config.tiny(dim=512, num_heads=8, head_dim=64, ffn_dim=2048, num_layers=8)
    path = tmp_path / "t5.pth"
    torch.save({k: v.bfloat16() for k, v in UMT5Encoder(cfg).state_dict().items()}, path)
    size = path.stat().st_size
    info = inspect_t5_file(path)  # keeps the mapping alive, as during a load
    before = _rss_file_bytes()
    model = load_umt5(info, "cpu", torch.float32)
    grown = _rss_file_bytes() - before
    print(f"file {size / 2**20:.0f} MiB, file-backed RSS growth after a converting load {grown / 2**20:.1f} MiB")
    assert model.blocks[7].ffn.fc2.weight.dtype == torch.float32
    assert grown < size / 4

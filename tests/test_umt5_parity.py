"""umT5 encoder maths: parity with transformers' UMT5EncoderModel, release key names, meta build."""
import torch
import pytest

from lingbot_world.loaders.t5_files import hf_to_wan_key
from lingbot_world.wan.text.umt5 import UMT5Config, UMT5Encoder, relative_position_bucket

transformers = pytest.importorskip("transformers")


def hf_model(cfg: UMT5Config):
    hf_cfg = transformers.UMT5Config(
        vocab_size=cfg.vocab_size, d_model=cfg.dim, d_kv=cfg.head_dim, d_ff=cfg.ffn_dim,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.num_buckets,
        relative_attention_max_distance=cfg.max_distance, feed_forward_proj="gated-gelu", dropout_rate=0.0,
        layer_norm_epsilon=cfg.eps,
    )
    model = transformers.UMT5EncoderModel(hf_cfg).eval()
    with torch.no_grad():  # norms are initialised to 1; perturb them so their weights are exercised too
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def to_release(hf_state: dict) -> dict:
    out = {}
    for k, v in hf_state.items():
        name = hf_to_wan_key(k)
        assert name is not None, k
        out[name] = v
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_parity_with_transformers_umt5_float32():
    cfg = UMT5Config.tiny(num_layers=3)
    ref = hf_model(cfg)
    ours = UMT5Encoder(cfg).eval()
    ours.load_state_dict(to_release(ref.state_dict()), strict=True)

    ids = torch.randint(3, cfg.vocab_size, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, 23:] = 0  # second prompt is padded after 23 tokens
    ids[1, 23:] = 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    err = rel_err(got[mask.bool()], want[mask.bool()])
    print(f"umT5 tiny float32 relative error vs transformers: {err:.3e}")
    assert err <= 1e-5


def test_trimmed_encode_equals_padded_rows():
    cfg = UMT5Config.tiny()
    model = UMT5Encoder(cfg).eval()
    ids = torch.zeros(1, 64, dtype=torch.long)
    ids[0, :11] = torch.randint(3, cfg.vocab_size, (11,))
    mask = torch.zeros_like(ids)
    mask[0, :11] = 1
    with torch.no_grad():
        padded = model(ids, mask)[0, :11]
    (trimmed,) = model.encode(ids, mask)
    assert trimmed.shape == (11, cfg.dim)
    torch.testing.assert_close(trimmed, padded, rtol=1e-5, atol=1e-6)


def test_relative_buckets_match_transformers():
    rel = torch.arange(-300, 301)[None, :]
    got = relative_position_bucket(rel, 32, 128)
    attn = transformers.models.umt5.modeling_umt5.UMT5Attention(
        transformers.UMT5Config(relative_attention_num_buckets=32, relative_attention_max_distance=128),
        has_relative_attention_bias=True,
    )
    want = attn._relative_position_bucket(rel)
    assert torch.equal(got, want)
    assert got[0, 300 + 7].item() == 16 + 7 and got[0, 300 - 7].item() == 7  # exact range, both halves
    assert got.max().item() == 31


def test_xxl_on_meta_has_release_keys_and_no_storage():
    cfg = UMT5Config.xxl()
    model = UMT5Encoder.on_meta(cfg)
    sd = model.state_dict()
    assert len(sd) == 242
    assert all(t.is_meta for t in sd.values())
    assert sum(t.numel() for t in sd.values()) == 5_680_910_336 == cfg.num_params()
    assert sd["token_embedding.weight"].shape == (256384, 4096)
    assert sd["blocks.23.ffn.gate.0.weight"].shape == (10240, 4096)
    assert sd["blocks.0.ffn.fc2.weight"].shape == (4096, 10240)
    assert sd["blocks.7.pos_embedding.embedding.weight"].shape == (32, 64)
    for i in range(24):
        for part in ("norm1", "attn.q", "attn.k", "attn.v", "attn.o", "norm2", "ffn.gate.0", "ffn.fc1", "ffn.fc2",
                     "pos_embedding.embedding"):
            assert f"blocks.{i}.{part}.weight" in sd
    assert "norm.weight" in sd


def test_bf16_error_is_that_of_transformers_in_bf16():
    """In bf16 (the release dtype) our rounding should be no worse than transformers' own bf16 run."""
    cfg = UMT5Config.tiny(num_layers=3)
    ref = hf_model(cfg)
    ours = UMT5Encoder(cfg).eval()
    ours.load_state_dict(to_release(ref.state_dict()))
    ids = torch.randint(3, cfg.vocab_size, (1, 48))
    with torch.no_grad():
        exact = ref(input_ids=ids).last_hidden_state
        hf_bf16 = ref.to(torch.bfloat16)(input_ids=ids).last_hidden_state
        ours_bf16 = ours.to(torch.bfloat16)(ids)
    e_ours, e_hf = rel_err(ours_bf16, exact), rel_err(hf_bf16, exact)
    print(f"bf16 relative error vs float32: ours {e_ours:.3e}, transformers {e_hf:.3e}")
    assert ours_bf16.dtype == torch.bfloat16
    assert e_ours <= 2 * e_hf + 1e-3

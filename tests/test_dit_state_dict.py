"""The DiT's state dict is the released expert's (spec §2.2, §10.1), loading fails loudly on a mismatch, and
DiTConfig reads a released-style config.json (spec §1.1)."""
from __future__ import annotations

import json

import pytest
import torch

from lingbot_world.wan.dit.model import (
    DiTConfig,
    StateDictMismatch,
    WanDiT,
    check_state_dict_shapes,
    load_dit_state_dict,
)

D, FFN, TEXT, FREQ, LAYERS = 5120, 13824, 4096, 256, 40


def released_shapes() -> dict[str, tuple[int, ...]]:
    """Key -> shape of one released expert, written out from the spec's table (not from the model)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.weight"] = (out, inp)
        shapes[f"{name}.bias"] = (out,)

    shapes["patch_embedding.weight"] = (D, 36, 1, 2, 2)
    shapes["patch_embedding.bias"] = (D,)
    linear("patch_embedding_wancamctrl", D, 1536)
    linear("c2ws_hidden_states_layer1", D, D)
    linear("c2ws_hidden_states_layer2", D, D)
    linear("text_embedding.0", D, TEXT)
    linear("text_embedding.2", D, D)
    linear("time_embedding.0", D, FREQ)
    linear("time_embedding.2", D, D)
    linear("time_projection.1", 6 * D, D)
    for n in range(LAYERS):
        b = f"blocks.{n}"
        shapes[f"{b}.modulation"] = (1, 6, D)
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                linear(f"{b}.{attn}.{proj}", D, D)
            shapes[f"{b}.{attn}.norm_q.weight"] = (D,)
            shapes[f"{b}.{attn}.norm_k.weight"] = (D,)
        shapes[f"{b}.norm3.weight"] = (D,)
        shapes[f"{b}.norm3.bias"] = (D,)
        linear(f"{b}.ffn.0", FFN, D)
        linear(f"{b}.ffn.2", D, FFN)
        for cam in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
            linear(f"{b}.{cam}", D, D)
    shapes["head.modulation"] = (1, 2, D)
    linear("head.head", 64, D)
    return shapes


@pytest.fixture(scope="module")
def full_meta() -> WanDiT:
    return WanDiT(DiTConfig(), device="meta")


def test_full_size_keys_and_shapes(full_meta):
    ours = {k: tuple(v.shape) for k, v in full_meta.state_dict().items()}
    released = released_shapes()
    assert len(released) == 1421
    assert len(ours) == 1421
    assert sorted(set(released) - set(ours)) == []  # every released key present
    assert sorted(set(ours) - set(released)) == []  # no extra keys (e.g. no RoPE buffer)
    assert ours == released
    # A few names straight from the spec's table.
    assert ours["patch_embedding_wancamctrl.weight"] == (5120, 1536)
    assert ours["blocks.39.cam_shift_layer.bias"] == (5120,)
    assert ours["head.modulation"] == (1, 2, 5120)
    assert ours["time_projection.1.weight"] == (30720, 5120)
    assert ours["blocks.0.self_attn.norm_q.weight"] == (5120,)
    assert "blocks.0.norm1.weight" not in ours and "head.norm.weight" not in ours  # non-affine norms


def test_full_size_parameter_counts(full_meta):
    total = sum(p.numel() for p in full_meta.parameters())
    camera = sum(
        p.numel()
        for n, p in full_meta.named_parameters()
        if any(s.startswith(("patch_embedding_wancamctrl", "c2ws_hidden_states_layer", "cam_")) for s in n.split("."))
    )
    assert total == 18_544_332_864
    assert camera == 4_255_431_680
    assert total - camera == 14_288_901_184  # plain Wan2.2 expert
    assert all(p.is_meta for p in full_meta.parameters())  # nothing allocated


def test_check_shapes_accepts_the_released_table(full_meta):
    check_state_dict_shapes(full_meta, released_shapes())


def tiny_state_dict() -> tuple[DiTConfig, dict[str, torch.Tensor]]:
    cfg = DiTConfig.tiny()
    gen = torch.Generator().manual_seed(3)
    sd = {k: torch.randn(v.shape, generator=gen) for k, v in WanDiT(cfg, device="meta").state_dict().items()}
    return cfg, sd


def test_load_into_meta_model_and_run():
    cfg, sd = tiny_state_dict()
    model = WanDiT(cfg, device="meta")
    load_dit_state_dict(model, sd)
    assert not any(p.is_meta for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    out = model(torch.randn(1, 16, 2, 4, 4), torch.tensor([500]), torch.randn(1, 3, cfg.text_dim), torch.randn(1, 20, 2, 4, 4))
    assert out.shape == (1, 16, 2, 4, 4) and torch.isfinite(out).all()


def test_missing_key_is_named():
    cfg, sd = tiny_state_dict()
    del sd["blocks.1.cam_scale_layer.weight"]
    with pytest.raises(StateDictMismatch, match=r"missing key blocks\.1\.cam_scale_layer\.weight.*\(64, 64\)"):
        load_dit_state_dict(WanDiT(cfg), sd, source="expert.safetensors")


def test_wrong_shape_names_key_and_both_shapes():
    cfg, sd = tiny_state_dict()
    sd["blocks.0.self_attn.q.weight"] = torch.zeros(64, 63)
    with pytest.raises(StateDictMismatch) as err:
        load_dit_state_dict(WanDiT(cfg), sd, source="expert.safetensors")
    msg = str(err.value)
    assert "expert.safetensors" in msg
    assert "blocks.0.self_attn.q.weight" in msg and "(64, 63)" in msg and "(64, 64)" in msg


def test_unexpected_key_is_named():
    cfg, sd = tiny_state_dict()
    sd["img_emb.proj.0.weight"] = torch.zeros(3)
    with pytest.raises(StateDictMismatch, match=r"unexpected key img_emb\.proj\.0\.weight"):
        load_dit_state_dict(WanDiT(cfg), sd)
    assert issubclass(StateDictMismatch, ValueError)


# ---- config.json --------------------------------------------------------------------------------------
RELEASED_CONFIG = """{
  "_class_name": "WanModel",
  "_diffusers_version": "0.33.0.dev0",
  "dim": 5120,
  "eps": 1e-06,
  "ffn_dim": 13824,
  "freq_dim": 256,
  "in_dim": 36,
  "model_type": "i2v",
  "num_heads": 40,
  "num_layers": 40,
  "out_dim": 16,
  "text_len": 512
}"""


def test_from_json_released_config():
    cfg = DiTConfig.from_json(json.loads(RELEASED_CONFIG))
    assert cfg == DiTConfig()
    assert cfg.text_dim == 4096 and cfg.patch_size == (1, 2, 2) and cfg.head_dim == 128
    # Ignored-for-config options, if a file carries them with the built-in values, are accepted.
    extra = {**json.loads(RELEASED_CONFIG), "qk_norm": True, "cross_attn_norm": True, "window_size": [-1, -1]}
    assert DiTConfig.from_json(extra) == DiTConfig()
    assert DiTConfig.from_json(DiTConfig.tiny().to_json()) == DiTConfig.tiny()


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"model_type": "t2v"}, "model_type"),
        ({"dim": 5121}, "divisible"),
        ({"num_heads": 0}, "num_heads"),
        ({"dim": "5120"}, "dim"),
        ({"num_layers": -1}, "num_layers"),
        ({"num_layers": True}, "num_layers"),
        ({"in_dim": 16}, "in_dim"),
        ({"eps": 0}, "eps"),
        ({"patch_size": [1, 4, 4]}, "patch_size"),
        ({"freq_dim": 255}, "freq_dim"),
        ({"dim": 120, "num_heads": 40}, "head_dim"),
        ({"qk_norm": False}, "qk_norm"),
        ({"window_size": [16, 16]}, "window_size"),
    ],
)
def test_from_json_rejects_nonsense(change, needle):
    with pytest.raises(ValueError, match=needle):
        DiTConfig.from_json({**json.loads(RELEASED_CONFIG), **change})


def test_from_json_rejects_non_object():
    with pytest.raises(ValueError, match="JSON object"):
        DiTConfig.from_json([5120, 40])

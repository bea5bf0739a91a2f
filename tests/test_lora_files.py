"""LoRA files (loaders/lora_files.py): key formats, alpha/rank, refusals, the match report.

The diffusers and musubi key mappings are checked against diffusers' own converters
(`_convert_non_diffusers_wan_lora_to_diffusers`, `_convert_musubi_wan_lora_to_diffusers`), an independent
implementation: whichever format a LoRA comes in, the weight differences it yields on the DiT must be the same.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.lora_files import (
    KeyResolver,
    LoraFileError,
    dit_weight_shapes,
    load_lora,
    lora_hooks,
    parse_lora,
    read_lora_file,
)
from lingbot_world.quant.lora import lora_scale
from lingbot_world.quant.nf4 import nf4_linear_names
from lingbot_world.wan.dit.model import DiTConfig

from tests.conftest import load_sibling

CFG = DiTConfig.tiny(dim=64, ffn_dim=128, num_heads=4, num_layers=2, text_dim=32)
SHAPES = dit_weight_shapes(CFG)
LINEARS = nf4_linear_names(CFG.num_layers)
WAN_LINEARS = [n for n in LINEARS if "cam" not in n and "c2ws" not in n]  # the layers Wan LoRAs train


def _comfy_lora(names=WAN_LINEARS, rank=4, alpha=2.0, seed=0, down="lora_down", up="lora_up") -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for n in names:
        out_f, in_f = SHAPES[f"{n}.weight"]
        sd[f"diffusion_model.{n}.{down}.weight"] = torch.randn(rank, in_f, generator=g)
        sd[f"diffusion_model.{n}.{up}.weight"] = torch.randn(out_f, rank, generator=g)
        if alpha is not None:
            sd[f"diffusion_model.{n}.alpha"] = torch.tensor(alpha)
    return sd


def _deltas(lora_set, strength=1.0) -> dict[str, torch.Tensor]:
    out = {}
    for target, w in lora_set.weights.items():
        if w.low_rank:
            out[target] = lora_scale(strength, w.alpha, w.rank) * w.up.float() @ w.down.float()
        else:
            out[target] = strength * w.diff.float()
    return out


def _assert_same_deltas(a, b):
    da, db = _deltas(a), _deltas(b)
    assert da.keys() == db.keys()
    for k in da:
        torch.testing.assert_close(da[k], db[k], rtol=1e-5, atol=1e-5, msg=k)


# ---- formats -----------------------------------------------------------------------------------------------------
def test_comfyui_format_with_alpha():
    sd = _comfy_lora(alpha=2.0, rank=4)
    lora = parse_lora(sd, SHAPES, "c")
    assert lora.matched == lora.modules == len(WAN_LINEARS) and not lora.unmatched
    assert lora.formats == ["ComfyUI"]
    w = lora.weights["blocks.1.ffn.0.weight"]
    assert w.alpha == 2.0 and w.rank == 4 and lora_scale(1.0, w.alpha, w.rank) == 0.5
    assert "of 26 LoRA modules matched" in lora.report() and "rank 4" in lora.report()


def test_diffusers_format_matches_diffusers_converter():
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers

    sd = _comfy_lora(alpha=None, down="lora_A", up="lora_B")  # diffusers' converter folds no alpha here
    diffusers_sd = _convert_non_diffusers_wan_lora_to_diffusers(dict(sd))
    assert all(k.startswith("transformer.") for k in diffusers_sd)
    a, b = parse_lora(sd, SHAPES, "comfy"), parse_lora(diffusers_sd, SHAPES, "diffusers")
    assert b.formats == ["diffusers"] and b.matched == len(WAN_LINEARS)
    _assert_same_deltas(a, b)


def test_musubi_kohya_format_matches_diffusers_converter():
    from diffusers.loaders.lora_conversion_utils import _convert_musubi_wan_lora_to_diffusers

    block_linears = [n for n in WAN_LINEARS if n.startswith("blocks.")]  # what diffusers' musubi converter knows
    comfy = _comfy_lora(block_linears, alpha=8.0, rank=4, seed=3)
    musubi = {k.replace("diffusion_model.", "lora_unet_").replace(".", "_").replace("_lora_down_weight", ".lora_down.weight")
              .replace("_lora_up_weight", ".lora_up.weight").replace("_alpha", ".alpha"): v for k, v in comfy.items()}
    assert "lora_unet_blocks_0_self_attn_q.lora_down.weight" in musubi
    ours = parse_lora(musubi, SHAPES, "musubi")
    assert ours.formats == ["kohya"] and ours.matched == len(block_linears)
    _assert_same_deltas(ours, parse_lora(comfy, SHAPES, "comfy"))
    # diffusers folds alpha/rank into the factors; the resulting differences must be ours
    theirs = parse_lora(_convert_musubi_wan_lora_to_diffusers(dict(musubi)), SHAPES, "converted")
    _assert_same_deltas(ours, theirs)


def test_every_diffusers_linear_name_resolves_to_the_released_one():
    """Module names of diffusers' WanTransformer3DModel (built tiny) against tests/dit_key_map (the parity test's
    independent released->diffusers table)."""
    from diffusers import WanTransformer3DModel

    key_map = load_sibling("dit_key_map")
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=36,
                                  out_channels=16, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2)
    resolver = KeyResolver(SHAPES)
    diffusers_linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for name in WAN_LINEARS:
        theirs = key_map.to_diffusers_key(f"{name}.weight")[: -len(".weight")]
        assert theirs in diffusers_linears, theirs
        assert resolver.resolve("transformer." + theirs) == (name, "diffusers")
        assert resolver.resolve("lora_unet_" + theirs.replace(".", "_"))[0] == name  # kohya names of diffusers modules
        assert resolver.resolve("lora_unet_" + name.replace(".", "_")) == (name, "kohya")
        assert resolver.resolve("diffusion_model." + name) == (name, "ComfyUI")


def test_peft_and_unprefixed_keys_and_wan_fun_double_underscore():
    sd = _comfy_lora(["blocks.0.self_attn.q"], alpha=None, down="lora_A", up="lora_B")
    peft = {k.replace("diffusion_model.", "base_model.model."): v for k, v in sd.items()}
    bare = {k.replace("diffusion_model.", ""): v for k, v in sd.items()}
    fun = {"lora_unet__blocks_0_self_attn_q.lora_down.weight": sd["diffusion_model.blocks.0.self_attn.q.lora_A.weight"],
           "lora_unet__blocks_0_self_attn_q.lora_up.weight": sd["diffusion_model.blocks.0.self_attn.q.lora_B.weight"]}
    ref = parse_lora(sd, SHAPES)
    for other in (peft, bare, fun):
        _assert_same_deltas(ref, parse_lora(other, SHAPES))


def test_differences_of_plain_tensors():
    sd = {"diffusion_model.blocks.0.norm3.diff": torch.ones(64), "diffusion_model.head.head.diff_b": torch.ones(64),
          "diffusion_model.blocks.1.modulation.diff": torch.ones(1, 6, 64),
          "diffusion_model.blocks.0.ffn.0.diff_b": torch.ones(128)}
    lora = parse_lora(sd, SHAPES)
    assert set(lora.weights) == {"blocks.0.norm3.weight", "head.head.bias", "blocks.1.modulation",
                                 "blocks.0.ffn.0.bias"}
    hooks, plain = lora_hooks([(lora, 0.5)], LINEARS)
    assert set(plain) == {"blocks.0.norm3.weight", "blocks.1.modulation"}
    torch.testing.assert_close(plain["blocks.1.modulation"](torch.zeros(1, 6, 64)), torch.full((1, 6, 64), 0.5))
    # bias differences of linears are an output term of the linear's hook (they survive block swap)
    assert set(hooks) == {"head.head", "blocks.0.ffn.0"} and hooks["head.head"].up is None
    torch.testing.assert_close(hooks["blocks.0.ffn.0"].bias, torch.full((128,), 0.5))


def test_strength_zero_gives_no_hooks():
    lora = parse_lora(_comfy_lora(), SHAPES)
    assert lora_hooks([(lora, 0.0)], LINEARS) == ({}, {})


# ---- refusals and reports ----------------------------------------------------------------------------------------
def test_pickle_and_non_safetensors_are_refused(tmp_path):
    for name in ("lora.pt", "lora.ckpt", "lora.bin", "lora.pth"):
        p = tmp_path / name
        p.write_bytes(b"\x80\x04not really")
        with pytest.raises(LoraFileError, match="pickle"):
            read_lora_file(p)
    with pytest.raises(LoraFileError, match="not a .safetensors"):
        read_lora_file(tmp_path / "lora.gguf")
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"garbage")
    with pytest.raises(LoraFileError, match="broken.safetensors: not a readable safetensors"):
        read_lora_file(bad)
    with pytest.raises(LoraFileError, match="not found"):
        read_lora_file(tmp_path / "missing.safetensors")


def test_lora_for_another_model_names_first_key_and_both_shapes(tmp_path):
    sd = _comfy_lora(["blocks.0.self_attn.q"])
    sd["diffusion_model.blocks.0.self_attn.q.lora_down.weight"] = torch.zeros(4, 1536)  # a Wan 1.3B-wide LoRA
    p = tmp_path / "wan13b.safetensors"
    save_file(sd, str(p))
    with pytest.raises(LoraFileError) as e:
        load_lora(p, SHAPES)
    msg = str(e.value)
    assert "wan13b.safetensors" in msg and "diffusion_model.blocks.0.self_attn.q" in msg
    assert "(4, 1536)" in msg and "(64, 64)" in msg and "another model" in msg


def test_keys_matching_nothing_are_refused_and_partial_matches_reported():
    sd = _comfy_lora(["blocks.0.self_attn.q"])
    other = {k.replace("diffusion_model.blocks.0.self_attn.q", "lora_te_text_model_encoder_layers_0_mlp_fc1"): v
             for k, v in sd.items()}
    with pytest.raises(LoraFileError, match="none of its 1 LoRA modules match.*lora_te_text_model"):
        parse_lora(other, SHAPES, "sdxl")
    both = {**sd, **other, "diffusion_model.blocks.7.self_attn.q.lora_A.weight": torch.zeros(4, 64),
            "diffusion_model.blocks.7.self_attn.q.lora_B.weight": torch.zeros(64, 4)}
    lora = parse_lora(both, SHAPES, "mixed")
    assert (lora.matched, lora.modules) == (1, 3)
    report = lora.report()
    assert "mixed: 1 of 3 LoRA modules matched" in report and "2 did not match" in report
    assert "blocks.7.self_attn.q" in report and "lora_te_text_model" in report


def test_unsupported_adapter_kinds_and_incomplete_pairs_are_named():
    sd = _comfy_lora(["blocks.0.ffn.0"])
    with pytest.raises(LoraFileError, match=r"diffusion_model\.blocks\.0\.ffn\.0\.dora_scale is a DoRA adapter.*LoraLoaderModelOnly"):
        parse_lora({**sd, "diffusion_model.blocks.0.ffn.0.dora_scale": torch.ones(128, 1)}, SHAPES)
    with pytest.raises(LoraFileError, match="LoHa"):
        parse_lora({"diffusion_model.blocks.0.ffn.0.hada_w1_a": torch.ones(1)}, SHAPES)
    del sd["diffusion_model.blocks.0.ffn.0.lora_up.weight"]
    with pytest.raises(LoraFileError, match="blocks.0.ffn.0 has a LoRA down weight but no up weight"):
        parse_lora(sd, SHAPES)
    with pytest.raises(LoraFileError, match="no LoRA weights found"):
        parse_lora({"something": torch.zeros(1)}, SHAPES)


def test_file_round_trip(tmp_path):
    sd = _comfy_lora(alpha=4.0, seed=9)
    p = tmp_path / "style.safetensors"
    save_file(sd, str(p))
    _assert_same_deltas(load_lora(p, SHAPES), parse_lora(sd, SHAPES))

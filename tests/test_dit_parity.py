"""Parity of WanDiT (no camera) against an independent implementation: diffusers' WanTransformer3DModel.

Both models get the same random weights (every parameter, norms and modulation included) through the
released -> diffusers key map, and the same inputs: batch 2, different timesteps and text, a non-square
multi-frame latent, text zero-padded to 512 rows on both sides (the reference pads and never masks).
"""
from __future__ import annotations

import math

import pytest
import torch

from lingbot_world.wan.dit.model import DiTConfig, WanDiT, pad_context

from tests.conftest import load_sibling

diffusers = pytest.importorskip("diffusers")
from diffusers import WanTransformer3DModel  # noqa: E402


key_map = load_sibling("dit_key_map")

CFG = DiTConfig.tiny()  # dim 64 = 4 heads x 16, 2 layers, ffn 128, text_dim 32, freq_dim 32



def diffusers_twin(cfg: DiTConfig) -> WanTransformer3DModel:
    """The Wan2.2 I2V transformer as diffusers configures it (no image_dim: no CLIP img_emb)."""
    return WanTransformer3DModel(
        patch_size=cfg.patch_size,
        num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.head_dim,
        in_channels=cfg.in_dim,
        out_channels=cfg.out_dim,
        text_dim=cfg.text_dim,
        freq_dim=cfg.freq_dim,
        ffn_dim=cfg.ffn_dim,
        num_layers=cfg.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=cfg.eps,
        image_dim=None,
        added_kv_proj_dim=None,
    ).eval()


def float64_sinusoid(dim: int, t: torch.Tensor) -> torch.Tensor:
    """The reference's timestep sinusoid (spec §2.4 step 3): float64, [cos, sin], w_k = 10000^(-k/half)."""
    half = dim // 2
    k = torch.arange(half, dtype=torch.float64)
    angle = t.to(torch.float64)[:, None] * torch.exp(-math.log(10000.0) * k / half)[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=1).float()


def test_key_map_covers_both_models():
    ours = WanDiT(CFG, device="meta").state_dict()
    theirs = diffusers_twin(CFG).state_dict()
    camera = [k for k in ours if key_map.to_diffusers_key(k) is None]
    # LingBot's camera layers have no diffusers counterpart: 3 top-level linears + 4 per block (weight, bias).
    assert len(camera) == 2 * (3 + 4 * CFG.num_layers)
    mapped = {key_map.to_diffusers_key(k): tuple(v.shape) for k, v in ours.items() if k not in camera}
    assert len(mapped) == len(ours) - len(camera)  # no two keys collide
    assert mapped == {k: tuple(v.shape) for k, v in theirs.items()}
    with pytest.raises(KeyError, match="blocks.0.mystery"):
        key_map.to_diffusers_key("blocks.0.mystery.weight")


def test_matches_diffusers_wan_transformer(randomise_dit):
    gen = torch.Generator().manual_seed(1234)
    ours = WanDiT(CFG).eval()
    randomise_dit(ours, gen)
    theirs = diffusers_twin(CFG)
    theirs.load_state_dict(key_map.to_diffusers_state_dict(ours.state_dict()), strict=True)

    b, f, h, w = 2, 3, 6, 10  # token grid 3 x 3 x 5: non-square, multi-frame
    x = torch.randn(b, 16, f, h, w, generator=gen)
    y = torch.randn(b, 20, f, h, w, generator=gen)
    t = torch.tensor([999, 37])
    context = [torch.randn(7, CFG.text_dim, generator=gen), torch.randn(19, CFG.text_dim, generator=gen)]

    with torch.no_grad():
        out = ours(x, t, context, y)
        ref = theirs(
            torch.cat([x, y], dim=1), t, pad_context(context, CFG.text_len), return_dict=False
        )[0]

    assert out.shape == ref.shape == (b, 16, f, h, w)
    assert out.dtype == torch.float32
    rel = ((out - ref).norm() / ref.norm()).item()
    print(f"diffusers {diffusers.__version__}: relative error {rel:.3e}")
    assert rel <= 1e-5, f"relative error {rel:.3e} vs diffusers {diffusers.__version__}"
    # The two samples really differ (different t and text), so a batch mix-up would show.
    assert (ref[0] - ref[1]).norm() > 0.1 * ref.norm()

    # diffusers builds the timestep sinusoid in float32; the reference (and we) use float64. That is the
    # whole remaining difference: give diffusers the float64 sinusoid and the outputs agree to rounding.
    theirs.condition_embedder.timesteps_proj.forward = lambda steps: float64_sinusoid(CFG.freq_dim, steps)
    with torch.no_grad():
        ref64 = theirs(torch.cat([x, y], dim=1), t, pad_context(context, CFG.text_len), return_dict=False)[0]
    rel64 = ((out - ref64).norm() / ref64.norm()).item()
    print(f"diffusers {diffusers.__version__} with a float64 sinusoid: relative error {rel64:.3e}")
    assert rel64 <= 1e-6

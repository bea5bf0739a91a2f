"""LingBot camera path of the DiT (spec §2.4 steps 5-6, §3): zero weights are a no-op, the per-block FiLM
computed by hand, and the token <-> Plücker-pixel packing index."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from lingbot_world.wan.dit.model import CAMERA_CHANNELS, DiTConfig, WanDiT

CFG = DiTConfig.tiny()
CAMERA_PREFIXES = ("patch_embedding_wancamctrl", "c2ws_hidden_states_layer", "cam_")


def is_camera_param(name: str) -> bool:
    return any(part.startswith(CAMERA_PREFIXES) for part in name.split("."))



def make_inputs(gen: torch.Generator, b: int = 2, f: int = 2, h: int = 4, w: int = 6):
    x = torch.randn(b, 16, f, h, w, generator=gen)
    y = torch.randn(b, 20, f, h, w, generator=gen)
    t = torch.tensor([900, 120][:b])
    context = torch.randn(b, 9, CFG.text_dim, generator=gen)
    camera = torch.randn(b, CAMERA_CHANNELS, f, h, w, generator=gen)
    return x, t, context, y, camera


@pytest.fixture()
def model(randomise_dit) -> WanDiT:
    m = WanDiT(CFG).eval()
    randomise_dit(m, torch.Generator().manual_seed(7))
    return m


def test_camera_changes_the_output(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(x, t, ctx, y)
        with_cam = model(x, t, ctx, y, camera=cam)
    assert (with_cam - plain).norm() > 0.05 * plain.norm()


def test_all_camera_weights_zero_is_identity(model):
    with torch.no_grad():
        names = [n for n, p in model.named_parameters() if is_camera_param(n)]
        assert len(names) == 2 * (3 + 4 * CFG.num_layers)
        for n, p in model.named_parameters():
            if is_camera_param(n):
                p.zero_()
        x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(2))
        plain = model(x, t, ctx, y)
        with_cam = model(x, t, ctx, y, camera=cam)
    assert torch.equal(with_cam, plain)


def test_zero_scale_and_shift_layers_suffice(model):
    # s = cam_scale_layer(g), b = cam_shift_layer(g): zero both and (1 + 0) * x + 0 = x, whatever g is.
    with torch.no_grad():
        for blk in model.blocks:
            for layer in (blk.cam_scale_layer, blk.cam_shift_layer):
                layer.weight.zero_()
                layer.bias.zero_()
        x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(3))
        assert model.camera_tokens(cam, torch.float32).abs().max() > 0.1  # the rest of the path is live
        assert torch.equal(model(x, t, ctx, y, camera=cam), model(x, t, ctx, y))


def _capture_norm3_input(block):
    """Pre-hook on norm3: its input is x right after the camera FiLM (before cross-attention)."""
    seen = []
    handle = block.norm3.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    return seen, handle


def test_film_step_by_hand(model):
    gen = torch.Generator().manual_seed(4)
    x, t, ctx, y, cam = make_inputs(gen)
    block = model.blocks[0]  # its input is the same with and without a camera
    seen, handle = _capture_norm3_input(block)
    try:
        with torch.no_grad():
            model(x, t, ctx, y)  # no camera: norm3 sees x after the self-attention residual
            model(x, t, ctx, y, camera=cam)
    finally:
        handle.remove()
    x_attn, x_film = seen

    # Camera tokens by hand from the raw weights (spec §2.4 step 5).
    def lin(layer, v):
        return v @ layer.weight.T + layer.bias

    with torch.no_grad():
        tokens = rearrange(cam, "b c f (h qy) (w qx) -> b (f h w) (c qy qx)", qy=2, qx=2)
        p = lin(model.patch_embedding_wancamctrl, tokens)
        c = p + lin(model.c2ws_hidden_states_layer2, F.silu(lin(model.c2ws_hidden_states_layer1, p)))
        g = lin(block.cam_injector_layer2, F.silu(lin(block.cam_injector_layer1, c))) + c
        s = lin(block.cam_scale_layer, g)
        b = lin(block.cam_shift_layer, g)
        expected = (1 + s) * x_attn + b
        torch.testing.assert_close(model.camera_tokens(cam, torch.float32), c, rtol=1e-5, atol=1e-5)

    assert x_film.shape == (2, 2 * 2 * 3, CFG.dim)
    torch.testing.assert_close(x_film, expected, rtol=1e-5, atol=1e-5)
    assert (x_film - x_attn).abs().max() > 0.1  # the FiLM did something


def test_packing_index_matches_spec(model):
    """Token (f, H', W'), channel k = ((c6*64 + py*8 + px)*4) + qy*2 + qx holds the Plücker value of pixel
    row (2H'+qy)*8+py, col (2W'+qx)*8+px (spec §3)."""
    f, lat_h, lat_w = 2, 4, 6
    h, w = 8 * lat_h, 8 * lat_w
    field = torch.arange(f * h * w * 6, dtype=torch.float32).reshape(f, h, w, 6)  # distinct values
    packed = rearrange(field, "f (lh py) (lw px) c6 -> (c6 py px) f lh lw", py=8, px=8)[None]
    assert packed.shape == (1, CAMERA_CHANNELS, f, lat_h, lat_w)

    seen = []
    handle = model.patch_embedding_wancamctrl.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model.camera_tokens(packed, torch.float32)
    finally:
        handle.remove()
    tokens = seen[0][0]
    tok_h, tok_w = lat_h // 2, lat_w // 2
    assert tokens.shape == (f * tok_h * tok_w, 6 * 64 * 4)

    checked = 0
    for fi, th, tw in [(0, 0, 0), (0, 1, 2), (1, 0, 1), (1, 1, 0), (1, 1, 2)]:
        tok = (fi * tok_h + th) * tok_w + tw
        for c6 in range(6):
            for py in (0, 3, 7):
                for px in (0, 5, 7):
                    for qy in (0, 1):
                        for qx in (0, 1):
                            k = ((c6 * 64 + py * 8 + px) * 4) + qy * 2 + qx
                            row, col = (2 * th + qy) * 8 + py, (2 * tw + qx) * 8 + px
                            assert tokens[tok, k] == field[fi, row, col, c6], (fi, th, tw, c6, py, px, qy, qx)
                            checked += 1
    assert checked == 5 * 6 * 9 * 4
    # And every pixel value lands somewhere exactly once.
    assert torch.equal(tokens.flatten().sort().values, field.flatten())


def test_camera_shape_errors(model):
    x, t, ctx, y, cam = make_inputs(torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="channels"):
        model(x, t, ctx, y, camera=cam[:, :100])
    with pytest.raises(ValueError, match="tokens"):
        model(x, t, ctx, y, camera=cam[:, :, :1])

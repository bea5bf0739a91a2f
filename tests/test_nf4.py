"""NF4 linears: which layers, bit-exact dequantization vs the spec formula, forward, serialization round trip."""
import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open

from lingbot_world.quant.nf4 import (
    QUANT_STATE_KEY,
    NF4FormatError,
    NF4Linear,
    nf4_linear_names,
    replace_linears_with_nf4,
    serialize_nf4,
)
from lingbot_world.loaders.safetensors_stream import SafetensorsWriter
from lingbot_world.wan.dit.model import DiTConfig, WanDiT

# NF4 codebook as printed in spec §1.2 (7 decimals).
SPEC_NF4 = [-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
            0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0]


def _weight(out_f=256, in_f=320, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    w[3, 7] = 0.9  # an outlier block
    return w


def _quantized_linear(out_f=256, in_f=320, compute=torch.float32):
    lin = NF4Linear(in_f, out_f, compute_dtype=compute)
    lin.load_float_weight(_weight(out_f, in_f))
    lin.bias = nn.Parameter(torch.linspace(-0.1, 0.1, out_f), requires_grad=False)
    return lin


def spec_dequant(pieces: dict, prefix: str) -> np.ndarray:
    """Spec §1.2 formula, written independently with numpy in float32."""
    codes = pieces[f"{prefix}.weight"].numpy().reshape(-1)
    idx = np.stack([codes >> 4, codes & 0xF], axis=1).reshape(-1)  # element 2j in the high nibble
    qs = json.loads(bytes(pieces[f"{prefix}.weight.{QUANT_STATE_KEY}"].numpy()).decode())
    a8 = pieces[f"{prefix}.weight.absmax"].numpy()
    nmap = pieces[f"{prefix}.weight.nested_quant_map"].numpy()
    nabs = pieces[f"{prefix}.weight.nested_absmax"].numpy()
    absmax = nmap[a8] * nabs[np.arange(a8.size) // qs["nested_blocksize"]] + np.float32(qs["nested_offset"])
    qmap = pieces[f"{prefix}.weight.quant_map"].numpy()
    n = int(np.prod(qs["shape"]))
    w = qmap[idx[:n]] * absmax[np.arange(n) // qs["blocksize"]]
    assert w.dtype == np.float32
    return w.reshape(qs["shape"])


def test_569_linears_swapped_on_meta():
    cfg = DiTConfig()
    model = WanDiT(cfg, device="meta")
    assert len(model.state_dict()) == 1421
    names = replace_linears_with_nf4(model, cfg.num_layers, torch.bfloat16)
    assert len(names) == len(set(names)) == 569 == len(nf4_linear_names(40))
    kinds = {type(m) for m in model.modules() if isinstance(m, nn.Linear)}
    assert kinds == {NF4Linear}
    assert sum(isinstance(m, NF4Linear) for m in model.modules()) == 569
    assert all(p.is_meta for p in model.parameters())  # no float weight anywhere
    assert isinstance(model.patch_embedding, nn.Conv3d) and model.blocks[0].modulation.shape == (1, 6, 5120)
    plain = WanDiT(DiTConfig.tiny(), device="cpu")
    with pytest.raises(ValueError, match="meta"):
        replace_linears_with_nf4(plain, 2, torch.float32)


def test_dequant_is_spec_formula_bit_exact():
    lin = _quantized_linear()
    pieces = serialize_nf4("l", lin.weight.data, lin.weight.quant_state)
    qs = json.loads(bytes(pieces[f"l.weight.{QUANT_STATE_KEY}"].numpy()).decode())
    assert qs["quant_type"] == "nf4" and qs["blocksize"] == 64 and qs["dtype"] == "bfloat16"
    assert qs["shape"] == [256, 320] and qs["nested_blocksize"] == 256 and qs["nested_dtype"] == "float32"
    assert pieces["l.weight.nested_absmax"].numel() == 5  # 1280 blocks -> 5 nested blocks: indexing is tested
    np.testing.assert_allclose(pieces["l.weight.quant_map"].numpy(), SPEC_NF4, atol=5e-8)
    ref = torch.from_numpy(spec_dequant(pieces, "l"))
    assert torch.equal(lin.dequantized_weight(torch.float32), ref)
    assert torch.equal(lin.dequantized_weight(torch.bfloat16), ref.to(torch.bfloat16))  # fp32 maths, one cast
    err = (ref - _weight()).abs().max() / _weight().abs().max()
    assert 0 < err < 0.1  # it is a 4-bit approximation of the weight


def test_forward_equals_float_linear_on_dequantized_weight():
    x = torch.randn(3, 5, 320)
    lin = _quantized_linear(compute=torch.float32)
    w = lin.dequantized_weight(torch.float32)
    torch.testing.assert_close(lin(x), F.linear(x, w, lin.bias), rtol=1e-5, atol=1e-5)
    assert lin.weight.data.shape == (256 * 320 // 2, 1)  # still packed: bnb's CPU repack is off
    assert not getattr(lin.weight.quant_state, "packing_format_for_cpu", False)

    lb = _quantized_linear(compute=torch.bfloat16)
    lb.bias = nn.Parameter(lb.bias.bfloat16(), requires_grad=False)
    y = lb(x.bfloat16())
    assert y.dtype == torch.bfloat16
    ref = F.linear(x.bfloat16(), lb.dequantized_weight(torch.bfloat16), lb.bias)
    torch.testing.assert_close(y, ref, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(y.float(), F.linear(x, w, lin.bias), rtol=3e-2, atol=3e-2)


def test_serialized_layer_round_trips_bit_exact(tmp_path):
    lin = _quantized_linear()
    pieces = serialize_nf4("blocks.0.ffn.0", lin.weight.data, lin.weight.quant_state)
    table = {k.removeprefix("blocks.0.ffn.0."): (v.dtype, tuple(v.shape)) for k, v in pieces.items()}
    n = 256 * 320
    assert table["weight"] == (torch.uint8, (n // 2, 1))
    assert table["weight.absmax"] == (torch.uint8, (n // 64,))
    assert table["weight.quant_map"] == (torch.float32, (16,))
    assert table["weight.nested_absmax"] == (torch.float32, (5,))
    assert table["weight.nested_quant_map"] == (torch.float32, (256,))
    assert table[f"weight.{QUANT_STATE_KEY}"][0] == torch.uint8
    p = tmp_path / "layer.safetensors"
    with SafetensorsWriter(p) as w:
        for k, v in pieces.items():
            w.add(k, v)
    with safe_open(str(p), "pt") as f:
        back = {k: f.get_tensor(k) for k in f.keys()}
    assert all(torch.equal(back[k], pieces[k]) for k in pieces)
    again = NF4Linear(320, 256, compute_dtype=torch.float32)
    again.load_prequantized(back["blocks.0.ffn.0.weight"],
                            {k.removeprefix("blocks.0.ffn.0.weight."): v for k, v in back.items() if k != "blocks.0.ffn.0.weight"})
    assert torch.equal(again.weight.data, lin.weight.data)
    assert torch.equal(again.dequantized_weight(torch.float32), lin.dequantized_weight(torch.float32))
    re = serialize_nf4("blocks.0.ffn.0", again.weight.data, again.weight.quant_state)
    assert all(torch.equal(re[k], pieces[k]) for k in pieces)  # and serializes to the same bytes


def test_prequantized_pieces_are_checked():
    lin = _quantized_linear()
    pieces = {k.removeprefix("l.weight."): v for k, v in serialize_nf4("l", lin.weight.data, lin.weight.quant_state).items()}
    packed = pieces.pop("l.weight")
    wrong = NF4Linear(256, 320)  # transposed shape
    with pytest.raises(NF4FormatError, match=r"blk: stored weight shape \(256, 320\) but the model expects \(320, 256\)"):
        wrong.load_prequantized(packed, pieces, "blk")
    partial = dict(pieces)
    del partial["absmax"]
    with pytest.raises(NF4FormatError, match="missing weight.absmax"):
        NF4Linear(320, 256).load_prequantized(packed, partial, "blk")
    bad = dict(pieces, **{QUANT_STATE_KEY: torch.tensor(list(b"{not json"), dtype=torch.uint8)})
    with pytest.raises(NF4FormatError, match="not valid JSON"):
        NF4Linear(320, 256).load_prequantized(packed, bad, "blk")
    with pytest.raises(NF4FormatError, match=r"weight has shape \(10, 1\)"):
        NF4Linear(320, 256).load_prequantized(packed[:10], pieces, "blk")
    with pytest.raises(RuntimeError, match="no weight yet"):
        NF4Linear(320, 256).dequantized_weight()

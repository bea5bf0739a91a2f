"""The NF4 on-disk layout of an expert, without bitsandbytes: which linears are quantized, the stored pieces'
names, dtypes and shapes, the quant-state JSON, and the compute dtype per device.

Kept apart from quant/nf4.py (the bitsandbytes module) so the checks that run before a model loads (file
headers, key plans, memory plans) do not import bitsandbytes, whose import pulls in torch._dynamo and
torch._inductor (seconds): the CLI imports it on a background thread meanwhile (world/heavy_imports.py).
"""
from __future__ import annotations

import json
import math

import torch

NF4_BLOCKSIZE = 64
# Only token-wise GEMMs (the DiT's video tokens) take a low-precision path (NF4's --compute fp8/int8, FP8 weights);
# the few-row ones (time embedding, the 512 text rows) stay exact: they cost nothing and their error would reach
# every token.
LOWP_MIN_ROWS = 1024
NESTED_BLOCKSIZE = 256
QUANT_STATE_KEY = "quant_state.bitsandbytes__nf4"
# Packed components stored under "<L>.weight.<component>".
NF4_COMPONENTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", QUANT_STATE_KEY)
NF4_COMPONENT_DTYPES = {
    "": torch.uint8,  # the packed codes themselves ("<L>.weight")
    "absmax": torch.uint8,
    "quant_map": torch.float32,
    "nested_absmax": torch.float32,
    "nested_quant_map": torch.float32,
    QUANT_STATE_KEY: torch.uint8,
}

# The 569 quantized linears of spec §1.2 (module paths of WanDiT == checkpoint key prefixes).
TOP_LEVEL_NF4_LINEARS = (
    "patch_embedding_wancamctrl",
    "c2ws_hidden_states_layer1",
    "c2ws_hidden_states_layer2",
    "text_embedding.0",
    "text_embedding.2",
    "time_embedding.0",
    "time_embedding.2",
    "time_projection.1",
    "head.head",
)
BLOCK_NF4_LINEARS = (
    "self_attn.q",
    "self_attn.k",
    "self_attn.v",
    "self_attn.o",
    "cross_attn.q",
    "cross_attn.k",
    "cross_attn.v",
    "cross_attn.o",
    "ffn.0",
    "ffn.2",
    "cam_injector_layer1",
    "cam_injector_layer2",
    "cam_scale_layer",
    "cam_shift_layer",
)


class NF4FormatError(ValueError):
    """A quantized linear's stored pieces are missing, mis-typed or inconsistent."""


def nf4_linear_names(num_layers: int) -> list[str]:
    """Module paths of the quantized linears of an expert with `num_layers` blocks (569 for 40)."""
    names = list(TOP_LEVEL_NF4_LINEARS)
    for i in range(num_layers):
        names += [f"blocks.{i}.{n}" for n in BLOCK_NF4_LINEARS]
    return names


def swap_quantized_linears(model, num_layers: int, make) -> list[str]:
    """Replace the quantized set of linears of a meta-device DiT with make(old nn.Linear) shells (NF4, FP8); returns
    their names. Only the linears listed by spec section 1.2 are swapped; the conv, norms and modulation stay plain."""
    import torch.nn as nn

    names = nf4_linear_names(num_layers)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        if type(old) is not nn.Linear:
            raise TypeError(f"{name} is a {type(old).__name__}, expected nn.Linear")
        if not old.weight.is_meta:
            raise ValueError(f"{name} already holds weights; build the model on the 'meta' device first")
        setattr(parent, child, make(old))  # nn.Sequential children ("0", "2") keep their slot
    return names


def default_compute_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on GPUs (the reference's precision); float32 on CPU, where bnb dequantizes straight to fp32."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def token_gemm_mode(compute: str, out_features: int, in_features: int, half: bool = True) -> str:
    """The mode an NF4 linear's token-wise GEMMs (LOWP_MIN_ROWS rows or more) run in under `compute`: that mode, or
    "bf16" (a GEMM in the compute dtype) where it cannot run: a float32 compute dtype (half=False, the CPU), or
    dims that are not multiples of 16 (_scaled_mm's and _int_mm's limits)."""
    if compute == "bf16" or not half or in_features % 16 or out_features % 16:
        return "bf16"
    return compute


def prepared_weight_bytes(out_features: int, in_features: int, compute: str, compute_bytes: int = 2) -> int:
    """Device bytes of one NF4 weight prepared for its token-wise GEMMs (what NF4Linear.keep_weight keeps): FP8 /
    INT8 codes with a float32 scale per row, an fp16 weight for fp16acc, else the weight in the compute dtype."""
    mode = token_gemm_mode(compute, out_features, in_features, compute_bytes == 2)
    n = out_features * in_features
    if mode in ("fp8", "int8"):
        return n + 4 * out_features
    return n * (2 if mode == "fp16acc" else compute_bytes)


def packed_shapes(out_features: int, in_features: int, blocksize: int = NF4_BLOCKSIZE) -> dict[str, tuple[int, ...]]:
    """Shapes of the stored pieces of one NF4 weight (double quant), keyed like NF4_COMPONENT_DTYPES."""
    n = out_features * in_features
    blocks = math.ceil(n / blocksize)
    return {
        "": ((n + 1) // 2, 1),
        "absmax": (blocks,),
        "quant_map": (16,),
        "nested_absmax": (math.ceil(blocks / NESTED_BLOCKSIZE),),
        "nested_quant_map": (256,),
    }


def parse_quant_state_json(t: torch.Tensor, where: str) -> dict:
    """Decode the `quant_state.bitsandbytes__nf4` blob (UTF-8 JSON in a uint8 tensor) with clear errors."""
    try:
        d = json.loads(bytes(t.detach().cpu().reshape(-1).numpy()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NF4FormatError(f"{where}: quant_state is not valid JSON ({e}); the file is corrupted") from None
    if not isinstance(d, dict):
        raise NF4FormatError(f"{where}: quant_state JSON is not an object; the file is corrupted")
    return d

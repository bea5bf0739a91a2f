"""The FP8 on-disk layout of an expert (the Fast model's `--weights fp8`), without any GEMM code.

One `model.safetensors` holds, for each of the linears NF4 quantizes (quant/nf4_format.nf4_linear_names):

    <L>.weight        F8_E4M3 [N, K]   round(W / scale) in e4m3 (saturating at +-448)
    <L>.weight_scale  F32     [N]      amax of the row / 448 (one scale per output channel)

and every other tensor as the source stored it. `__metadata__["quantization"]` is a JSON object saying the
format (FORMAT), its VERSION and the source the weights were quantized from: "bf16" (the official checkpoint:
one rounding) or "nf4" (an NF4 folder dequantized first: the NF4 error and the FP8 error add up).
"""
from __future__ import annotations

import json
from typing import Mapping

import torch

FORMAT = "lingbot_fp8"
VERSION = 1
SOURCES = ("bf16", "nf4")
WEIGHT_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.float32
SCALE_SUFFIX = ".weight_scale"
QUANT_METADATA_KEY = "quantization"
NF4_SOURCE_NOTE = ("quantized from NF4 weights (dequantized first): the NF4 rounding error stays and the FP8 "
                   "error adds to it; convert the official bf16 checkpoint for the least error")


class Fp8FormatError(ValueError):
    """An FP8 expert file that cannot be used as it is (wrong metadata, dtype, shape or values)."""


def recipe(source: str) -> dict:
    """The `quantization` metadata of a folder converted from `source` ("bf16" or "nf4")."""
    if source not in SOURCES:
        raise ValueError(f"FP8 source {source!r}: choose one of {SOURCES}")
    out = {"format": FORMAT, "version": VERSION, "weight_dtype": "float8_e4m3fn",
           "scale": "float32 per output channel, amax / 448", "source": source}
    if source == "nf4":
        out["note"] = NF4_SOURCE_NOTE
    return out


def parse_metadata(metadata: Mapping[str, str], where: str) -> dict:
    """The checked `quantization` entry of a safetensors `__metadata__`; one-line errors naming `where`."""
    raw = metadata.get(QUANT_METADATA_KEY)
    if raw is None:
        raise Fp8FormatError(f"{where}: FP8 weights without a '{QUANT_METADATA_KEY}' metadata entry, so not a "
                             f"{FORMAT} file; convert it again with `lingbot-world convert-fp8`")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        raise Fp8FormatError(f"{where}: the '{QUANT_METADATA_KEY}' metadata is not JSON ({e}); the file is "
                             "damaged, convert it again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise Fp8FormatError(f"{where}: quantization format {got!r}, not {FORMAT!r}; only folders written by "
                             "`lingbot-world convert-fp8` are read")
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        raise Fp8FormatError(f"{where}: {FORMAT} version {version!r}; this pack reads version {VERSION}: update "
                             "the pack or convert the folder again")
    if meta.get("source") not in SOURCES:
        raise Fp8FormatError(f"{where}: {FORMAT} source {meta.get('source')!r}; expected one of {SOURCES}")
    return meta


def is_fp8_keyset(dtypes: Mapping[str, torch.dtype]) -> bool:
    """Does a key -> dtype map hold stored FP8 linears (an e4m3 weight with its scale beside it)?"""
    return any(k.endswith(SCALE_SUFFIX) and dtypes.get(k[: -len(SCALE_SUFFIX)] + ".weight") == WEIGHT_DTYPE
               for k in dtypes)


def linear_bytes(out_features: int, in_features: int) -> int:
    """Stored (and device) bytes of one FP8 linear's weight: 1 byte a weight plus a float32 scale per row."""
    return out_features * in_features * WEIGHT_DTYPE.itemsize + out_features * SCALE_DTYPE.itemsize

"""The on-disk layouts of an expert with stored low-precision weights (the Fast model's `--weights fp8` and
`--weights int8`), without any GEMM code. One table row (`StoredFormat`) per kind; everything else reads the row.

One `model.safetensors` holds, for each of the linears NF4 quantizes (quant/nf4_format.nf4_linear_names):

    <L>.weight        F8_E4M3 | I8 [N, K]   round(W / scale): e4m3 (saturating at +-448) or int8 in [-127, 127]
    <L>.weight_scale  F32          [N]      amax of the row / max value (448 or 127; one scale per output channel)

and every other tensor as the source stored it. `__metadata__["quantization"]` is a JSON object saying the
format (`StoredFormat.name`), its VERSION and the source the weights were quantized from: "bf16" (the official
checkpoint: one rounding) or "nf4" (an NF4 folder dequantized first: the NF4 error and the new one add up).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

VERSION = 1
SOURCES = ("bf16", "nf4")
SCALE_DTYPE = torch.float32
SCALE_SUFFIX = ".weight_scale"
QUANT_METADATA_KEY = "quantization"


@dataclass(frozen=True)
class StoredFormat:
    kind: str  # the weights mode that reads it: "fp8" | "int8"
    name: str  # the metadata's "format"
    weight_dtype: torch.dtype
    max_value: float  # the largest stored magnitude: scale = row amax / max_value
    rounding: str
    arch: str  # the GPUs whose tensor cores run it (the refusal's words)
    min_capability: tuple

    @property
    def label(self) -> str:
        return self.kind.upper()

    @property
    def converter(self) -> str:
        return f"convert-{self.kind}"

    @property
    def nf4_source_note(self) -> str:
        return (f"quantized from NF4 weights (dequantized first): the NF4 rounding error stays and the {self.label} "
                "error adds to it; convert the official bf16 checkpoint for the least error")

    def recipe(self, source: str) -> dict:
        """The `quantization` metadata of a folder converted from `source` ("bf16" or "nf4")."""
        if source not in SOURCES:
            raise ValueError(f"{self.label} source {source!r}: choose one of {SOURCES}")
        out = {"format": self.name, "version": VERSION, "weight_dtype": str(self.weight_dtype).replace("torch.", ""),
               "scale": f"float32 per output channel, amax / {self.max_value:g}", "source": source}
        if self.kind != "fp8":  # the FP8 recipe predates this field (its files stay byte-identical)
            out["rounding"] = self.rounding
        if source == "nf4":
            out["note"] = self.nf4_source_note
        return out

    def parse_metadata(self, metadata: Mapping[str, str], where: str) -> dict:
        """The checked `quantization` entry of a safetensors `__metadata__`; one-line errors naming `where`."""
        redo = f"convert it again with `lingbot-world {self.converter}`"
        raw = metadata.get(QUANT_METADATA_KEY)
        if raw is None:
            raise LowpFormatError(f"{where}: {self.label} weights without a '{QUANT_METADATA_KEY}' metadata entry, "
                                  f"so not a {self.name} file; {redo}")
        try:
            meta = json.loads(raw)
        except json.JSONDecodeError as e:
            raise LowpFormatError(f"{where}: the '{QUANT_METADATA_KEY}' metadata is not JSON ({e}); the file is "
                                  "damaged, convert it again") from None
        if not isinstance(meta, dict) or meta.get("format") != self.name:
            got = meta.get("format") if isinstance(meta, dict) else meta
            raise LowpFormatError(f"{where}: quantization format {got!r}, not {self.name!r}; only folders written "
                                  f"by `lingbot-world {self.converter}` are read")
        version = meta.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
            raise LowpFormatError(f"{where}: {self.name} version {version!r}; this pack reads version {VERSION}: "
                                  "update the pack or convert the folder again")
        if meta.get("source") not in SOURCES:
            raise LowpFormatError(f"{where}: {self.name} source {meta.get('source')!r}; expected one of {SOURCES}")
        return meta

    def linear_bytes(self, out_features: int, in_features: int) -> int:
        """Stored (and device) bytes of one linear's weight: 1 byte a weight plus a float32 scale per row."""
        return out_features * in_features * self.weight_dtype.itemsize + out_features * SCALE_DTYPE.itemsize


FORMATS = {
    "fp8": StoredFormat("fp8", "lingbot_fp8", torch.float8_e4m3fn, 448.0, "to nearest e4m3 (ties to even)",
                        "an Ada/Hopper GPU (sm89+)", (8, 9)),
    "int8": StoredFormat("int8", "lingbot_int8", torch.int8, 127.0, "to nearest integer (ties to even)",
                         "an Ampere-or-newer GPU (sm80+)", (8, 0)),
}
KIND_OF_DTYPE = {f.weight_dtype: f.kind for f in FORMATS.values()}


class LowpFormatError(ValueError):
    """A stored low-precision expert file that cannot be used as it is (wrong metadata, dtype, shape or values)."""


def stored_kind(dtypes: Mapping[str, torch.dtype]) -> Optional[str]:
    """Which stored linears a key -> dtype map holds ("fp8", "int8", or None): a weight of a stored dtype with its
    scale beside it. Mixed kinds are reported as the first one found (the loader's per-key checks name the rest)."""
    for k in dtypes:
        if k.endswith(SCALE_SUFFIX):
            kind = KIND_OF_DTYPE.get(dtypes.get(k[: -len(SCALE_SUFFIX)] + ".weight"))
            if kind is not None:
                return kind
    return None

"""`convert_to_lowp(src, out, kind)`: an expert (the official bf16 folder, or an NF4 folder) -> an FP8 or INT8
folder (`convert_to_fp8` / `convert_to_int8`).

The folder (layout in quant/lowp_format.py) is `model.safetensors` + `config.json` + `quantization_meta.json`,
built under a temp name and renamed when complete (loaders/atomic.atomic_dir): an interrupted or failed
conversion leaves nothing under `out`, and an existing `out` is never replaced. Tensors stream one at a time:
each linear's weight is read to `device` (CUDA when there is one), quantized per output channel to the kind's dtype
there and written; host memory holds one tensor at a time.

Sources: float weights are quantized from their bf16 value (the reference's precision: one rounding, the
least error). NF4 weights are dequantized (bitsandbytes, float32) first, so the NF4 error stays and the new
rounding adds to it: the metadata and the result say so. Both report the quantization step's relative error
against the weights it quantized.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import math
from functools import partial
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..quant.lowp_format import FORMATS, QUANT_METADATA_KEY, SCALE_SUFFIX
from ..quant.lowp_linear import dequantize, quantize_weight
from ..quant.nf4_format import QUANT_STATE_KEY
from ..wan.dit.model import WanDiT
from .atomic import atomic_dir
from .expert_format import ExpertFormat, ExpertLoadError, detect_format
from .expert_keys import _file_keys, _plan, _stream
from .safetensors_stream import SafetensorsWriter

WEIGHTS_FILE = "model.safetensors"
META_FILE = "quantization_meta.json"
Progress = Callable[[int, int], None]


def _versions() -> dict:
    out = {}
    for dist in ("torch", "safetensors", "bitsandbytes"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _config_text(fmt: ExpertFormat, tags: Optional[dict] = None) -> str:
    """The source's own config.json (class name and init arguments kept), else the config the format read; with
    the tags (the model's name and licence) added."""
    folder = fmt.path if fmt.path.is_dir() else fmt.path.parent
    if fmt.config_source == "config.json" and (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
    else:
        config = fmt.config.to_json()
    return json.dumps({**config, **(tags or {})}, indent=2)


def _nf4_weight(out_in: tuple, pieces: dict, where: str) -> torch.Tensor:
    """An NF4 linear's stored pieces -> its float32 weight (bitsandbytes' dequantization)."""
    from ..quant.nf4 import NF4Linear

    tmp = NF4Linear(out_in[1], out_in[0], bias=False, compute_dtype=torch.float32)
    tmp.load_prequantized(pieces.pop(""), pieces, where)
    return tmp.dequantized_weight(torch.float32)


class _Error:
    """Sum of squares of the quantization step's error and of the weights it quantized (float64, on the host)."""

    def __init__(self):
        self.err = self.ref = 0.0

    def add(self, w: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> None:
        diff = dequantize(w8, scale) - w
        self.err += float(torch.linalg.vector_norm(diff, dtype=torch.float64) ** 2)
        self.ref += float(torch.linalg.vector_norm(w, dtype=torch.float64) ** 2)

    @property
    def relative(self) -> float:
        return (self.err / self.ref) ** 0.5 if self.ref else 0.0


def convert_to_lowp(src: Union[str, Path, ExpertFormat], out_dir: Union[str, Path], kind: str,
                    device: Optional[Union[str, torch.device]] = None, progress: Optional[Progress] = None,
                    tags: Optional[dict] = None) -> dict:
    """Write the `kind` ("fp8" | "int8") copy of the expert at `src` to the new folder `out_dir`; returns its
    statistics (source, linears, bytes, the step's relative weight error and, from NF4, the note that the errors
    add up).

    Raises FileExistsError when `out_dir` exists, ExpertLoadError for an FP8 or INT8 source, StateDictMismatch
    when a tensor is missing or mis-shaped (checked from the headers before any work). tags: what the copy records
    of its model (its registry name and licence, world/detect.py), in the metadata and config.json."""
    lowp = FORMATS[kind]
    fmt = src if isinstance(src, ExpertFormat) else detect_format(src)
    if fmt.weights in FORMATS:
        raise ExpertLoadError(f"{fmt.path} holds {fmt.weights.upper()} weights already; nothing to convert")
    source = "nf4" if fmt.weights == "nf4" else "bf16"
    out = Path(out_dir).expanduser()
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} already exists; a conversion never replaces a folder: remove it or choose "
                              "another output folder")
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                            else "cpu")
    keys, sources, pt_sd = _file_keys(fmt)
    plan = _plan(WanDiT(fmt.config, device="meta"), True, keys, sources)  # every key checked, nothing read yet
    total = sum(dtype.itemsize * math.prod(shape) for dtype, shape in keys.values())
    recipe = lowp.recipe(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        metadata = {"format": "pt", "config": json.dumps(fmt.config.to_json()),
                    QUANT_METADATA_KEY: json.dumps(recipe), **(tags or {})}
        writer = SafetensorsWriter(tmp / WEIGHTS_FILE, metadata, header_reserve=sum(len(k) + 96 for k in keys) + 8192)
        try:
            stats = _write(fmt, kind, plan, keys, sources, pt_sd, writer, device, progress, total)
            path = writer.close()
        except BaseException:
            writer.abort()
            raise
        (tmp / "config.json").write_text(_config_text(fmt, tags))
        stats.update(file_bytes=path.stat().st_size, source=source)
        if source == "nf4":
            stats["note"] = lowp.nf4_source_note
        meta = {"quant": recipe, "source": {"path": str(fmt.path), "kind": fmt.kind, "weights": source},
                "model_config": fmt.config.to_json(), "files": {"weights": WEIGHTS_FILE, "config": "config.json"},
                "stats": stats, "tool_versions": _versions(),
                "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
    return stats


convert_to_fp8 = partial(convert_to_lowp, kind="fp8")
convert_to_int8 = partial(convert_to_lowp, kind="int8")


def _write(fmt, kind: str, plan, keys, sources, pt_sd, writer: SafetensorsWriter, device, progress, total) -> dict:
    pending: dict[str, dict] = {}
    error = _Error()
    done = linears = plain = 0

    def put_linear(name: str, w: torch.Tensor) -> None:
        nonlocal linears
        w8, scale = quantize_weight(w, kind)
        error.add(w, w8, scale)
        writer.add(f"{name}.weight", w8)
        writer.add(name + SCALE_SUFFIX, scale)
        linears += 1

    def packed_owner(key: str) -> tuple[Optional[str], Optional[str]]:
        if key.endswith(".weight") and key[:-7] in plan.packed:
            return key[:-7], ""
        head, sep, tail = key.partition(".weight.")
        return (head, tail) if sep and head in plan.packed else (None, None)

    def on_host(key: str) -> bool:  # only the linears' weights go to the device to be (de)quantized there
        return key.endswith(QUANT_STATE_KEY) or packed_owner(key)[0] is None and not (
            key.endswith(".weight") and key[:-7] in plan.float_linear)

    for key, t, nbytes in _stream(fmt, device, pt_sd, on_host):
        owner, comp = packed_owner(key)
        if owner is not None:
            pieces = pending.setdefault(owner, {})
            pieces[comp] = t
            if len(pieces) == len(plan.packed[owner]):
                put_linear(owner, _nf4_weight(plan.linears[owner], pending.pop(owner), f"{sources[key]}: {owner}"))
        elif key.endswith(".weight") and key[:-7] in plan.float_linear:
            put_linear(key[:-7], t.to(torch.bfloat16).float())  # from its bf16 value, as every format loads
        else:
            writer.add(key, t)  # the other tensors as the source stores them
            plain += 1
        del t
        done += nbytes
        if progress is not None:
            progress(done, total)
    if pending or linears != len(plan.linears):
        raise ExpertLoadError(f"{fmt.path}: {len(plan.linears) - linears} linears were not complete after reading "
                              "every tensor; the file is damaged")
    return {"linear_layers_quantized": linears, "plain_tensors": plain,
            "weight_rel_error": round(error.relative, 6)}

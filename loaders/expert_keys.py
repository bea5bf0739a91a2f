"""An expert's tensors by key: listed from the file headers, checked against the model, then streamed.

`_plan` checks every key of the file(s) (names, shapes, dtypes, the pieces of each NF4 / FP8 / INT8 linear) against
the model from the headers alone, so that a wrong or incomplete file is refused before any tensor is read;
`_file_keys` lists the keys without touching tensor data, and `_stream` reads the tensors one at a time. Used by
expert_loader.py (the load and `check_expert_keys`) and by the FP8 / INT8 converter (lowp_writer.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from ..quant.lowp_format import KIND_OF_DTYPE, SCALE_SUFFIX
from ..quant.nf4_format import NF4_COMPONENT_DTYPES, NF4_COMPONENTS, QUANT_STATE_KEY, nf4_linear_names, packed_shapes
from ..wan.dit.model import StateDictMismatch, WanDiT
from .expert_format import ExpertFormat, load_pt_state_dict
from .safetensors_stream import iter_tensors, read_header

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- planning: every file key checked against the model before anything is read -------------------------
@dataclass
class _Plan:
    plain: dict  # key -> expected shape (non-linear params and biases; linear weights in bf16 mode)
    linears: dict  # linear name -> (out, in)
    packed: dict  # linear name -> set of stored components ("" = the codes)
    float_linear: set  # linear names whose weight is stored as a float tensor
    lowp: dict  # linear name -> stored FP8 / INT8 pieces ("weight", "scale")


def _lowp_piece(key: str, dtype: Optional[torch.dtype], linears) -> tuple[Optional[str], Optional[str]]:
    """(linear, "weight" | "scale") for a stored FP8 / INT8 piece: a linear weight of a stored dtype (e4m3,
    int8) or a linear's weight_scale."""
    if key.endswith(SCALE_SUFFIX) and key[: -len(SCALE_SUFFIX)] in linears:
        return key[: -len(SCALE_SUFFIX)], "scale"
    if dtype in KIND_OF_DTYPE and key.endswith(".weight") and key[:-7] in linears:
        return key[:-7], "weight"
    return None, None


def _plan(model: WanDiT, quantized: bool, files: dict[str, tuple[torch.dtype, tuple]], sources: dict[str, Path]) -> _Plan:
    """quantized: the model's linears are NF4, FP8 or INT8 shells (their weights are not plain parameters)."""
    linear_names = nf4_linear_names(model.cfg.num_layers)
    linears = {}
    for name in linear_names:
        m = model.get_submodule(name)
        linears[name] = (m.out_features, m.in_features)

    def linear_weight(k: str) -> bool:
        return (k.endswith(".weight") and k[:-7] in linears or k.endswith(SCALE_SUFFIX)
                and k[: -len(SCALE_SUFFIX)] in linears)

    plain = {k: tuple(p.shape) for k, p in model.named_parameters() if not (quantized and linear_weight(k))}
    packed: dict[str, set] = {}
    lowp: dict[str, set] = {}
    float_linear: set = set()
    problems: list[str] = []
    unexpected: list[str] = []

    nested_owners = {k.partition(".weight.nested_")[0] for k in files if ".weight.nested_" in k}

    def where(k: str) -> str:
        return f"{sources[k].name}: {k}"

    for k, (dtype, shape) in files.items():
        owner, comp = _lowp_piece(k, dtype, linears)
        if owner is not None:
            lowp.setdefault(owner, set()).add(comp)
            out_f, in_f = linears[owner]
            # a weight piece is one because of its stored dtype; its scale must be float32
            want_dtype, want_shape = (dtype, (out_f, in_f)) if comp == "weight" else (torch.float32, (out_f,))
            if dtype != want_dtype:
                problems.append(f"  {where(k)} has dtype {dtype}, a stored low-precision linear keeps it as "
                                f"{want_dtype}")
            if shape != want_shape:
                problems.append(f"  shape mismatch for {where(k)}: file {shape} vs model {want_shape}")
            continue
        if k.endswith(".weight") and k[:-7] in linears:
            owner, comp = k[:-7], ""
            if k + "." + QUANT_STATE_KEY not in files:
                owner = None  # a float weight: handled as plain / float_linear below
        else:
            head, sep, tail = k.partition(".weight.")
            if sep and head in linears and tail in NF4_COMPONENTS:
                owner, comp = head, tail
        if owner is not None:
            packed.setdefault(owner, set()).add(comp)
            want = NF4_COMPONENT_DTYPES[comp]
            if comp == "absmax" and owner not in nested_owners:
                want = torch.float32  # single-level statistics
            if dtype != want:
                problems.append(f"  {where(k)} has dtype {dtype}, NF4 stores it as {want}")
            exp = packed_shapes(*linears[owner]).get(comp)
            if comp in ("", "quant_map", "nested_quant_map") and shape != exp:
                problems.append(f"  shape mismatch for {where(k)}: file {shape} vs model {exp} (NF4 of a {linears[owner]} weight)")
            continue
        if k.endswith(".weight") and k[:-7] in linears and quantized:
            float_linear.add(k[:-7])
            exp = linears[k[:-7]]
        elif k in plain:
            exp = plain[k]
        else:
            unexpected.append(f"  unexpected key {where(k)} {shape}")
            continue
        if shape != exp:
            problems.append(f"  shape mismatch for {where(k)}: file {shape} vs model {exp}")
        if dtype not in FLOAT_DTYPES:
            problems.append(f"  {where(k)} has dtype {dtype}; expected a float tensor (float32, bfloat16 or float16)")

    missing = []
    for name, comps in packed.items():
        need = {"", "absmax", "quant_map", QUANT_STATE_KEY}
        if comps & {"nested_absmax", "nested_quant_map"}:
            need |= {"nested_absmax", "nested_quant_map"}
        for c in sorted(need - comps):
            label = f"{name}.weight" + (f".{c}" if c else "")
            missing.append(f"  missing key {label} (a piece of the NF4 linear {name}; the file is incomplete)")
    for name, comps in lowp.items():
        for c in sorted({"weight", "scale"} - comps):
            label = f"{name}.weight" if c == "weight" else name + SCALE_SUFFIX
            missing.append(f"  missing key {label} (a piece of the stored low-precision linear {name}; the file is "
                           "incomplete)")
    for name in linears:
        if name not in packed and name not in float_linear and name not in lowp and f"{name}.weight" not in files:
            missing.append(f"  missing key {name}.weight (model expects {linears[name]})")
    for k, shape in plain.items():
        if k not in files and not (k.endswith(".weight") and (k[:-7] in packed or k[:-7] in lowp)):
            missing.append(f"  missing key {k} (model expects shape {shape})")
    lines = problems + missing + unexpected
    if lines:
        files_txt = ", ".join(sorted({str(p) for p in sources.values()}))
        more = f"\n  ... and {len(lines) - 25} more" if len(lines) > 25 else ""
        raise StateDictMismatch(
            f"{files_txt} does not match the model built from its config:\n"
            + "\n".join(lines[:25])
            + more
            + "\nCheck that config.json belongs to these weights and that the files are a complete LingBot-World expert."
        )
    return _Plan(plain, linears, packed, float_linear, lowp)


# ---- reading ---------------------------------------------------------------------------------------------
def _file_keys(fmt: ExpertFormat):
    """key -> (dtype, shape) and key -> file, prefix stripped, plus the reader; no tensor data is touched."""
    p = fmt.key_prefix
    keys, sources = {}, {}
    if fmt.kind == "nf4_pt":
        sd = load_pt_state_dict(fmt.files[0])
        for k, v in sd.items():
            if k.startswith(p):
                keys[k[len(p):]] = (v.dtype, tuple(v.shape))
                sources[k[len(p):]] = fmt.files[0]
            else:
                keys[k], sources[k] = (v.dtype, tuple(v.shape)), fmt.files[0]
        return keys, sources, sd
    for f in fmt.files:
        h = fmt.headers.get(f) or read_header(f)
        for k, e in h.entries.items():
            kk = k[len(p):] if p and k.startswith(p) else k
            keys[kk], sources[kk] = (e.dtype, e.shape), f
    return keys, sources, None


def _stream(fmt: ExpertFormat, device: torch.device, pt_sd,
            on_host: Callable[[str], bool]) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(key without prefix, tensor, bytes) in file order; keys for which on_host(key) is True stay on the CPU."""
    p = fmt.key_prefix
    strip = (lambda k: k[len(p):] if k.startswith(p) else k) if p else (lambda k: k)
    if pt_sd is not None:  # memory-mapped pickle: pages are touched once, tensor by tensor
        for k in list(pt_sd):
            t = pt_sd.pop(k)
            n = t.numel() * t.element_size()
            yield strip(k), (t if on_host(strip(k)) else t.to(device)), n
            del t
        return
    for f in fmt.files:
        header = fmt.headers.get(f) or read_header(f)
        for k, t in iter_tensors(header, device, host=lambda name: on_host(strip(name))):
            yield strip(k), t, t.numel() * t.element_size()


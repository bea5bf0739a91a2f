"""Load one DiT expert straight onto a device: meta model -> NF4 shells -> tensors streamed in one at a time.

No full-size float weight ever exists on the host, and no empty module is copied to the GPU: the model is built
on `meta`, its linears are swapped for `NF4Linear` shells (mode "nf4") or `Fp8Linear` / `Int8Linear` shells
(modes "fp8" / "int8", quant/lowp_linear.py), every key of the file(s) is checked against the model from the
headers alone, and then each tensor is read from disk to the target device and put in place
(`module._parameters[name] = ...`). Float linear weights (official release) are quantized on the target device as
they arrive; stored NF4 / FP8 / INT8 linears are used as stored in their own mode and dequantized in "bf16" mode.
A file is not loaded in another quantized mode than its own (`check_mode` says which flag or converter to use).
On any failure everything already placed is dropped and the CUDA cache emptied before the error propagates, so
nothing half-loaded stays on the GPU.
"""
from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import torch
import torch.nn as nn

from ..wan.dit.model import StateDictMismatch, WanDiT
from .expert_format import ExpertFormat, ExpertLoadError, detect_format, load_pt_state_dict
from ..quant.lowp_format import FORMATS, KIND_OF_DTYPE, SCALE_SUFFIX
from ..quant.nf4_format import (
    NF4_COMPONENT_DTYPES,
    NF4_COMPONENTS,
    QUANT_STATE_KEY,
    default_compute_dtype,
    nf4_linear_names,
    packed_shapes,
)
from .safetensors_stream import iter_tensors, read_header

MODES = ("nf4", "bf16", *FORMATS)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class ExpertInfo:
    """What a load did: sizes and speed."""

    format: ExpertFormat
    device: str
    mode: str
    compute_dtype: str
    param_count: int
    bytes_on_device: int
    bytes_read: int
    tensors: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {
            "format": self.format.kind,
            "path": str(self.format.path),
            "config_source": self.format.config_source,
            "device": self.device,
            "mode": self.mode,
            "compute_dtype": self.compute_dtype,
            "param_count": self.param_count,
            "bytes_on_device": self.bytes_on_device,
            "bytes_read": self.bytes_read,
            "tensors": self.tensors,
            "seconds": round(self.seconds, 4),
            "gb_per_s": round(self.gb_per_s, 3),
        }


def _is_host_key(name: str) -> bool:
    return name.endswith(QUANT_STATE_KEY)  # the JSON blob is parsed on the CPU by bnb


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


def _weight_to_host(model: nn.Module, linear: str) -> None:
    """Move one linear's weight (NF4 codes and their QuantState, an FP8 weight and its scale, or a plain weight)
    to the CPU."""
    from ..quant.nf4 import NF4Linear

    mod = model.get_submodule(linear)
    w = mod._parameters["weight"]
    if isinstance(mod, NF4Linear):
        w.quant_state.to("cpu")  # in place: absmax, code and the nested state
        w.data = w.data.cpu()
        return
    for name in ("weight", "weight_scale"):
        p = mod._parameters.get(name)
        if p is not None:
            mod._parameters[name] = nn.Parameter(p.data.cpu(), requires_grad=False)


def _set_param(model: nn.Module, key: str, value: torch.Tensor) -> None:
    mod_name, _, pname = key.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    mod._parameters[pname] = nn.Parameter(value, requires_grad=False)


def device_bytes(model: nn.Module, device: Optional[torch.device] = None) -> tuple[int, int]:
    """(bytes of the weights incl. NF4 statistics, logical parameter count); with `device`, only the weights
    that are on it are counted (block swap keeps some in host memory)."""
    from ..quant.lowp_linear import StoredLowpLinear
    from ..quant.nf4 import NF4Linear

    nbytes = count = 0
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            if isinstance(m, NF4Linear) and name == "weight":
                qs = m.weight.quant_state
                parts = [p.data, qs.absmax, qs.code]
                if qs.nested:
                    parts += [qs.state2.absmax, qs.state2.code, qs.offset]
                held = sum(t.numel() * t.element_size() for t in parts)
                count += m.out_features * m.in_features
            elif name == "weight_scale" and isinstance(m, StoredLowpLinear):
                held = p.numel() * p.element_size()  # statistics, like NF4's absmax: bytes, no parameters
            else:
                held = p.numel() * p.element_size()
                count += p.numel()
            if device is None or p.device == device:
                nbytes += held
    return nbytes, count


def _load_into(fmt: ExpertFormat, device: torch.device, mode: str, compute_dtype: torch.dtype, progress,
               host: Optional[Callable[[str], bool]] = None) -> tuple[WanDiT, ExpertInfo]:
    t0 = time.perf_counter()
    nf4 = mode == "nf4"
    param_dtype = compute_dtype  # unquantized tensors are kept in the compute dtype
    model = WanDiT(fmt.config, device="meta", dtype=param_dtype)
    if nf4:
        from ..quant.nf4 import replace_linears_with_nf4

        replace_linears_with_nf4(model, fmt.config.num_layers, compute_dtype)
    elif mode in FORMATS:
        from ..quant.lowp_linear import replace_linears_with_lowp

        replace_linears_with_lowp(model, fmt.config.num_layers, compute_dtype, mode)
    keys, sources, pt_sd = _file_keys(fmt)
    plan = _plan(model, mode != "bf16", keys, sources)
    total = sum(math.prod(s) * d.itemsize for d, s in keys.values())
    pending: dict[str, dict] = {}
    pending_lowp: dict[str, dict] = {}
    done = tensors = 0

    def lowp_owner(key: str) -> tuple[Optional[str], Optional[str]]:
        owner, comp = _lowp_piece(key, keys[key][0], plan.linears)
        return (owner, comp) if owner in plan.lowp else (None, None)

    def packed_owner(key: str) -> tuple[Optional[str], Optional[str]]:
        if key.endswith(".weight") and key[:-7] in plan.packed:
            return key[:-7], ""
        head, sep, tail = key.partition(".weight.")
        return (head, tail) if sep and head in plan.packed else (None, None)

    def transformed_on_device(key: str) -> bool:
        """Quantized (float file, nf4/fp8/int8 mode) or dequantized (NF4/FP8/INT8 file, bf16 mode): done on the
        device, then moved."""
        if packed_owner(key)[0] is not None:
            return not nf4
        if lowp_owner(key)[0] is not None:
            return mode != fmt.weights
        return key.endswith(".weight") and key[:-7] in plan.float_linear

    to_host = host if host is not None and device.type != "cpu" else (lambda k: False)

    def read_on_host(key: str) -> bool:
        return _is_host_key(key) or (to_host(key) and not transformed_on_device(key))

    for key, t, nbytes in _stream(fmt, device, pt_sd, read_on_host):
        owner, comp = packed_owner(key)
        lowp_name, lowp_comp = lowp_owner(key)
        if lowp_name is not None:
            pieces = pending_lowp.setdefault(lowp_name, {})
            pieces[lowp_comp] = t
            if len(pieces) == 2:
                _finish_lowp(model, lowp_name, pending_lowp.pop(lowp_name), f"{sources[key]}: {lowp_name}")
                if mode != fmt.weights and to_host(key):
                    _weight_to_host(model, lowp_name)
        elif owner is not None:
            pieces = pending.setdefault(owner, {})
            pieces[comp] = t
            if len(pieces) == len(plan.packed[owner]):
                _finish_packed(model, owner, pending.pop(owner), nf4, f"{sources[key]}: {owner}")
                if not nf4 and to_host(key):
                    _weight_to_host(model, owner)
        elif key[:-7] in plan.float_linear and key.endswith(".weight"):
            model.get_submodule(key[:-7]).load_float_weight(t)
            if to_host(key):
                _weight_to_host(model, key[:-7])
        else:
            # Rounded through bf16 like the reference's bf16 load, so every format gives the same model.
            _set_param(model, key, t.to(torch.bfloat16).to(param_dtype))
        del t
        done += nbytes
        tensors += 1
        if progress is not None:
            progress(done, total)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left or pending or pending_lowp:
        raise StateDictMismatch(f"{fmt.path}: not filled after reading every tensor: "
                                f"{(left + list(pending) + list(pending_lowp))[:10]}")
    model.compute_dtype = compute_dtype
    model.requires_grad_(False).eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    nbytes_dev, count = device_bytes(model, device)
    info = ExpertInfo(fmt, str(device), mode, str(compute_dtype).replace("torch.", ""), count, nbytes_dev, done, tensors, seconds)
    return model, info


def _finish_packed(model: WanDiT, name: str, pieces: dict, nf4: bool, where: str) -> None:
    from ..quant.nf4 import NF4Linear

    packed = pieces.pop("")
    if nf4:
        model.get_submodule(name).load_prequantized(packed, pieces, where)
        return
    # bf16 mode from an NF4 file: dequantize on the device with bnb, keep a plain bf16 weight.
    mod = model.get_submodule(name)
    tmp = NF4Linear(mod.in_features, mod.out_features, bias=False, compute_dtype=torch.bfloat16)
    tmp.load_prequantized(packed, pieces, where)
    _set_param(model, f"{name}.weight", tmp.dequantized_weight(torch.bfloat16))


def _finish_lowp(model: WanDiT, name: str, pieces: dict, where: str) -> None:
    """A stored FP8 / INT8 pair: kept as stored (its own mode; check_mode refused the other) or dequantized to a
    plain bf16 weight (bf16 mode)."""
    from ..quant.lowp_linear import LINEAR_CLASSES, StoredLowpLinear, dequantize

    mod = model.get_submodule(name)
    if isinstance(mod, StoredLowpLinear):
        mod.load_stored(pieces["weight"], pieces["scale"], where)
        return
    kind = KIND_OF_DTYPE[pieces["weight"].dtype]  # checked like the stored mode would, then dequantized
    LINEAR_CLASSES[kind](mod.in_features, mod.out_features, bias=False).load_stored(pieces["weight"], pieces["scale"],
                                                                                     where)
    _set_param(model, f"{name}.weight", dequantize(pieces["weight"], pieces["scale"], torch.bfloat16))


def check_mode(fmt: ExpertFormat, mode: str) -> None:
    """Refuse loading stored weights in another quantized mode (NF4 as FP8 / INT8, FP8 as NF4 or INT8...), in one
    line naming the file and the way out; float files load in every mode, and every file as bf16."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {MODES}")
    if mode in FORMATS and fmt.weights not in (mode, "float"):
        raise ExpertLoadError(
            f"{fmt.path} holds {fmt.weights.upper()} weights; --weights {mode} reads an {mode.upper()} folder: make "
            f"one with `lingbot-world {FORMATS[mode].converter} SRC OUT` (from the official bf16 folder for the "
            f"least error), or use --weights {fmt.weights}")
    if mode == "nf4" and fmt.weights in FORMATS:
        raise ExpertLoadError(f"{fmt.path} holds {fmt.weights.upper()} weights ({FORMATS[fmt.weights].name}); load it "
                              f"with --weights {fmt.weights} (or bf16), or pick the NF4 folder for --weights nf4")


def _resolve(device, mode: str, compute_dtype: Optional[torch.dtype]) -> tuple[torch.device, torch.dtype]:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available in this process; load with device='cpu' or fix the CUDA install")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {MODES}")
    if mode in FORMATS:
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(mode, device)
    if mode == "bf16":
        if compute_dtype not in (None, torch.bfloat16):
            raise ValueError(f"mode 'bf16' computes in bfloat16; compute_dtype={compute_dtype} is not possible")
        return device, torch.bfloat16
    compute_dtype = compute_dtype or default_compute_dtype(device)
    if compute_dtype not in FLOAT_DTYPES:
        raise ValueError(f"compute_dtype {compute_dtype}: choose float32, bfloat16 or float16")
    return device, compute_dtype


def load_expert_with_info(
    path: Union[str, Path, ExpertFormat],
    device: Union[str, torch.device] = "cuda",
    mode: str = "nf4",
    compute_dtype: Optional[torch.dtype] = None,
    progress: Optional[Progress] = None,
    host: Optional[Callable[[str], bool]] = None,
) -> tuple[WanDiT, ExpertInfo]:
    """Like `load_expert`, also returning the load statistics."""
    device, compute_dtype = _resolve(device, mode, compute_dtype)
    fmt = path if isinstance(path, ExpertFormat) else detect_format(path)
    check_mode(fmt, mode)
    try:
        return _load_into(fmt, device, mode, compute_dtype, progress, host)
    except BaseException as exc:
        # The traceback's frames still reference the half-built model and the last tensors read: drop them,
        # then give the memory back before the error reaches the caller.
        traceback.clear_frames(exc.__traceback__)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise


def load_expert(
    path: Union[str, Path, ExpertFormat],
    device: Union[str, torch.device] = "cuda",
    mode: str = "nf4",
    compute_dtype: Optional[torch.dtype] = None,
    progress: Optional[Progress] = None,
    host: Optional[Callable[[str], bool]] = None,
) -> WanDiT:
    """Load an expert (any kind `detect_format` knows) onto `device`.

    mode "nf4": the 569 linears become bnb NF4 (pre-quantized files are used as stored; float files are
    quantized on `device`); "fp8" / "int8": the same linears become `Fp8Linear` / `Int8Linear` (the folder's
    stored weights and scales as stored; float files quantized on `device`; the device must run the kind's GEMMs,
    see quant.compute.check_lowp_weights; other quantized files are refused, see `check_mode`); "bf16": plain bf16 model. compute_dtype: dtype of the GEMMs and of the
    unquantized parameters (default bf16 on CUDA, float32 on CPU; "bf16" mode is always bf16).
    progress(done_bytes, total_bytes) is called after each tensor; raising from it cancels the load cleanly.
    host(key) -> True keeps that tensor in host memory instead (block swap: the streamed blocks); weights that
    must be quantized or dequantized still pass through `device` one at a time, so the work stays on the GPU.
    The statistics are on `model.load_info` (an ExpertInfo).
    """
    model, info = load_expert_with_info(path, device, mode, compute_dtype, progress, host)
    model.load_info = info
    return model


def check_expert_keys(fmt: ExpertFormat, mode: str = "nf4") -> None:
    """Every tensor the model needs is in the file(s) with the right shape, from the headers alone (nothing read):
    raises StateDictMismatch naming the missing or wrong tensors. Lets a caller refuse before expensive work."""
    check_mode(fmt, mode)
    # Plain linears on `meta` have the NF4 shells' names and (out, in) features, all the key plan reads: the check
    # needs no bitsandbytes (the CLI imports it in the background meanwhile).
    model = WanDiT(fmt.config, device="meta")
    keys, sources, _ = _file_keys(fmt)
    _plan(model, mode != "bf16", keys, sources)

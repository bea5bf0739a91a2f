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

This module holds the public load (`load_expert`, `check_mode`, `check_expert_keys`) and the loop that drives it;
the keys' check and the reading are in expert_keys.py, putting tensors in place in expert_placement.py.
"""
from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..quant.lowp_format import FORMATS
from ..quant.nf4_format import QUANT_STATE_KEY, default_compute_dtype
from ..wan.dit.model import StateDictMismatch, WanDiT
from .expert_format import ExpertFormat, ExpertLoadError, detect_format
from .expert_keys import FLOAT_DTYPES, _file_keys, _lowp_piece, _plan, _stream
from .expert_placement import _finish_lowp, _finish_packed, _set_param, _weight_to_host, device_bytes

MODES = ("nf4", "bf16", *FORMATS)
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

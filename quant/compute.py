"""Which GEMM precision a GPU can run for the NF4 linears (bf16 / FP8 / INT8), checked with a tiny real GEMM, and
whether it runs stored FP8 / INT8 weights (`--weights fp8`, `--weights int8`)."""
from __future__ import annotations

from typing import Optional

import torch

from . import fp8, fp16acc, int8


def _capability(device: torch.device) -> Optional[tuple[int, int]]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _probe(mode: str, device: torch.device) -> Optional[str]:
    """Run one small GEMM of the mode on the device; the error text if the build or card refuses it."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(64, 64, device=device, generator=g, dtype=torch.bfloat16)
        w = torch.randn(32, 64, device=device, generator=g, dtype=torch.bfloat16)
        if mode == "fp16acc":
            y = fp16acc.linear(x, w.half(), None, torch.bfloat16)
        else:
            mod = fp8 if mode == "fp8" else int8
            y = mod.linear(x, *mod.quantize_weight(w), None, torch.bfloat16)
        ref = x.float() @ w.float().t()
        err = ((y.float() - ref).norm() / ref.norm()).item()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - any refusal of the kernel is the answer
        return type(e).__name__ + ": " + str(e).partition("\n")[0][:200]
    if not err < 0.1:
        return f"a test GEMM gave a relative error of {err:.3g}"
    return None


def unavailable_reason(mode: str, device: torch.device) -> Optional[str]:
    """Why `mode` ("fp8", "int8", "fp16acc") cannot run on `device`, or None."""
    device = torch.device(device)
    cap = _capability(device)
    if cap is None:
        return f"{mode.upper()} GEMMs need a CUDA GPU (this run is on {device.type})"
    name = torch.cuda.get_device_name(device)
    if mode == "fp8":
        if cap < (8, 9):
            return (f"{name} (sm{cap[0]}{cap[1]}) has no FP8 tensor cores; FP8 needs an RTX 40xx / Ada, Hopper or "
                    "newer card (sm89+); INT8 (--compute int8) runs on Ampere")
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return f"this torch {torch.__version__} has no FP8 matmul (torch._scaled_mm); update torch"
    elif mode == "int8":
        if cap < (7, 5):
            return f"{name} (sm{cap[0]}{cap[1]}) has no INT8 tensor-core GEMMs usable from torch"
        if not hasattr(torch, "_int_mm"):
            return f"this torch {torch.__version__} has no INT8 matmul (torch._int_mm); update torch"
    elif mode == "fp16acc":
        if cap < (7, 0):
            return f"{name} (sm{cap[0]}{cap[1]}) has no fp16 tensor cores"
        if not fp16acc.available():
            return f"this torch {torch.__version__} cannot accumulate GEMMs in fp16 (needs torch 2.7+)"
    else:
        raise ValueError(f"unknown low-precision mode {mode!r}")
    problem = _probe(mode, device)
    if problem:
        return f"a test {mode.upper()} GEMM failed on {name} ({problem})"
    return None


def auto_mode(device: torch.device) -> tuple[str, str]:
    """(mode, why) for compute="auto": FP8 on sm89+, INT8 on Ampere (sm80-86), else the exact bf16."""
    device = torch.device(device)
    cap = _capability(device)
    if cap is None:
        return "bf16", f"no low-precision GEMMs on the {device.type}"
    arch = f"sm{cap[0]}{cap[1]}"
    if cap >= (8, 9):
        problem = unavailable_reason("fp8", device)
        return ("fp8", f"{arch} has FP8 tensor cores") if problem is None else ("bf16", problem)
    if cap >= (8, 0):
        problem = unavailable_reason("int8", device)
        return ("int8", f"{arch} has no FP8 but runs INT8 at 4x bf16") if problem is None else ("bf16", problem)
    return "bf16", f"{arch}: no faster GEMM path than bf16"


class LowpWeightsUnsupported(ValueError):
    """`--weights fp8/int8` asked for on a device whose tensor cores cannot run it (a choice the user can change)."""


def stored_weights_unavailable(kind: str, device: torch.device) -> Optional[str]:
    """Why stored `kind` weights (`--weights fp8` / `--weights int8`) cannot run on `device`, or None. The CPU runs
    them (FP8's float32 emulation, torch's CPU `_int_mm`: tests, the demo); a GPU needs the kind's tensor cores
    (quant/lowp_format.FORMATS: sm89+ / sm80+), torch's matmul for it and a test GEMM that works."""
    from .lowp_format import FORMATS

    fmt, flag = FORMATS[kind], f"--weights {kind}"
    device = torch.device(device)
    if device.type == "cpu":
        return None
    cap = _capability(device)
    if cap is None:
        return f"{flag} runs on a CUDA GPU with {fmt.label} tensor cores or on the CPU, not on {device.type}"
    if cap < fmt.min_capability:
        return f"{flag} needs {fmt.arch}; this card is sm{cap[0]}{cap[1]}: use --weights nf4"
    mm = _MATMULS[kind]
    if not hasattr(torch, mm):
        return f"{flag}: this torch {torch.__version__} has no {fmt.label} matmul (torch.{mm}); update torch"
    problem = _probe(kind, device)
    if problem:
        return f"{flag}: a test {fmt.label} GEMM failed on {torch.cuda.get_device_name(device)} ({problem}); " \
               "use --weights nf4"
    return None


_MATMULS = {"fp8": "_scaled_mm", "int8": "_int_mm"}


def check_lowp_weights(kind: str, device: torch.device) -> None:
    """Raise LowpWeightsUnsupported (one line) before anything loads when `--weights kind` cannot run here."""
    problem = stored_weights_unavailable(kind, device)
    if problem:
        raise LowpWeightsUnsupported(problem)

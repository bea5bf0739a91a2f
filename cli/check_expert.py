"""`lingbot-world check-expert PATH`: load one DiT expert and print what it took, as JSON.

Reports the format found, parameter count, bytes on the device, seconds, GB/s read, peak host RSS growth
(VmHWM from /proc/self/status, reset just before the load) and peak VRAM.
"""
from __future__ import annotations

import json
import sys

from ..quant.lowp_kinds import LOWP_WEIGHTS
from .errors import exit_code_for


def add_parser(sub) -> None:
    p = sub.add_parser("check-expert", help="load one DiT expert (NF4 or official) and print load statistics as JSON")
    p.add_argument("path", help="expert folder (…_bnb_nf4/, high_noise_model/) or a single .safetensors file")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to load it (default: cuda when available)")
    p.add_argument("--mode", choices=["nf4", "bf16", "fp8", "int8"], default="nf4",
                   help="keep/quantize NF4, load bf16, or (the Fast model) load its FP8 / INT8 copy or quantize to "
                        "FP8 / INT8")
    p.set_defaults(func=run)


def check_expert(path: str, device: str | None = None, mode: str = "nf4") -> dict:
    """Load the expert once and return the statistics (the model is dropped afterwards)."""
    import torch

    from ..memory.memstats import PeakRSS, peak_vram_bytes, reset_peak_vram
    from ..loaders.expert_format import detect_format
    from ..loaders.expert_loader import load_expert_with_info

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.is_available():
        torch.empty(1, device="cuda")  # the CUDA context's own host memory is not the loader's
        reset_peak_vram()
    fmt = detect_format(path)
    if mode in LOWP_WEIGHTS:
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(mode, torch.device(device))
    with PeakRSS() as rss:
        model, info = load_expert_with_info(fmt, device, mode)
    out = {"ok": True, **info.to_json(), "config": fmt.config.to_json(), "files": [str(p) for p in fmt.files],
           "file_bytes": fmt.file_bytes, "peak_rss_growth_bytes": rss.growth}
    if device == "cuda":
        out["peak_vram_bytes"] = peak_vram_bytes()
    del model
    return out


def run(args) -> int:
    try:
        out = check_expert(args.path, args.device, args.mode)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "path": args.path, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0

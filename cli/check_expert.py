"""`lingbot-world check-expert PATH`: load one DiT expert and print what it took, as JSON.

Reports the format found, parameter count, bytes on the device, seconds, GB/s read, peak host RSS growth
(VmHWM from /proc/self/status, reset just before the load) and peak VRAM (world/expert_stats.py measures them).
"""
from __future__ import annotations

import json
import sys

from .errors import exit_code_for


def add_parser(sub) -> None:
    p = sub.add_parser("check-expert", help="load one DiT expert (NF4 or official) and print load statistics as JSON")
    p.add_argument("path", help="expert folder (…_bnb_nf4/, high_noise_model/) or a single .safetensors file")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to load it (default: cuda when available)")
    p.add_argument("--mode", choices=["nf4", "bf16", "fp8", "int8"], default="nf4",
                   help="keep/quantize NF4, load bf16, or (the Fast model) load its FP8 / INT8 copy or quantize to "
                        "FP8 / INT8")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..world.expert_stats import load_stats

    try:
        out = load_stats(args.path, args.device, args.mode)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "path": args.path, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0

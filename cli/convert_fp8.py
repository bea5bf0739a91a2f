"""`lingbot-world convert-fp8 SRC OUT`: an expert (the official bf16 Fast folder, or an NF4 folder) -> FP8 folder.

OUT (e.g. lingbot_world_fast_fp8/) gets model.safetensors (e4m3 weights, one float32 scale per output channel),
config.json and quantization_meta.json, written under a temp name and renamed when complete; an existing OUT is
never replaced. From NF4 the weights are dequantized first, so the NF4 error and the FP8 error add up (the output
line and the metadata say so).
"""
from __future__ import annotations

import json
import sys
import time

from .errors import exit_code_for


def add_parser(sub) -> None:
    p = sub.add_parser("convert-fp8", help="quantize an expert (official bf16 or NF4) to FP8 weights for --weights fp8")
    p.add_argument("src", help="official expert folder (e.g. lingbot_world_fast/), an NF4 folder, or one .safetensors")
    p.add_argument("out", help="new output folder (e.g. lingbot_world_fast_fp8/); must not exist")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..loaders.fp8_writer import convert_to_fp8

    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > 2 or done == total:
            last[0] = now
            print(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        stats = convert_to_fp8(args.src, args.out, device=args.device, progress=progress)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "src": args.src, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    print(json.dumps({"ok": True, "src": args.src, "out": args.out, **stats,
                      "seconds": round(time.perf_counter() - t0, 2)}, indent=2))
    return 0

"""`lingbot-world convert-expert SRC OUT`: official expert (fp32/bf16 shards) -> community NF4 folder.

Streams tensor by tensor: each linear weight is read to the device (CUDA when available), cast to bf16,
quantized with bitsandbytes NF4 (blocksize 64, double quant) and written; RAM holds one tensor at a time.
OUT gets model.safetensors, config.json (copied) and quantization_meta.json.
"""
from __future__ import annotations

import json
import sys

from .errors import exit_code_for
import time


def add_parser(sub) -> None:
    p = sub.add_parser("convert-expert", help="quantize an official expert folder to the community NF4 layout")
    p.add_argument("src", help="official expert folder (e.g. high_noise_model/) or a plain .safetensors expert")
    p.add_argument("out", help="output folder (e.g. high_noise_model_bnb_nf4/)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..loaders.nf4_writer import convert_official_to_nf4

    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > 2 or done == total:
            last[0] = now
            print(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        stats = convert_official_to_nf4(args.src, args.out, device=args.device, progress=progress)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "src": args.src, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    print(json.dumps({"ok": True, "src": args.src, "out": args.out, **stats, "seconds": round(time.perf_counter() - t0, 2)}, indent=2))
    return 0

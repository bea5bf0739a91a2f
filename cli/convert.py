"""`lingbot-world convert-expert SRC OUT` and `convert-fp8 SRC OUT` / `convert-int8 SRC OUT`: stored copies of a
model's weights (world/convert.py does the work; each copy records which model it is and its licence).

- convert-expert: an official expert (fp32/bf16 shards) -> a community NF4 folder. Streams tensor by tensor: each
  linear weight is read to the device (CUDA when available), cast to bf16, quantized with bitsandbytes NF4
  (blocksize 64, double quant) and written; RAM holds one tensor at a time. OUT gets model.safetensors, config.json
  (copied) and quantization_meta.json.
- convert-fp8 / convert-int8: an expert (the official bf16 Fast folder, or an NF4 folder) -> a folder of stored FP8
  (sm89+) or INT8 (sm80+, Ampere) weights. OUT (e.g. lingbot_world_fast_fp8/) gets model.safetensors (e4m3 or int8
  weights, one float32 scale per output channel), config.json and quantization_meta.json, written under a temp name
  and renamed when complete; an existing OUT is never replaced. From NF4 the weights are dequantized first, so the
  NF4 error and the new one add up (the output line and the metadata say so).
Progress goes to stderr, one JSON result to stdout.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, Optional

from .errors import exit_code_for

PROGRESS_EVERY_S = 2.0
# kind -> what its weights are for (the sub-command's help)
_FOR = {"fp8": "FP8 weights for --weights fp8 (RTX 40xx, sm89+)",
        "int8": "INT8 weights for --weights int8 (RTX 30xx and newer, sm80+)"}


def add_parser(sub) -> None:
    p = sub.add_parser("convert-expert", help="quantize an official expert folder to the community NF4 layout")
    p.add_argument("src", help="official expert folder (e.g. high_noise_model/) or a plain .safetensors expert")
    p.add_argument("out", help="output folder (e.g. high_noise_model_bnb_nf4/)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    add_model_argument(p)
    p.set_defaults(func=run, weights="nf4")
    for kind, purpose in _FOR.items():
        folder = f"lingbot_world_fast_{kind}/"
        p = sub.add_parser(f"convert-{kind}", help=f"quantize an expert (official bf16 or NF4) to {purpose}")
        p.add_argument("src", help="official expert folder (e.g. lingbot_world_fast/), an NF4 folder, or one "
                                   ".safetensors")
        p.add_argument("out", help=f"new output folder (e.g. {folder}); must not exist")
        p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                       help="where to quantize (default: cuda when available)")
        add_model_argument(p)
        p.set_defaults(func=run, weights=kind)


def add_model_argument(p) -> None:
    from ..world.models import entries

    p.add_argument("--model", default=None, choices=[e.name for e in entries()],
                   help="which model the files are, where they cannot say (v1 Fast and the v2 14B have the same "
                        "tensors); default: told from the weights. The copy records the model and its licence")


def run(args) -> int:
    from functools import partial

    from ..world.convert import convert

    return run_converter(partial(convert, weights=args.weights, model=args.model), args.src, args.out, args.device)


def run_converter(convert: Callable[..., dict], src: str, out: str, device: Optional[str]) -> int:
    """convert(src, out, device=, progress=) -> stats; prints them as JSON (or the error, with its exit code)."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > PROGRESS_EVERY_S or done == total:
            last[0] = now
            print(f"  {done / 1e9:.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        stats = convert(src, out, device=device, progress=progress)
    except (OSError, ValueError, RuntimeError) as e:  # JSON for scripts; the exit code says whose fault
        print(json.dumps({"ok": False, "src": src, "error": f"{type(e).__name__}: {e}"}, indent=2))
        return exit_code_for(e)
    print(json.dumps({"ok": True, "src": src, "out": out, **stats, "seconds": round(time.perf_counter() - t0, 2)},
                     indent=2))
    return 0

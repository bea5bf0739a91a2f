"""`lingbot-world convert-fp8 SRC OUT` / `convert-int8 SRC OUT`: an expert (the official bf16 Fast folder, or an
NF4 folder) -> a folder of stored FP8 (sm89+) or INT8 (sm80+, Ampere) weights.

OUT (e.g. lingbot_world_fast_fp8/ or lingbot_world_fast_int8/) gets model.safetensors (e4m3 or int8 weights, one
float32 scale per output channel), config.json and quantization_meta.json, written under a temp name and renamed
when complete; an existing OUT is never replaced. From NF4 the weights are dequantized first, so the NF4 error and
the new one add up (the output line and the metadata say so).
"""
from __future__ import annotations

from .convert_expert import add_model_argument

# kind -> what its weights are for (the sub-command's help)
_FOR = {"fp8": "FP8 weights for --weights fp8 (RTX 40xx, sm89+)",
        "int8": "INT8 weights for --weights int8 (RTX 30xx and newer, sm80+)"}


def add_parser(sub) -> None:
    for kind, purpose in _FOR.items():
        folder = f"lingbot_world_fast_{kind}/"
        p = sub.add_parser(f"convert-{kind}", help=f"quantize an expert (official bf16 or NF4) to {purpose}")
        p.add_argument("src", help="official expert folder (e.g. lingbot_world_fast/), an NF4 folder, or one "
                                   ".safetensors")
        p.add_argument("out", help=f"new output folder (e.g. {folder}); must not exist")
        p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                       help="where to quantize (default: cuda when available)")
        add_model_argument(p)
        p.set_defaults(func=run, lowp_kind=kind)


def run(args) -> int:
    from functools import partial

    from ..world.convert import convert
    from .convert_run import run_converter

    return run_converter(partial(convert, weights=args.lowp_kind, model=args.model), args.src, args.out,
                         args.device)

"""`lingbot-world convert-fp8 SRC OUT`: an expert (the official bf16 Fast folder, or an NF4 folder) -> FP8 folder.

OUT (e.g. lingbot_world_fast_fp8/) gets model.safetensors (e4m3 weights, one float32 scale per output channel),
config.json and quantization_meta.json, written under a temp name and renamed when complete; an existing OUT is
never replaced. From NF4 the weights are dequantized first, so the NF4 error and the FP8 error add up (the output
line and the metadata say so).
"""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert-fp8", help="quantize an expert (official bf16 or NF4) to FP8 weights for --weights fp8")
    p.add_argument("src", help="official expert folder (e.g. lingbot_world_fast/), an NF4 folder, or one .safetensors")
    p.add_argument("out", help="new output folder (e.g. lingbot_world_fast_fp8/); must not exist")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..loaders.fp8_writer import convert_to_fp8
    from .convert_run import run_converter

    return run_converter(convert_to_fp8, args.src, args.out, args.device)

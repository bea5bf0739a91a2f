"""`lingbot-world convert-expert SRC OUT`: official expert (fp32/bf16 shards) -> community NF4 folder.

Streams tensor by tensor: each linear weight is read to the device (CUDA when available), cast to bf16,
quantized with bitsandbytes NF4 (blocksize 64, double quant) and written; RAM holds one tensor at a time.
OUT gets model.safetensors, config.json (copied) and quantization_meta.json.
"""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert-expert", help="quantize an official expert folder to the community NF4 layout")
    p.add_argument("src", help="official expert folder (e.g. high_noise_model/) or a plain .safetensors expert")
    p.add_argument("out", help="output folder (e.g. high_noise_model_bnb_nf4/)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..loaders.nf4_writer import convert_official_to_nf4
    from .convert_run import run_converter

    return run_converter(convert_official_to_nf4, args.src, args.out, args.device)

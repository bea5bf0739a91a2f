"""`lingbot-world convert-expert SRC OUT`: official expert (fp32/bf16 shards) -> community NF4 folder.

Streams tensor by tensor: each linear weight is read to the device (CUDA when available), cast to bf16,
quantized with bitsandbytes NF4 (blocksize 64, double quant) and written; RAM holds one tensor at a time.
OUT gets model.safetensors, config.json (copied) and quantization_meta.json; the copy records which model it is
and its licence (world/convert.py).
"""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert-expert", help="quantize an official expert folder to the community NF4 layout")
    p.add_argument("src", help="official expert folder (e.g. high_noise_model/) or a plain .safetensors expert")
    p.add_argument("out", help="output folder (e.g. high_noise_model_bnb_nf4/)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="where to quantize (default: cuda when available)")
    add_model_argument(p)
    p.set_defaults(func=run)


def add_model_argument(p) -> None:
    from ..world.models import entries

    p.add_argument("--model", default=None, choices=[e.name for e in entries()],
                   help="which model the files are, where they cannot say (v1 Fast and the v2 14B have the same "
                        "tensors); default: told from the weights. The copy records the model and its licence")


def run(args) -> int:
    from functools import partial

    from ..world.convert import convert
    from .convert_run import run_converter

    return run_converter(partial(convert, weights="nf4", model=args.model), args.src, args.out, args.device)

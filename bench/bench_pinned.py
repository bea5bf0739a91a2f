"""Benchmark: how fast the Fast model's pinned K/V cache (or any large pinned host copy) can be allocated.

    python -m lingbot_world.bench.bench_pinned --layers 27 --layer-mib 640 --out bench/results/pinned_h100.json

The 480x832x81 cache on a 24 GB card keeps 27 layers of 640 MiB in page-locked RAM; allocating them one by one
(`HostBuffer`: malloc, then cudaHostRegister faulting every page in) took 8.1 s of the Fast model's 49 s end to
end on the H100. Each variant allocates and frees the same layers: `serial` (one after another), `prefault` (pages
touched first by torch's multi-threaded zero_, then registered), and `threads<N>` (N layers at a time, each
prefaulted and registered in a worker thread). Seconds and GB/s per variant go to JSON.
"""
from __future__ import annotations

import argparse
import gc
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ..memory.host_buffer import HostBuffer
from .common import machine_info, write_json

MiB = 1024**2


def _alloc(nbytes: int, prefault: bool) -> HostBuffer:
    return HostBuffer(nbytes, pin=True, prefault=prefault)


def run_variant(name: str, layers: int, nbytes: int) -> dict:
    t0 = time.perf_counter()
    if name.startswith("threads"):
        with ThreadPoolExecutor(int(name[len("threads"):])) as pool:
            bufs = list(pool.map(lambda _: _alloc(nbytes, True), range(layers)))
    else:
        bufs = [_alloc(nbytes, name == "prefault") for _ in range(layers)]
    seconds = time.perf_counter() - t0
    how = sorted({b.how for b in bufs})
    for b in bufs:
        b.close()
    del bufs
    gc.collect()
    total = layers * nbytes
    return {"seconds": round(seconds, 3), "gb_per_s": round(total / seconds / 1e9, 2), "how": how}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=27, help="number of host layers to allocate")
    p.add_argument("--layer-mib", type=int, default=640, help="bytes per layer (MiB)")
    p.add_argument("--variants", default="serial,prefault,threads4,threads8",
                   help="comma-separated: serial, prefault, threads<N>")
    p.add_argument("--out", default="pinned.json", help="JSON file to write")
    args = p.parse_args(argv)
    res = {"bench": "pinned", "machine": machine_info(), "layers": args.layers, "layer_mib": args.layer_mib,
           "torch_threads": torch.get_num_threads(), "variants": {}}
    for name in args.variants.split(","):
        res["variants"][name] = run_variant(name, args.layers, args.layer_mib * MiB)
        print(name, res["variants"][name], flush=True)
        write_json(args.out, res)


if __name__ == "__main__":
    main()

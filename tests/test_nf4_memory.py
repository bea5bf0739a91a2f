"""Host memory of a load is bounded by one tensor, not by the file: measured in child processes (VmHWM).

Synthetic NF4 experts of ~0.5 GB and ~1.1 GB (dim 1024, many blocks; one quantized weight per shape, repeated)
are loaded onto the CPU in a fresh process. On a CPU target the loaded weights themselves live in host RAM, so
what is bounded is the peak growth beyond them: <= 300 MB + the largest tensor, and about the same at both
sizes. (An mmap-based reader would add the whole file to RSS; a host-side float model four times that. The
reader alone, `--mode stream` of the benchmark's child, grows by ~26 MB for the 1.1 GB file.)
"""
import dataclasses
import shutil

import pytest

from lingbot_world.bench.common import run_json_child
from lingbot_world.loaders.nf4_writer import make_random_nf4_expert
from lingbot_world.loaders.safetensors_stream import read_header
from lingbot_world.wan.dit.model import DiTConfig

BASE = DiTConfig(dim=1024, ffn_dim=2048, freq_dim=256, num_heads=8, text_dim=64, num_layers=1)
SLACK = 300e6


def _child(path, mode):
    return run_json_child(["-m", "lingbot_world.bench.bench_nf4_load", "--child-load", str(path), "--device", "cpu", "--mode", mode], timeout=120)


@pytest.mark.slow
def test_load_memory_is_bounded_by_one_tensor(tmp_path):
    overheads = {}
    for layers in (56, 128):
        d = tmp_path / f"e{layers}_bnb_nf4"
        make_random_nf4_expert(dataclasses.replace(BASE, num_layers=layers), d, device="cpu", reuse_per_shape=True)
        header = read_header(d / "model.safetensors")
        largest = max(e.nbytes for e in header.entries.values())
        assert header.file_size > (0.45e9 if layers == 56 else 1.05e9)
        r = _child(d, "nf4")
        assert "error" not in r, r
        overhead = r["rss_growth_bytes"] - r["bytes_on_device"]
        print(f"{header.file_size / 1e9:.2f} GB file: RSS growth {r['rss_growth_bytes'] / 1e6:.0f} MB, weights "
              f"{r['bytes_on_device'] / 1e6:.0f} MB, loader overhead {overhead / 1e6:.1f} MB, largest tensor {largest / 1e6:.1f} MB")
        assert overhead <= SLACK + largest
        overheads[layers] = overhead
        shutil.rmtree(d)
    # Twice the file, about the same overhead (per-tensor Python objects are all that grows).
    assert abs(overheads[128] - overheads[56]) < 100e6

"""The streaming safetensors reader/writer against the `safetensors` package as the independent reference."""
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file as st_save_file

from lingbot_world.loaders.safetensors_stream import (
    SafetensorsFormatError,
    SafetensorsWriter,
    iter_tensors,
    load_file,
    read_header,
)


def _sample() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, 2, generator=g).bfloat16(),
        "f16": torch.randn(4, generator=g).half(),
        "u8": torch.randint(0, 255, (9, 1), generator=g, dtype=torch.uint8),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def _write_raw(path, header: dict, data: bytes, hlen=None) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)


def test_reader_matches_safetensors(tmp_path):
    ref = _sample()
    p = tmp_path / "ref.safetensors"
    st_save_file(ref, str(p), metadata={"config": "{}"})
    header = read_header(p)
    assert header.metadata == {"config": "{}"}
    got = load_file(p)
    assert got.keys() == ref.keys()
    with safe_open(str(p), "pt") as f:
        for k in ref:
            t = f.get_tensor(k)
            assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k
    # file order, subset, host-only predicate
    order = [k for k, _ in iter_tensors(p, "cpu")]
    assert order == sorted(order, key=lambda k: header.entries[k].begin)
    sub = dict(iter_tensors(p, "cpu", names=["u8", "bf16"], host=lambda n: True))
    assert sub.keys() == {"u8", "bf16"} and torch.equal(sub["u8"], ref["u8"])


def test_reader_chunks_bigger_than_staging(tmp_path):
    # A CPU target reads each tensor whole; the chunk size only matters for CUDA, but must not change results.
    t = torch.randn(1000, 300)
    p = tmp_path / "big.safetensors"
    st_save_file({"w": t}, str(p))
    (name, got), = list(iter_tensors(p, "cpu", chunk_bytes=4096))
    assert name == "w" and torch.equal(got, t)


@pytest.mark.parametrize("reserve", [1 << 16, 64])  # 64 forces the header to be moved in front of the data
def test_writer_roundtrip(tmp_path, reserve):
    ref = _sample()
    p = tmp_path / "ours.safetensors"
    with SafetensorsWriter(p, {"k": "v"}, header_reserve=reserve) as w:
        for k, v in ref.items():
            w.add(k, v)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ours.safetensors"]  # no temp file left
    got = st_load_file(str(p))
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), k
    with safe_open(str(p), "pt") as f:
        assert f.metadata() == {"k": "v"}
    assert (read_header(p).data_start % 8) == 0


def test_writer_abort_leaves_no_file(tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(RuntimeError):
        with SafetensorsWriter(p) as w:
            w.add("a", torch.ones(3))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    w = SafetensorsWriter(p)
    with pytest.raises(ValueError, match="twice"):
        w.add("a", torch.ones(1))
        w.add("a", torch.ones(1))
    w.abort()


def test_truncated_file(tmp_path):
    p = tmp_path / "t.safetensors"
    st_save_file({"a": torch.ones(100), "b": torch.ones(100)}, str(p))
    raw = p.read_bytes()
    p.write_bytes(raw[:-10])
    with pytest.raises(SafetensorsFormatError, match=r"t\.safetensors.*key 'b'.*truncated"):
        read_header(p)
    p.write_bytes(raw[:20])
    with pytest.raises(SafetensorsFormatError, match="header length .* does not fit"):
        read_header(p)
    p.write_bytes(b"abc")
    with pytest.raises(SafetensorsFormatError, match="too small"):
        read_header(p)


def test_corrupted_header(tmp_path):
    p = tmp_path / "c.safetensors"
    h = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'  # cut JSON
    p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(8))
    with pytest.raises(SafetensorsFormatError, match=r"c\.safetensors.*not valid JSON.*download or convert it again"):
        read_header(p)


def test_header_validation(tmp_path):
    p = tmp_path / "v.safetensors"
    _write_raw(p, {"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))
    with pytest.raises(SafetensorsFormatError, match="key 'a'.*unknown dtype 'Q7'"):
        read_header(p)
    _write_raw(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(12))
    with pytest.raises(SafetensorsFormatError, match=r"key 'a'.*shape \(3,\) of F32 needs 12 bytes, the file gives 8"):
        read_header(p)
    _write_raw(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12))
    with pytest.raises(SafetensorsFormatError, match="overlaps"):
        read_header(p)
    with pytest.raises(FileNotFoundError, match="not found"):
        read_header(tmp_path / "missing.safetensors")


def test_truncated_during_read_names_key(tmp_path):
    # A header that passes validation but a file that shrinks before the read (e.g. a download in progress).
    p = tmp_path / "s.safetensors"
    st_save_file({"a": torch.ones(1000)}, str(p))
    header = read_header(p)
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(SafetensorsFormatError, match="key 'a'.*truncated"):
        list(iter_tensors(header, "cpu"))

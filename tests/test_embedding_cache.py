"""Prompt-embedding cache: keys, atomic writes, corruption handling, hit time."""
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.text_encoder import cache as ec
from lingbot_world.text_encoder.cache import CacheKey, EmbeddingCache, default_cache_dir, file_identity

ENC = {"path": "/models/models_t5_umt5-xxl-enc-bf16.pth", "size": 11361920418, "mtime_ns": 1}
TOK = {"kind": "tokenizer.json", "path": "/models/google/umt5-xxl/tokenizer.json", "size": 16837417, "mtime_ns": 2}


def key(text="a prompt", **over) -> CacheKey:
    fields = dict(encoder=ENC, tokenizer=TOK, text=text)
    fields.update(over)
    return CacheKey(**fields)


def test_roundtrip_and_layout(tmp_path):
    cache = EmbeddingCache(tmp_path / "c")
    emb = torch.randn(17, 4096).bfloat16()
    assert cache.get(key()) is None
    path = cache.put(key(), emb)
    assert path.parent == tmp_path / "c" and path.suffix == ".safetensors"
    assert [p.name for p in (tmp_path / "c").iterdir()] == [path.name]  # no temp file left behind
    got = cache.get(key())
    assert got.dtype == torch.bfloat16 and torch.equal(got, emb)


def test_key_covers_encoder_tokenizer_text_dtype_length():
    base = key().digest()
    variants = [
        key(text="a prompt "), key(text="A prompt"), key(dtype="float32"), key(max_length=256),
        key(encoder={**ENC, "mtime_ns": 3}), key(encoder={**ENC, "size": 5}),
        key(encoder={**ENC, "path": "/other.pth"}), key(tokenizer={**TOK, "kind": "spiece.model"}),
    ]
    digests = {v.digest() for v in variants}
    assert base not in digests and len(digests) == len(variants)
    assert '"text_len": 8' in key().canonical()


def test_corrupted_entry_is_removed(tmp_path):
    cache = EmbeddingCache(tmp_path)
    path = cache.put(key(), torch.randn(3, 8).bfloat16())
    path.write_bytes(path.read_bytes()[:40])  # truncated write from a crash
    assert cache.get(key()) is None
    assert not path.exists()


def test_metadata_mismatch_is_a_miss(tmp_path):
    cache = EmbeddingCache(tmp_path)
    src = cache.put(key("one"), torch.randn(3, 8).bfloat16())
    dst = cache.path_for(key("two"))
    os.replace(src, dst)  # a file under the wrong name must not be served for "two"
    assert cache.get(key("two")) is None and not dst.exists()

    save_file({"embedding": torch.randn(3, 8)}, str(dst), metadata={"key": key("two").canonical()})
    assert cache.get(key("two")) is None  # float32 tensor for a bfloat16 key
    save_file({"other": torch.randn(3, 8).bfloat16()}, str(dst), metadata={"key": key("two").canonical()})
    assert cache.get(key("two")) is None


def test_failed_write_keeps_the_old_entry(tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path)
    old = torch.randn(3, 8).bfloat16()
    cache.put(key(), old)

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ec, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        cache.put(key(), torch.zeros(3, 8).bfloat16())
    assert len(list(tmp_path.iterdir())) == 1
    assert torch.equal(cache.get(key()), old)


def test_bad_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"\[L, dim\]"):
        EmbeddingCache(tmp_path).put(key(), torch.zeros(1, 3, 8))


def test_default_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "lingbot-world" / "text"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "lingbot-world" / "text"
    assert EmbeddingCache().root == tmp_path / "lingbot-world" / "text"


def test_file_identity(tmp_path):
    f = tmp_path / "enc.pth"
    f.write_bytes(b"1234")
    ident = file_identity(f)
    assert ident == {"path": str(f.resolve()), "size": 4, "mtime_ns": f.stat().st_mtime_ns}


def test_hit_time_full_size_entry(tmp_path):
    cache = EmbeddingCache(tmp_path)
    k = key()
    cache.put(k, torch.randn(512, 4096).bfloat16())  # the largest possible entry: 4 MiB
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        assert cache.get(k) is not None
        times.append(time.perf_counter() - t0)
    print(f"cache get of a [512, 4096] bf16 entry: best {min(times) * 1e3:.2f} ms")
    assert min(times) < 0.05


# ---- integrity: the case 4 (garbage in an entry was served silently -> black videos forever) -------------
def _payload_offset(path: Path) -> int:
    import struct

    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def test_overwritten_payload_is_dropped_with_a_warning(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path)
    path = cache.put(key(), torch.randn(6, 8).bfloat16())
    data = bytearray(path.read_bytes())
    start = _payload_offset(path)
    data[start:] = bytes(len(data) - start)  # header intact, tensor bytes zeroed: a valid-looking file
    path.write_bytes(bytes(data))
    assert cache.get(key()) is None and not path.exists()
    assert "does not match its checksum" in caplog.text and "encoded again" in caplog.text


def test_non_finite_entry_is_dropped_even_with_a_matching_checksum(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path)
    bad = torch.randn(6, 8).bfloat16()
    bad[2, 3] = float("nan")
    path = cache.path_for(key())
    save_file({"embedding": bad}, str(path), metadata={"key": key().canonical(), "sha256": ec.tensor_sha256(bad)})
    assert cache.get(key()) is None and not path.exists() and "NaN or infinite" in caplog.text


def test_entry_without_checksum_is_re_encoded(tmp_path, caplog):
    cache = EmbeddingCache(tmp_path)
    path = cache.path_for(key())
    save_file({"embedding": torch.randn(6, 8).bfloat16()}, str(path), metadata={"key": key().canonical()})
    assert cache.get(key()) is None and "no checksum" in caplog.text


def test_non_finite_embeddings_are_never_stored(tmp_path):
    emb = torch.randn(4, 8).bfloat16()
    emb[0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        EmbeddingCache(tmp_path).put(key(), emb)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_all_finite(dtype):
    t = torch.randn(7, 5).to(dtype)
    assert ec.all_finite(t) and ec.all_finite(torch.full((3,), 3e4).to(dtype))  # large but finite
    for bad in (float("nan"), float("inf"), -float("inf")):
        u = t.clone()
        u[6, 4] = bad
        assert not ec.all_finite(u)


def test_a_full_disk_is_an_oserror_and_leaves_no_temp(tmp_path):
    """safetensors reports ENOSPC as its own SafetensorError; the cache turns it into the OSError its callers
    handle (a warning, the run goes on). A 1 MB tmpfs, root only."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    try:
        cache = EmbeddingCache(mnt)
        with pytest.raises(OSError, match="No space left on device"):
            cache.put(key(), torch.zeros(512, 4096).bfloat16())  # 4 MB
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

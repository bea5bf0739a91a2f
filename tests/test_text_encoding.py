"""Prompt encoding through the child process: results, cache, lifecycle (stop / SIGKILL / timeout), memory."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lingbot_world.text_encoder import child_process as text_encoder_child
from lingbot_world.text_encoder import encode as te
from lingbot_world.loaders.t5_files import load_umt5
from lingbot_world.loaders.t5_tokenizer import UMT5Tokenizer
from lingbot_world.text_encoder.worker import TEST_DELAY_ENV, choose_device
from lingbot_world.wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
from lingbot_world.wan.text.umt5 import UMT5Config, UMT5Encoder

sentencepiece = pytest.importorskip("sentencepiece")

PROMPT = "The camera pans slowly to the left over a misty green valley at dawn."
CORPUS = [PROMPT, "A red fox jumps over the lazy dog near the river.", DEFAULT_NEGATIVE_PROMPT,
          "Emoji test 🚀🔥 and numbers 12345."]
PACK_ROOT = Path(te.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spiece(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    (d / "corpus.txt").write_text("\n".join(CORPUS * 30), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"), model_prefix=str(d / "spiece"), vocab_size=200, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    return d / "spiece.model"


@pytest.fixture(scope="module")
def encoder_pth(tmp_path_factory) -> Path:
    torch.manual_seed(3)
    model = UMT5Encoder(UMT5Config.tiny())
    path = tmp_path_factory.mktemp("enc") / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save({k: v.bfloat16() for k, v in model.state_dict().items()}, path)
    return path


@pytest.fixture(autouse=True)
def _no_leftover_children():
    yield
    assert text_encoder_child.live_text_encoder_pids() == []


def reference_embeddings(encoder, tokenizer_source, texts):
    model = load_umt5(encoder, "cpu", torch.bfloat16)
    tok = UMT5Tokenizer.from_source(tokenizer_source, encoder)
    return [model.encode(*tok(t))[0] for t in texts]


def run_in_thread(fn):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    th = threading.Thread(target=target)
    th.start()
    return th, box


def wait_for_child(timeout=20.0) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pids = text_encoder_child.live_text_encoder_pids()
        if pids:
            return pids[0]
        time.sleep(0.02)
    raise AssertionError("no text encoder child appeared")


# ---- results -------------------------------------------------------------------------------------------


def test_child_output_equals_in_process_encoding(encoder_pth, spiece):
    stats, stages = {}, []
    texts = [PROMPT, DEFAULT_NEGATIVE_PROMPT]
    got = te.encode_prompts(encoder_pth, spiece, texts, device="cpu", use_cache=False, stats=stats,
                            progress=lambda *a: stages.append(a))
    # The child's stages, in order: started, weights loading (bytes, growing to the total), prompts encoded.
    assert stages[0] == ("start", 0, 1)
    loads = [(d, t) for s, d, t in stages if s == "load"]
    assert loads[0] == (0, 1) and loads[-1][0] == loads[-1][1] > 1
    assert [d for d, _ in loads[1:]] == sorted(d for d, _ in loads[1:]) and len(loads) <= 52
    assert [(d, t) for s, d, t in stages if s == "encode"] == [(0, 2), (1, 2), (2, 2)]
    assert [s for s, _, _ in stages] == sorted((s for s, _, _ in stages), key=["start", "load", "encode"].index)
    want = reference_embeddings(encoder_pth, spiece, texts)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and g.device.type == "cpu" and g.shape[1] == 32
        assert torch.equal(g, w)
    worker = stats["worker"]
    assert worker["ok"] and worker["device"] == "cpu" and worker["lengths"] == [g.shape[0] for g in got]
    print(f"tiny child run: total {worker['total_s']:.2f} s, peak RSS {worker['peak_rss_bytes'] / 2**20:.0f} MiB")


def comfy_fp16_file(encoder_pth: Path, spiece: Path, path: Path) -> Path:
    """umt5_xxl_fp16.safetensors look-alike: HF naming, fp16, tokenizer inside as `spiece_model`."""
    sd = torch.load(encoder_pth, weights_only=True)
    hf = {"shared.weight": sd.pop("token_embedding.weight").half(),
          "encoder.final_layer_norm.weight": sd.pop("norm.weight").half()}
    names = {"norm1": "layer.0.layer_norm", "attn.q": "layer.0.SelfAttention.q", "attn.k": "layer.0.SelfAttention.k",
             "attn.v": "layer.0.SelfAttention.v", "attn.o": "layer.0.SelfAttention.o",
             "pos_embedding.embedding": "layer.0.SelfAttention.relative_attention_bias",
             "norm2": "layer.1.layer_norm", "ffn.gate.0": "layer.1.DenseReluDense.wi_0",
             "ffn.fc1": "layer.1.DenseReluDense.wi_1", "ffn.fc2": "layer.1.DenseReluDense.wo"}
    for k, v in sd.items():
        _, i, rest = k.split(".", 2)
        hf[f"encoder.block.{i}.{names[rest[:-7]]}.weight"] = v.half()
    hf["spiece_model"] = torch.frombuffer(bytearray(spiece.read_bytes()), dtype=torch.uint8)
    save_file(hf, path)
    return path


def test_stage_reader_reads_lines_as_they_are_completed(tmp_path):
    out = tmp_path / "stdout.txt"
    seen = []
    reader = text_encoder_child.StageReader(out, lambda *a: seen.append(a))
    reader.poll()  # no file yet
    out.write_bytes(b'{"stage": "load", "done": 5, "total": 10}\nnot json\n{"stage": "enc')
    reader.poll()
    assert seen == [("load", 5, 10)]
    with open(out, "ab") as f:
        f.write(b'ode", "done": 1, "total": 2}\n{"ok": true}\n')
    reader.poll()
    assert seen == [("load", 5, 10), ("encode", 1, 2)]
    assert text_encoder_child._status(out) == {"ok": True}
    out.write_bytes(b'{"ok": true, "device": "cpu"}\n{"stage": "encode", "done": 2, "total": 2}\n')
    # progress lines are never taken for the status
    assert text_encoder_child._status(out) == {"ok": True, "device": "cpu"}


def test_worker_runs_from_any_folder_without_the_pack_init(tmp_path, encoder_pth, spiece):
    """Inside ComfyUI the pack lives at custom_nodes/<any name>; the worker must load it by path and must
    not execute the pack's root __init__ (it probes ComfyUI). Input: a ComfyUI-style fp16 file whose
    tokenizer is the embedded `spiece_model`."""
    pack = tmp_path / "custom_nodes" / "ComfyUI-LingBot-World (copy)"
    for sub in ("wan", "loaders", "text_encoder"):
        shutil.copytree(PACK_ROOT / sub, pack / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (pack / "__init__.py").write_text("raise RuntimeError('the pack root __init__ ran in the worker')\n")
    enc = comfy_fp16_file(encoder_pth, spiece, tmp_path / "umt5_xxl_fp16.safetensors")
    out = tmp_path / "out.safetensors"
    job = {"encoder": str(enc), "tokenizer": {"kind": "safetensors", "path": str(enc)},
           "prompts": [PROMPT], "device": "auto", "dtype": "bfloat16", "out": str(out)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, str(pack / "text_encoder" / "worker.py"), str(tmp_path / "job.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status["ok"] and status["format"] == "safetensors (hf naming, float16)"
    (want,) = reference_embeddings(enc, None, [PROMPT])
    assert torch.equal(load_file(str(out))["prompt_0"], want)


def test_choose_device():
    gib = 1 << 30
    assert choose_device("auto", 9 * gib, None) == "cpu"
    assert choose_device("auto", 9 * gib, 9 * gib) == "cpu"  # no room for activations
    assert choose_device("auto", 9 * gib, 11 * gib) == "cuda"
    assert choose_device("cpu", 9 * gib, 80 * gib) == "cpu"
    assert choose_device("cuda:1", 90 * gib, 1 * gib) == "cuda:1"  # the user insists
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        choose_device("cuda", 1, None)
    with pytest.raises(ValueError, match="device must be"):
        choose_device("tpu", 1, None)


# ---- cache (the child is replaced by a deterministic fake: these tests are about the cache logic) ------


@pytest.fixture
def fake_encoder(monkeypatch):
    calls = []

    def fake(encoder, tok, texts, **kw):
        calls.append(list(texts))
        out = []
        for t in texts:
            g = torch.Generator().manual_seed(len(t) * 7919 + sum(map(ord, t)))
            out.append(torch.randn(len(t) + 1, 32, generator=g).bfloat16())
        return out, {"ok": True, "device": "fake"}

    monkeypatch.setattr(te, "run_text_encoder", fake)
    return calls


def test_cache_hit_never_starts_the_child(tmp_path, encoder_pth, spiece, fake_encoder, monkeypatch):
    cache = tmp_path / "cache"
    first = te.encode_prompts(encoder_pth, spiece, [PROMPT, DEFAULT_NEGATIVE_PROMPT], cache_dir=cache)
    assert fake_encoder == [[PROMPT, DEFAULT_NEGATIVE_PROMPT]]
    assert len(list(cache.glob("*.safetensors"))) == 2

    assert te.all_prompts_cached(encoder_pth, spiece, [PROMPT, DEFAULT_NEGATIVE_PROMPT], cache_dir=cache)
    assert not te.all_prompts_cached(encoder_pth, spiece, [PROMPT, "other"], cache_dir=cache)
    assert not te.all_prompts_cached(encoder_pth.with_name("gone.pth"), spiece, [PROMPT], cache_dir=cache)

    def no_child(*a, **k):
        raise AssertionError("a cache hit started the text encoder")

    monkeypatch.setattr(te, "run_text_encoder", no_child)
    monkeypatch.setattr(text_encoder_child.subprocess, "Popen", no_child)
    stats = {}
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        again = te.encode_prompts(encoder_pth, spiece, [PROMPT, DEFAULT_NEGATIVE_PROMPT], cache_dir=cache,
                                  stats=stats)
        times.append(time.perf_counter() - t0)
    assert stats["cache_hits"] == 2 and stats["encoded"] == 0
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    best = min(times)
    print(f"cache hit (2 prompts): best {best * 1e3:.2f} ms, first {times[0] * 1e3:.2f} ms")
    assert best < 0.05


def test_cache_misses_are_encoded_once_and_stored(tmp_path, encoder_pth, spiece, fake_encoder):
    cache = tmp_path / "cache"
    te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)
    fake_encoder.clear()
    out = te.encode_prompts(encoder_pth, spiece, ["new words", PROMPT, "new words"], cache_dir=cache)
    assert fake_encoder == [["new words"]]  # the hit is not re-encoded, the duplicate only once
    assert torch.equal(out[0], out[2])

    # a corrupted entry is dropped and recomputed, never served
    for entry in cache.glob("*.safetensors"):
        entry.write_bytes(b"\x00garbage")
    fake_encoder.clear()
    again = te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)
    assert fake_encoder == [[PROMPT]] and torch.equal(again[0], out[1])

    # another encoder file (same path, new mtime), tokenizer or dtype: different keys
    st = encoder_pth.stat()
    os.utime(encoder_pth, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    fake_encoder.clear()
    te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)
    te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache, dtype="float32")
    assert fake_encoder == [[PROMPT], [PROMPT]]
    fake_encoder.clear()
    te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache, use_cache=False)
    assert fake_encoder == [[PROMPT]]


def test_poisoned_cache_entry_is_encoded_again(tmp_path, encoder_pth, spiece, fake_encoder, caplog):
    """An entry whose payload was overwritten (header intact) is dropped, re-encoded and rewritten."""
    cache = tmp_path / "cache"
    first = te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)
    (entry,) = cache.glob("*.safetensors")
    data = bytearray(entry.read_bytes())
    data[-16:] = b"\xff" * 16  # bf16 0xffff is NaN
    entry.write_bytes(bytes(data))
    fake_encoder.clear()
    again = te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)
    assert fake_encoder == [[PROMPT]] and torch.equal(again[0], first[0])
    assert "dropping entry" in caplog.text
    fake_encoder.clear()
    assert torch.equal(te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=cache)[0], first[0])
    assert fake_encoder == []  # the rewritten entry is good


def test_nan_from_the_encoder_is_an_error_not_a_black_video(tmp_path, encoder_pth, spiece, monkeypatch):
    def nan_encoder(encoder, tok, texts, **kw):
        return [torch.full((3, 32), float("nan")).bfloat16() for _ in texts], {"ok": True, "device": "fake"}

    monkeypatch.setattr(te, "run_text_encoder", nan_encoder)
    with pytest.raises(text_encoder_child.TextEncoderError, match="NaN or infinite values"):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_cache_write_failure_is_a_warning(tmp_path, encoder_pth, spiece, fake_encoder, monkeypatch, caplog):
    from lingbot_world.text_encoder import cache as ec

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ec, "save_file", disk_full)
    out = te.encode_prompts(encoder_pth, spiece, [PROMPT], cache_dir=tmp_path / "cache")
    assert out[0].shape[1] == 32 and "cannot store the entry" in caplog.text
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no temp file either


# ---- errors and lifecycle ------------------------------------------------------------------------------


def test_missing_inputs_fail_before_any_child(tmp_path, spiece, monkeypatch):
    monkeypatch.setattr(text_encoder_child.subprocess, "Popen", lambda *a, **k: pytest.fail("child started"))
    with pytest.raises(FileNotFoundError, match="text encoder file .* does not exist"):
        te.encode_prompts(tmp_path / "missing.pth", spiece, [PROMPT])
    enc = tmp_path / "t5.pth"
    enc.write_bytes(b"PK\x03\x04")
    with pytest.raises(FileNotFoundError, match="no umT5 tokenizer found"):
        te.encode_prompts(enc, None, [PROMPT])


def test_bad_choices_fail_before_any_child(encoder_pth, spiece, monkeypatch):
    monkeypatch.setattr(text_encoder_child.subprocess, "Popen", lambda *a, **k: pytest.fail("child started"))
    with pytest.raises(ValueError, match="device must be"):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], device="gpu")
    with pytest.raises(ValueError, match="float16"):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], dtype="float16")


def test_vram_estimate(encoder_pth):
    cfg = UMT5Config.tiny()
    weights = 2 * (cfg.num_params() - cfg.vocab_size * cfg.dim)  # bf16, token table on the CPU
    assert te.estimate_child_vram_bytes(encoder_pth) == weights + (1 << 30)
    assert UMT5Config.xxl().num_params() * 2 - 256384 * 4096 * 2 == 9_261_522_944  # full size: 9.26 GB


def test_wrong_file_is_reported_with_stderr_tail(tmp_path, spiece):
    vae = tmp_path / "wan_2.1_vae.safetensors"
    save_file({"decoder.middle.0.residual.0.gamma": torch.ones(4, 1, 1, 1),
               "encoder.conv1.weight": torch.ones(4, 3, 3, 3, 3)}, vae)
    with pytest.raises(text_encoder_child.TextEncoderInputError) as ei:
        te.encode_prompts(vae, spiece, [PROMPT], use_cache=False)
    msg = str(ei.value)
    assert "it looks like the Wan VAE" in msg
    assert "--- text encoder stderr (tail) ---" in msg and "Traceback" in msg


def test_stop_all_from_another_thread(encoder_pth, spiece, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    th, box = run_in_thread(lambda: te.encode_prompts(encoder_pth, spiece, [PROMPT], use_cache=False))
    wait_for_child()
    t0 = time.monotonic()
    assert text_encoder_child.stop_all_text_encoders() == 1
    th.join(15)
    assert not th.is_alive() and time.monotonic() - t0 < 10
    assert isinstance(box.get("error"), text_encoder_child.TextEncoderStopped), box
    assert "stopped" in str(box["error"])


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_sigkill_is_reported_as_out_of_ram(encoder_pth, spiece, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    th, box = run_in_thread(lambda: te.encode_prompts(encoder_pth, spiece, [PROMPT], use_cache=False))
    os.kill(wait_for_child(), signal.SIGKILL)  # what the kernel's OOM killer does
    th.join(15)
    err = box.get("error")
    assert isinstance(err, text_encoder_child.TextEncoderKilled), box
    assert str(err).startswith(
        "the text encoder process was killed, most likely out of RAM; try device=cuda or the fp8 encoder"
    )


def test_timeout(encoder_pth, spiece, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    t0 = time.monotonic()
    with pytest.raises(text_encoder_child.TextEncoderTimeout, match="did not finish within 1 s"):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], use_cache=False, timeout=1.0)
    assert time.monotonic() - t0 < 10


def test_cancel_check(encoder_pth, spiece, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    t0 = time.monotonic()
    with pytest.raises(text_encoder_child.TextEncoderStopped, match="cancelled"):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], use_cache=False,
                          cancel_check=lambda: time.monotonic() - t0 > 0.3)

    class Interrupted(Exception):  # e.g. ComfyUI's InterruptProcessingException
        pass

    def interrupt():
        if time.monotonic() - t0 > 0.3:
            raise Interrupted()
        return False

    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        te.encode_prompts(encoder_pth, spiece, [PROMPT], use_cache=False, cancel_check=interrupt)


# ---- parent memory -------------------------------------------------------------------------------------

_PARENT_SCRIPT = r"""
import json, sys
import torch
from lingbot_world.text_encoder.encode import encode_prompts
from lingbot_world.wan.text.prompts import DEFAULT_NEGATIVE_PROMPT

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

before = hwm()
stats = {}
out = encode_prompts(sys.argv[1], sys.argv[2], [sys.argv[3], DEFAULT_NEGATIVE_PROMPT], device="cpu",
                     cache_dir=sys.argv[4], stats=stats)
after = hwm()
print(json.dumps({"before": before, "after": after, "shapes": [list(o.shape) for o in out],
                  "child_peak_rss": stats["worker"]["peak_rss_bytes"], "child_total_s": stats["worker"]["total_s"]}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_parent_memory_stays_flat_with_a_1gb_encoder(tmp_path, spiece):
    """A >= 1 GB encoder (tiny blocks, full-size vocabulary x 2048) in HF naming: the parent's peak RSS
    must not grow by more than 150 MB while the child loads and runs it."""
    cfg = UMT5Config(vocab_size=262144, dim=2048, num_heads=4, head_dim=8, ffn_dim=64, num_layers=2,
                     num_buckets=8)
    torch.manual_seed(0)
    tensors = {"shared.weight": (torch.randn(256, cfg.dim) * 0.5).bfloat16().repeat(cfg.vocab_size // 256, 1),
               "encoder.final_layer_norm.weight": torch.ones(cfg.dim, dtype=torch.bfloat16)}
    for i in range(cfg.num_layers):
        p = f"encoder.block.{i}.layer."
        for n in "qkv":
            tensors[f"{p}0.SelfAttention.{n}.weight"] = torch.randn(cfg.attn_dim, cfg.dim).bfloat16() * 0.05
        tensors[f"{p}0.SelfAttention.o.weight"] = torch.randn(cfg.dim, cfg.attn_dim).bfloat16() * 0.05
        tensors[f"{p}0.SelfAttention.relative_attention_bias.weight"] = torch.randn(8, 4).bfloat16()
        tensors[f"{p}0.layer_norm.weight"] = torch.ones(cfg.dim, dtype=torch.bfloat16)
        tensors[f"{p}1.layer_norm.weight"] = torch.ones(cfg.dim, dtype=torch.bfloat16)
        tensors[f"{p}1.DenseReluDense.wi_0.weight"] = torch.randn(cfg.ffn_dim, cfg.dim).bfloat16() * 0.05
        tensors[f"{p}1.DenseReluDense.wi_1.weight"] = torch.randn(cfg.ffn_dim, cfg.dim).bfloat16() * 0.05
        tensors[f"{p}1.DenseReluDense.wo.weight"] = torch.randn(cfg.dim, cfg.ffn_dim).bfloat16() * 0.05
    path = tmp_path / "big_umt5.safetensors"
    save_file(tensors, path)
    del tensors
    size = path.stat().st_size
    assert size >= 1_000_000_000

    proc = subprocess.run([sys.executable, "-c", _PARENT_SCRIPT, str(path), str(spiece), PROMPT,
                           str(tmp_path / "cache")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    growth = r["after"] - r["before"]
    print(f"1 GB encoder ({size / 1e9:.2f} GB): parent VmHWM growth {growth / 2**20:.1f} MiB, "
          f"child peak RSS {r['child_peak_rss'] / 2**20:.0f} MiB, child {r['child_total_s']:.1f} s")
    assert r["shapes"][0][1] == cfg.dim
    assert growth < 150 * 2**20

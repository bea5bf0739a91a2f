"""The text encoder's child running beside the model loading: the VRAM admission, the background job's lifecycle
(result, error, stop), and the CLI giving the same video whether the text was encoded first or beside the loading."""
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_world.cli import main
from lingbot_world.world import text_stage
from lingbot_world.loaders.t5_files import load_umt5
from lingbot_world.loaders.t5_tokenizer import UMT5Tokenizer
from lingbot_world.memory.overlap import Step, plan_overlap
from lingbot_world.text_encoder import child_process as text_encoder_child
from lingbot_world.text_encoder.background import BackgroundEncoding
from lingbot_world.text_encoder.worker import TEST_DELAY_ENV
from lingbot_world.wan.text.umt5 import UMT5Config, UMT5Encoder

sentencepiece = pytest.importorskip("sentencepiece")
GB = 10**9
LOG = logging.getLogger("test")
PROMPT = "The camera pans slowly to the left over a misty green valley at dawn."


@pytest.fixture(autouse=True)
def _no_leftover_children():
    yield
    assert text_encoder_child.live_text_encoder_pids() == []


# ---- the admission -------------------------------------------------------------------------------------------

FAST_STEPS = [Step("vae", int(11.2 * GB), 0), Step("load", int(9.8 * GB), int(9.6 * GB))]


def test_a_24gb_card_loads_the_fast_model_beside_the_encoder():
    plan = plan_overlap(int(25.2 * GB), int(10.3 * GB), FAST_STEPS, headroom=GB)
    assert plan.beside == ("vae", "load") and plan.runs_beside("load")
    assert "text encoder 10.3 GB of VRAM; beside it: vae, load (25.2 GB free)" == plan.reason


def test_a_16gb_card_waits_for_the_encoder():
    plan = plan_overlap(int(16.6 * GB), int(10.3 * GB), FAST_STEPS, headroom=GB)
    assert plan.beside == () and "after it: vae, load" in plan.reason


def test_what_a_step_keeps_counts_for_the_next_and_order_is_kept():
    steps = [Step("a", 4 * GB, 3 * GB), Step("b", 3 * GB, 0), Step("c", 1, 0)]
    # child 8 + headroom 1; "a" peaks at 4 and keeps 3; "b" then needs 8 + 1 + 3 + 3 = 15
    assert plan_overlap(16 * GB, 8 * GB, steps, headroom=GB).beside == ("a", "b", "c")
    # "c" would fit, but it comes after "b", which waits: the later steps build on the earlier ones
    assert plan_overlap(14 * GB, 8 * GB, steps, headroom=GB).beside == ("a",)
    assert plan_overlap(12 * GB, 8 * GB, steps, headroom=GB).beside == ()
    assert plan_overlap(1, 0, steps).beside == ("a", "b", "c")  # cached / on the CPU: nothing to share


# ---- the background job ------------------------------------------------------------------------------------------


def test_background_result_error_and_stop():
    assert BackgroundEncoding(lambda cancel_check: [torch.ones(2)]).result()[0].sum() == 2

    def fails(cancel_check):
        raise text_encoder_child.TextEncoderInputError("bad tokenizer")

    with pytest.raises(text_encoder_child.TextEncoderInputError, match="bad tokenizer"):
        BackgroundEncoding(fails).result()

    seen = threading.Event()

    def waits(cancel_check):
        while not cancel_check():
            time.sleep(0.01)
        seen.set()
        raise text_encoder_child.TextEncoderStopped("text encoding was cancelled")

    job = BackgroundEncoding(waits)
    assert job.running
    job.stop()
    assert seen.is_set() and not job.running
    job.stop()  # idempotent


# ---- a real child beside the work of this thread ----------------------------------------------------------------


@pytest.fixture(scope="module")
def t5_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("t5")
    (d / "corpus.txt").write_text("\n".join([PROMPT, "a red fox jumps over the lazy dog"] * 30), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"), model_prefix=str(d / "spiece"), vocab_size=120, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    torch.manual_seed(3)
    enc = d / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save({k: v.bfloat16() for k, v in UMT5Encoder(UMT5Config.tiny()).state_dict().items()}, enc)
    return SimpleNamespace(t5=enc, tokenizer=d / "spiece.model")


def _text(**kw):
    from lingbot_world.world.settings import TextSettings

    return TextSettings(**{**dict(device="cpu", cache_dir=None, use_cache=False, timeout=None), **kw})


class _OneProcess:
    parallel = False

    @staticmethod
    def from_main(fn, what):
        return fn()


def _force_background(monkeypatch):
    """The child on the CPU stands in for one on this process's GPU with plenty of VRAM."""
    _fake_gpu(monkeypatch, 1, 1 << 50)


def _fake_gpu(monkeypatch, child_bytes, free):
    monkeypatch.setattr(text_stage, "_free_vram", lambda device: free)
    monkeypatch.setattr(text_stage, "_child_device", lambda requested, path, device, free: ("cpu", child_bytes))


def test_steps_run_while_the_child_works_and_the_text_is_the_same(t5_files, monkeypatch, caplog):
    tok = UMT5Tokenizer.from_source(t5_files.tokenizer, t5_files.t5)
    want = [load_umt5(t5_files.t5, "cpu", torch.bfloat16).encode(*tok(PROMPT))[0]]
    _force_background(monkeypatch)
    monkeypatch.setenv(TEST_DELAY_ENV, "1.5")
    steps = [Step("vae", 1, 0), Step("load", 1, 1)]
    stage = text_stage.start(_text(), t5_files, [PROMPT], torch.device("cuda"), steps, _OneProcess(), LOG)
    try:
        assert stage.background and stage.plan.beside == ("vae", "load")
        t = time.perf_counter()
        stage.before("vae")
        stage.before("load")
        assert time.perf_counter() - t < 0.5  # the steps did not wait for the child (it sleeps 1.5 s first)
        assert stage._job.running
        got = stage.embeddings()
        assert stage.waited_s > 0.5
        assert torch.equal(got[0], want[0])
    finally:
        stage.stop()


def test_a_step_that_does_not_fit_waits_and_stop_kills_the_child(t5_files, monkeypatch):
    _fake_gpu(monkeypatch, 8 * GB, 12 * GB)
    monkeypatch.setenv(TEST_DELAY_ENV, "1.0")
    steps = [Step("vae", 2 * GB, 0), Step("load", 9 * GB, 9 * GB)]
    stage = text_stage.start(_text(), t5_files, [PROMPT], torch.device("cuda"), steps, _OneProcess(),
                             LOG)
    try:
        assert stage.plan.beside == ("vae",)
        stage.before("vae")
        assert stage._job is not None
        stage.before("load")  # waits: the child's VRAM and the model's would not fit together
        assert stage._job is None and stage.embeddings()[0].shape[1] == 32
    finally:
        stage.stop()

    monkeypatch.setenv(TEST_DELAY_ENV, "60")
    stage = text_stage.start(_text(), t5_files, [PROMPT], torch.device("cuda"), steps, _OneProcess(),
                             LOG)
    deadline = time.monotonic() + 20
    while not text_encoder_child.live_text_encoder_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    t = time.monotonic()
    stage.stop()  # e.g. the VAE encode failed, or Ctrl-C: the child goes at once
    assert time.monotonic() - t < 5 and text_encoder_child.live_text_encoder_pids() == []


# ---- the CLI --------------------------------------------------------------------------------------------------------


def _frames(folder):
    return np.stack([np.asarray(Image.open(f)) for f in sorted(folder.glob("frame_*.png"))])


def _run(demo, out, model, *extra):
    short = ["--frames", "13"] if model == "fast" else ["--frames", "5", "--steps", "2"]
    return main(["generate", "--demo", "--model", model, "--demo-dir", str(demo), "--out", str(out), "--quiet",
                 "--no-text-cache", "--seed", "5", *short, *extra])


def test_the_fast_video_is_the_same_with_the_text_beside_the_loading(tmp_path_factory, tmp_path, monkeypatch, capsys):
    demo = tmp_path_factory.getbasetemp() / "overlap_demo"
    assert _run(demo, tmp_path / "first", "fast") == 0
    assert "waiting for the text encoder" not in capsys.readouterr().out
    _force_background(monkeypatch)
    assert _run(demo, tmp_path / "beside", "fast") == 0
    assert "waiting for the text encoder" in capsys.readouterr().out  # the summary's stage list
    assert np.array_equal(_frames(tmp_path / "first"), _frames(tmp_path / "beside"))


def test_the_base_model_encodes_the_image_beside_the_text_encoder(tmp_path_factory, tmp_path, monkeypatch, capsys):
    _force_background(monkeypatch)
    assert _run(tmp_path_factory.getbasetemp() / "overlap_demo", tmp_path / "beside", "base") == 0
    out = capsys.readouterr().out
    assert "vae_encode" in out and "waiting for the text encoder" in out
    assert _frames(tmp_path / "beside").shape[0] == 5

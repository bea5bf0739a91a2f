"""umT5 tokenizer: cleaning, EOS/padding/truncation, the three sources, agreement with transformers."""
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.t5_tokenizer import (
    TokenizerNotFoundError,
    UMT5Tokenizer,
    clean_prompt,
    resolve_tokenizer_source,
)
from lingbot_world.wan.text.prompts import DEFAULT_NEGATIVE_PROMPT

sentencepiece = pytest.importorskip("sentencepiece")

CORPUS = [
    "A red fox jumps over the lazy dog near the river.",
    "The camera pans slowly to the left over a misty green valley at dawn.",
    "The video presents a soaring journey through a fantasy jungle with floating islands.",
    "画面突变,色调艳丽,过曝,静态,细节模糊不清,字幕,风格,作品,画作,画面,静止,整体发灰",
    "最差质量,低质量,JPEG压缩残留,丑陋的,残缺的,多余的手指,画得不好的手部",
    "Emoji test 🚀🔥 and numbers 12345 and punctuation: <b>bold</b> & 'quotes'.",
    "Hello world, hello tokenizer! The castle approaches steadily in the wind.",
]
PROMPTS = [
    "A red fox jumps over the lazy dog.",
    "  The camera\n\tpans   slowly  ",
    "画面突变，色调艳丽，过曝",
    "rocket 🚀 launch &amp; fire 🔥",
    "cafÃ© “quoted” text",
    "",
    "zebra quartz xylophone Ω жжж ü",  # characters the tiny model has never seen -> unk
]


def train_spiece(folder: Path, vocab_size: int = 300) -> Path:
    """A small unigram model with T5's special ids (pad 0, eos 1, unk 2, no bos), trained offline."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "spiece"), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2, num_threads=1,
    )
    corpus.unlink()
    (folder / "spiece.vocab").unlink()
    return folder / "spiece.model"


@pytest.fixture(scope="module")
def spiece_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("spiece")
    train_spiece(d)
    return d


@pytest.fixture(scope="module")
def hf_tokenizer(spiece_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.T5Tokenizer.from_pretrained(str(spiece_dir), extra_ids=0)


@pytest.fixture(scope="module")
def tokenizer_json_dir(hf_tokenizer, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tokjson")
    hf_tokenizer.save_pretrained(str(d))
    assert (d / "tokenizer.json").is_file()
    return d


def hf_ids(hf_tokenizer, text: str, max_length: int = 512):
    enc = hf_tokenizer(clean_prompt(text), padding="max_length", truncation=True, max_length=max_length,
                       add_special_tokens=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


# ---- cleaning ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("  a\n\tb   c  ", "a b c"),
        ("&amp;lt;b&amp;gt;", "<b>"),  # html.unescape applied twice
        ("a&nbsp;b", "a b"),
        ("cafÃ©", "café"),  # ftfy repairs mojibake
        ("“quoted”", '"quoted"'),
        ("Hello World", "Hello World"),  # not lower-cased
        ("画面突变，色调", "画面突变,色调"),  # ftfy normalises full-width punctuation, as the reference does
        ("rocket 🚀", "rocket 🚀"),
        ("", ""),
    ],
)
def test_clean_prompt(raw, clean):
    assert clean_prompt(raw) == clean


def test_default_negative_prompt_is_the_reference_string():
    assert DEFAULT_NEGATIVE_PROMPT.startswith("画面突变，色调艳丽，过曝，静态，细节模糊不清")
    assert DEFAULT_NEGATIVE_PROMPT.endswith("面部特征，汽车，电线")
    assert len(DEFAULT_NEGATIVE_PROMPT) == 252 and "\n" not in DEFAULT_NEGATIVE_PROMPT


# ---- ids, padding, truncation --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["spiece.model", "tokenizer.json", "safetensors"])
def test_ids_match_transformers(kind, spiece_dir, tokenizer_json_dir, hf_tokenizer, tmp_path):
    if kind == "spiece.model":
        source = spiece_dir / "spiece.model"
    elif kind == "tokenizer.json":
        source = tokenizer_json_dir
    else:  # ComfyUI style: the model proto as a uint8 tensor inside the text-encoder file
        source = tmp_path / "umt5_xxl_fp16.safetensors"
        proto = (spiece_dir / "spiece.model").read_bytes()
        save_file({"spiece_model": torch.frombuffer(bytearray(proto), dtype=torch.uint8),
                   "shared.weight": torch.zeros(4, 4)}, source)
    tok = UMT5Tokenizer.from_source(source)
    assert tok.source.kind == kind and (tok.eos_id, tok.pad_id) == (1, 0)
    for text in PROMPTS:
        ids, mask = tok(text)
        want_ids, want_mask = hf_ids(hf_tokenizer, text)
        assert ids.shape == mask.shape == (1, 512) and ids.dtype == torch.long
        assert torch.equal(ids, want_ids), text
        assert torch.equal(mask, want_mask), text
        n = int(mask.sum())
        assert ids[0, n - 1] == 1 and (ids[0, n:] == 0).all()


def test_empty_prompt_is_just_eos(spiece_dir):
    ids, mask = UMT5Tokenizer.from_source(spiece_dir)("   ")
    assert ids[0, 0] == 1 and int(mask.sum()) == 1


@pytest.mark.parametrize("max_length", [512, 16])
def test_truncation_keeps_eos(spiece_dir, hf_tokenizer, max_length):
    tok = UMT5Tokenizer.from_source(spiece_dir)
    long_text = " ".join(CORPUS * 12)
    assert len(tok.token_ids(long_text, 10_000)) > 600
    ids, mask = tok(long_text, max_length)
    want_ids, want_mask = hf_ids(hf_tokenizer, long_text, max_length)
    assert torch.equal(ids, want_ids) and torch.equal(mask, want_mask)
    assert int(mask.sum()) == max_length and ids[0, -1] == 1


# ---- sources -------------------------------------------------------------------------------------------


def test_resolution_of_sources(spiece_dir, tokenizer_json_dir, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    (both / "spiece.model").write_bytes((spiece_dir / "spiece.model").read_bytes())
    (both / "tokenizer.json").write_bytes((tokenizer_json_dir / "tokenizer.json").read_bytes())
    assert resolve_tokenizer_source(both).kind == "tokenizer.json"  # what the reference loads

    # None: look beside the encoder (release layout: <ckpt>/google/umt5-xxl, NF4 repo: <ckpt>/tokenizer)
    ckpt = tmp_path / "ckpt"
    (ckpt / "tokenizer").mkdir(parents=True)
    (ckpt / "tokenizer" / "spiece.model").write_bytes((spiece_dir / "spiece.model").read_bytes())
    enc = ckpt / "models_t5_umt5-xxl-enc-bf16.pth"
    enc.write_bytes(b"PK\x03\x04")
    src = resolve_tokenizer_source(None, enc)
    assert src.path == (ckpt / "tokenizer" / "spiece.model").resolve()
    ident = src.identity()
    assert ident["kind"] == "spiece.model" and ident["size"] > 0 and ident["mtime_ns"] > 0

    (ckpt / "google" / "umt5-xxl").mkdir(parents=True)
    (ckpt / "google" / "umt5-xxl" / "tokenizer.json").write_bytes(b"{}")
    assert resolve_tokenizer_source(None, enc).kind == "tokenizer.json"


def test_missing_tokenizer_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerNotFoundError, match="neither tokenizer.json nor spiece.model"):
        resolve_tokenizer_source(empty)
    with pytest.raises(TokenizerNotFoundError, match="does not exist"):
        resolve_tokenizer_source(tmp_path / "nope")
    plain = tmp_path / "umt5_xxl_fp16.safetensors"
    save_file({"shared.weight": torch.zeros(2, 2)}, plain)
    with pytest.raises(TokenizerNotFoundError, match="no 'spiece_model' tensor"):
        resolve_tokenizer_source(plain)
    with pytest.raises(TokenizerNotFoundError, match="no umT5 tokenizer found"):
        resolve_tokenizer_source(None, plain)
    bad = tmp_path / "spiece.model"
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        UMT5Tokenizer.from_source(bad)


# ---- the real umT5 tokenizer, when available -----------------------------------------------------------

REAL = os.environ.get("LINGBOT_UMT5_TOKENIZER")


@pytest.mark.skipif(not REAL, reason="set LINGBOT_UMT5_TOKENIZER to a google/umt5-xxl tokenizer folder")
def test_real_umt5_tokenizer_matches_autotokenizer(examples_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(REAL)
    prompts = [
        DEFAULT_NEGATIVE_PROMPT,
        (examples_dir / "00" / "prompt.txt").read_text(encoding="utf-8"),
        "A cat surfing a wave 🏄‍♂️🌊 at sunset, cinematic",
        "",
    ]
    sources = [REAL] + [str(Path(REAL) / "spiece.model")] * (Path(REAL) / "spiece.model").is_file()
    for source in sources:
        tok = UMT5Tokenizer.from_source(source)
        for text in prompts:
            ids, mask = tok(text)
            want_ids, want_mask = hf_ids(ref, text)
            assert torch.equal(ids, want_ids), (source, text[:40])
            assert torch.equal(mask, want_mask), (source, text[:40])

"""umT5 tokenizer from local files: the reference's `google/umt5-xxl/` folder, the NF4 repo's `tokenizer/`,
a bare `tokenizer.json` / `spiece.model`, or the uint8 `spiece_model` tensor inside ComfyUI's
`umt5_xxl_*.safetensors` (spec §7, comfyui-integration §6.3).

Behaviour of the reference (`HuggingfaceTokenizer(clean='whitespace')` + a T5 fast tokenizer): clean the
text, append EOS (no BOS), truncate to 512 keeping the EOS, pad with the pad id, return ids and mask.
`tokenizer.json` is preferred because it is what the reference loads; sentencepiece is the fallback.
Heavy libraries (tokenizers, sentencepiece, ftfy) are imported only when a tokenizer is built, so the
parent process can resolve sources and cache keys cheaply.
"""
from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

MAX_LENGTH = 512
SPIECE_KEY = "spiece_model"  # ComfyUI's serialized SentencePiece model inside the text-encoder file

_WHITESPACE = re.compile(r"\s+")


def clean_prompt(text: str) -> str:
    """Wan's 'whitespace' cleaning: ftfy.fix_text, html.unescape twice, strip, collapse whitespace, strip."""
    import ftfy

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return _WHITESPACE.sub(" ", text).strip()


class TokenizerNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class TokenizerSource:
    """Where the tokenizer comes from: kind is 'tokenizer.json', 'spiece.model' or 'safetensors'."""

    kind: str
    path: Path

    def identity(self) -> dict:
        """Cheap identity for cache keys (stat only, never reads the file)."""
        st = self.path.stat()
        return {"kind": self.kind, "path": str(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _safetensors_has_spiece(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return SPIECE_KEY in f.keys()
    except Exception:
        return False


def _from_folder(folder: Path) -> Optional[TokenizerSource]:
    for name in ("tokenizer.json", "spiece.model"):
        if (folder / name).is_file():
            return TokenizerSource(name, folder / name)
    return None


def resolve_tokenizer_source(
    source: Union[str, os.PathLike, None], encoder_path: Union[str, os.PathLike, None] = None
) -> TokenizerSource:
    """Find the tokenizer file.

    `source` may be a folder holding tokenizer.json and/or spiece.model, one of those files, or a
    `.safetensors` text-encoder file carrying `spiece_model`. With `source=None` the encoder file itself
    (ComfyUI's umt5 safetensors) and the folders `google/umt5-xxl/` and `tokenizer/` beside it are tried.
    """
    if source is not None:
        p = Path(source).expanduser().resolve()
        if p.is_dir():
            found = _from_folder(p)
            if found is None:
                raise TokenizerNotFoundError(
                    f"tokenizer folder {p} has neither tokenizer.json nor spiece.model; point to the release's "
                    "google/umt5-xxl/ folder, the NF4 repo's tokenizer/ folder, or a umt5_xxl_*.safetensors file"
                )
            return found
        if not p.is_file():
            raise TokenizerNotFoundError(f"tokenizer source {p} does not exist")
        if p.name.endswith(".json"):
            return TokenizerSource("tokenizer.json", p)
        if p.suffix == ".model":
            return TokenizerSource("spiece.model", p)
        if p.suffix in (".safetensors", ".sft"):
            if not _safetensors_has_spiece(p):
                raise TokenizerNotFoundError(
                    f"{p} has no '{SPIECE_KEY}' tensor (only Comfy-Org's umt5_xxl_*.safetensors carry the "
                    "tokenizer); pass the google/umt5-xxl/ or tokenizer/ folder instead"
                )
            return TokenizerSource("safetensors", p)
        raise TokenizerNotFoundError(
            f"cannot read a tokenizer from {p}: expected a folder, tokenizer.json, spiece.model or a "
            "umt5_xxl_*.safetensors file"
        )
    if encoder_path is None:
        raise TokenizerNotFoundError("no tokenizer source given and no encoder path to search beside")
    enc = Path(encoder_path).expanduser().resolve()
    if enc.suffix in (".safetensors", ".sft") and enc.is_file() and _safetensors_has_spiece(enc):
        return TokenizerSource("safetensors", enc)
    for sub in ("google/umt5-xxl", "tokenizer"):
        found = _from_folder(enc.parent / sub)
        if found is not None:
            return found
    raise TokenizerNotFoundError(
        f"no umT5 tokenizer found for {enc}: looked for '{SPIECE_KEY}' inside it and for google/umt5-xxl/ "
        "or tokenizer/ beside it; pass the tokenizer folder explicitly"
    )


class UMT5Tokenizer:
    """Text -> (ids [1, max_length], mask [1, max_length]) exactly as the reference tokenizes prompts."""

    def __init__(self, encode_fn, eos_id: int, pad_id: int, source: Optional[TokenizerSource] = None):
        self._encode = encode_fn  # cleaned text -> list of ids without special tokens
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.source = source

    @classmethod
    def from_source(
        cls, source: Union[str, os.PathLike, TokenizerSource, None], encoder_path=None
    ) -> "UMT5Tokenizer":
        src = source if isinstance(source, TokenizerSource) else resolve_tokenizer_source(source, encoder_path)
        if src.kind == "tokenizer.json":
            return cls._from_tokenizer_json(src)
        if src.kind == "spiece.model":
            return cls._from_spiece_proto(src.path.read_bytes(), src)
        from safetensors import safe_open

        with safe_open(str(src.path), framework="pt") as f:
            proto = f.get_tensor(SPIECE_KEY).numpy().tobytes()
        return cls._from_spiece_proto(proto, src)

    @classmethod
    def _from_tokenizer_json(cls, src: TokenizerSource) -> "UMT5Tokenizer":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(src.path))
        # Padding/truncation/EOS are applied below, identically for every backend.
        tok.no_padding()
        tok.no_truncation()
        eos = tok.token_to_id("</s>")
        if eos is None:
            raise ValueError(f"{src.path} has no '</s>' token; it is not a T5/umT5 tokenizer")
        pad = tok.token_to_id("<pad>")
        return cls(lambda text: tok.encode(text, add_special_tokens=False).ids, eos, 0 if pad is None else pad, src)

    @classmethod
    def _from_spiece_proto(cls, proto: bytes, src: Optional[TokenizerSource] = None) -> "UMT5Tokenizer":
        import sentencepiece as spm

        try:
            sp = spm.SentencePieceProcessor(model_proto=proto)
        except Exception as e:
            where = src.path if src is not None else "the given bytes"
            raise ValueError(f"{where} is not a valid SentencePiece model: {e}") from e
        eos, pad = sp.eos_id(), sp.pad_id()
        if eos < 0:
            raise ValueError(f"SentencePiece model {src.path if src else ''} defines no EOS id")
        return cls(lambda text: sp.encode(text, out_type=int), eos, max(pad, 0), src)

    def token_ids(self, text: str, max_length: int = MAX_LENGTH) -> list[int]:
        """Cleaned, tokenized, truncated to max_length - 1 and terminated by EOS (HF truncation=True)."""
        ids = list(self._encode(clean_prompt(text)))[: max_length - 1]
        return ids + [self.eos_id]

    def __call__(self, text: str, max_length: int = MAX_LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
        """ids and attention mask, both int64 [1, max_length], padded with the pad id (padding='max_length')."""
        ids = self.token_ids(text, max_length)
        n = len(ids)
        out = torch.full((1, max_length), self.pad_id, dtype=torch.long)
        out[0, :n] = torch.tensor(ids, dtype=torch.long)
        mask = torch.zeros((1, max_length), dtype=torch.long)
        mask[0, :n] = 1
        return out, mask

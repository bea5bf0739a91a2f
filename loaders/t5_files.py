"""umT5-XXL encoder files -> `UMT5Encoder` on a device, streamed tensor by tensor.

Accepted, unchanged:
- the release's `models_t5_umt5-xxl-enc-bf16.pth` (Wan naming, bf16), read with
  `torch.load(weights_only=True, mmap=True)` so nothing is read into RAM up front;
- ComfyUI's `umt5_xxl_fp16.safetensors` and `umt5_xxl_fp8_e4m3fn_scaled.safetensors` (HF naming; scaled fp8
  weights are `weight.float() * scale_weight`, marker key `scaled_fp8`; `spiece_model` is the tokenizer);
- the same tensors in either naming inside either container.

The model is built on `meta` and every tensor is assigned as it is read: host RAM in flight is one
tensor. On the CPU, tensors already in the target dtype are used in place (file-backed pages the kernel
can drop again). The 2 GB token-embedding table stays on the CPU by default (only a few hundred rows are
ever looked up), which keeps it off the GPU and out of RAM.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import torch
import torch.nn as nn

from ..wan.text.umt5 import UMT5Config, UMT5Encoder
from .safetensors_stream import SAFETENSORS_DTYPES

WAN_EMBEDDING = "token_embedding.weight"

# HF / ComfyUI names -> release (Wan) names.
_HF_TO_WAN = [
    (re.compile(r"shared\.weight"), WAN_EMBEDDING),
    (re.compile(r"encoder\.embed_tokens\.weight"), WAN_EMBEDDING),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight"), r"blocks.\1.attn.\2.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.weight"),
     r"blocks.\1.pos_embedding.embedding.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight"), r"blocks.\1.norm1.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.weight"), r"blocks.\1.ffn.gate.0.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.weight"), r"blocks.\1.ffn.fc1.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.weight"), r"blocks.\1.ffn.fc2.weight"),
    (re.compile(r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight"), r"blocks.\1.norm2.weight"),
    (re.compile(r"encoder\.final_layer_norm\.weight"), "norm.weight"),
]
# Keys that carry no encoder weight: tokenizer, fp8 marker/input scales, a full T5's decoder half.
_IGNORED = re.compile(r"^(spiece_model|scaled_fp8|decoder\..*|lm_head\..*|.*\.scale_input|.*\.input_scale)$")
_SCALE_SUFFIXES = (".scale_weight", ".weight_scale")

_PLAIN_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class T5FormatError(ValueError):
    """The file is not a umT5-XXL encoder this loader understands."""


def hf_to_wan_key(key: str) -> Optional[str]:
    """Release name of an HF/ComfyUI umT5 encoder key, or None if it is not one."""
    for pattern, repl in _HF_TO_WAN:
        if pattern.fullmatch(key):
            return pattern.sub(repl, key)
    return None


def _container(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK\x03\x04"):
        return "pth"
    if head.startswith(b"GGUF"):
        raise T5FormatError(f"{path} is a GGUF file; use models_t5_umt5-xxl-enc-bf16.pth or umt5_xxl_*.safetensors")
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    raise T5FormatError(
        f"{path} is neither a torch zip checkpoint (.pth) nor a safetensors file; legacy (non-zip) pickles are "
        "not loaded. Use models_t5_umt5-xxl-enc-bf16.pth or umt5_xxl_fp16/fp8_e4m3fn_scaled.safetensors"
    )


def _looks_like(keys: list[str]) -> str:
    joined = "\n".join(keys)
    if "quant_state.bitsandbytes" in joined:
        return "an NF4 (bitsandbytes) DiT expert"
    if "head.modulation" in keys or "patch_embedding.weight" in keys or ".self_attn." in joined:
        return "a Wan / LingBot-World DiT expert (diffusion model)"
    if "decoder.middle.0.residual.0.gamma" in keys or "encoder.conv1.weight" in keys:
        return "the Wan VAE"
    if "text_model." in joined:
        return "a CLIP text encoder"
    if "model.diffusion_model." in joined:
        return "a full ComfyUI checkpoint"
    return "an unknown model"


@dataclass
class _Entry:
    key: str  # name in the file
    shape: tuple
    dtype: torch.dtype
    scale_key: Optional[str] = None  # scaled-fp8 per-tensor scale


@dataclass
class T5FileInfo:
    """What a file holds, read from its header / pickle index only."""

    path: Path
    container: str  # "pth" | "safetensors"
    naming: str  # "wan" | "hf"
    config: UMT5Config
    entries: dict = field(default_factory=dict)  # release name -> _Entry
    scaled_fp8: bool = False
    has_spiece_model: bool = False
    _state: Optional[dict] = field(default=None, repr=False)  # the mmap'ed .pth state dict

    def describe(self) -> str:
        kinds = sorted({str(e.dtype).replace("torch.", "") for e in self.entries.values()})
        fp8 = ", scaled fp8" if self.scaled_fp8 else ""
        return f"{self.container} ({self.naming} naming, {'/'.join(kinds)}{fp8})"

    def device_bytes(self, dtype: torch.dtype, embedding_on_device: bool = False) -> int:
        """Bytes the weights take on the compute device in `dtype`."""
        item = torch.empty((), dtype=dtype).element_size()
        total = 0
        for name, e in self.entries.items():
            if name == WAN_EMBEDDING and not embedding_on_device:
                continue
            total += _numel(e.shape) * item
        return total


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _read_index(path: Path, container: str) -> tuple[dict, Optional[dict]]:
    """{file key: (shape, dtype)} and, for .pth, the mmap'ed state dict."""
    if container == "pth":
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # weights_only refuses arbitrary pickles: say what happened
            raise T5FormatError(f"{path} could not be read as a weights-only torch checkpoint: {e}") from e
        if isinstance(state, dict) and len(state) == 1 and isinstance(next(iter(state.values())), dict):
            state = next(iter(state.values()))  # {"state_dict": {...}} style wrappers
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise T5FormatError(f"{path} does not hold a flat state dict of tensors")
        return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}, state
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            dt = SAFETENSORS_DTYPES.get(sl.get_dtype())
            if dt is None:
                raise T5FormatError(f"{path}: tensor {k} has unsupported dtype {sl.get_dtype()}")
            out[k] = (tuple(sl.get_shape()), dt)
    return out, None


def _config_from_entries(path: Path, entries: dict, max_distance: int) -> UMT5Config:
    def shape(name):
        if name not in entries:
            raise T5FormatError(f"{path}: missing tensor {name}; the file is incomplete or not a umT5 encoder")
        return entries[name].shape

    vocab, dim = shape(WAN_EMBEDDING)
    layers = 1 + max(int(m.group(1)) for m in (re.match(r"blocks\.(\d+)\.", n) for n in entries) if m)
    buckets, heads = shape("blocks.0.pos_embedding.embedding.weight")
    attn_dim = shape("blocks.0.attn.q.weight")[0]
    if attn_dim % heads:
        raise T5FormatError(f"{path}: attention width {attn_dim} is not divisible by {heads} heads")
    return UMT5Config(
        vocab_size=vocab, dim=dim, num_heads=heads, head_dim=attn_dim // heads,
        ffn_dim=shape("blocks.0.ffn.fc1.weight")[0], num_layers=layers, num_buckets=buckets,
        max_distance=max_distance,
    )


def inspect_t5_file(path: Union[str, os.PathLike], max_distance: int = 128) -> T5FileInfo:
    """Detect container and naming, map every tensor to its release name, infer the config from shapes.

    Raises FileNotFoundError for a missing file and T5FormatError (a ValueError) for anything that is not a
    complete umT5 encoder, saying what the file looks like instead.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"text encoder file {path} does not exist")
    container = _container(path)
    index, state = _read_index(path, container)
    keys = list(index)
    has_spiece = "spiece_model" in index
    scaled_fp8 = "scaled_fp8" in index

    if WAN_EMBEDDING in index or any(re.match(r"blocks\.\d+\.attn\.q\.weight$", k) for k in keys):
        naming = "wan"
    elif any(k.startswith("encoder.block.") for k in keys) or "shared.weight" in index:
        naming = "hf"
    else:
        shown = ", ".join(keys[:4])
        raise T5FormatError(
            f"{path} is not a umT5-XXL text encoder: it looks like {_looks_like(keys)} (first keys: {shown}). "
            "Choose models_t5_umt5-xxl-enc-bf16.pth or umt5_xxl_fp16 / umt5_xxl_fp8_e4m3fn_scaled.safetensors"
        )
    if naming == "wan" and any(".self_attn." in k for k in keys):
        raise T5FormatError(f"{path} is not a umT5-XXL text encoder: it looks like {_looks_like(keys)}")

    entries: dict[str, _Entry] = {}
    unknown = []
    for k, (shp, dt) in index.items():
        if _IGNORED.match(k) or k.endswith(_SCALE_SUFFIXES):
            continue
        name = k if naming == "wan" else hf_to_wan_key(k)
        if name is None:
            unknown.append(k)
            continue
        if name in entries:  # HF files may carry both shared.weight and the tied encoder.embed_tokens
            if k == "shared.weight":
                entries[name] = _Entry(k, shp, dt)
            continue
        entries[name] = _Entry(k, shp, dt)
    for name, e in entries.items():
        for suffix in _SCALE_SUFFIXES:
            sk = e.key[: -len(".weight")] + suffix
            if sk in index:
                e.scale_key = sk
    if naming == "hf" and "blocks.1.attn.q.weight" in entries and "blocks.1.pos_embedding.embedding.weight" not in entries:
        raise T5FormatError(
            f"{path} is a T5 v1.1 encoder with one shared position bias (e.g. Flux/SD3's t5xxl), not umT5-XXL; "
            "LingBot-World needs umt5_xxl_fp16.safetensors, umt5_xxl_fp8_e4m3fn_scaled.safetensors or "
            "models_t5_umt5-xxl-enc-bf16.pth"
        )
    if unknown:
        raise T5FormatError(
            f"{path}: {len(unknown)} tensors are not part of a umT5 encoder (e.g. {', '.join(unknown[:3])}); "
            f"it looks like {_looks_like(keys)}"
        )

    cfg = _config_from_entries(path, entries, max_distance)
    expected = {k: tuple(v.shape) for k, v in UMT5Encoder.on_meta(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(entries))
    extra = sorted(set(entries) - set(expected))
    if missing or extra:
        raise T5FormatError(
            f"{path}: incomplete umT5 encoder ({len(missing)} missing, e.g. {missing[:3]}; "
            f"{len(extra)} unexpected, e.g. {extra[:3]})"
        )
    for k, shp in expected.items():
        if entries[k].shape != shp:
            raise T5FormatError(f"{path}: {entries[k].key} has shape {list(entries[k].shape)}, expected {list(shp)}")
    return T5FileInfo(path, container, naming, cfg, entries, scaled_fp8, has_spiece, state)


# ---- page release for the mmap'ed .pth ----------------------------------------------------------------

_libc = None


def _drop_pages(t: torch.Tensor) -> None:
    """Tell the kernel we are done with a tensor's pages of the mmap'ed (private, never written) checkpoint,
    so they leave this process's RSS instead of accumulating to the file size. Linux only; inward-rounded
    so that no byte outside the tensor is touched."""
    global _libc
    if not sys.platform.startswith("linux") or t.device.type != "cpu":
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    start = (start + page - 1) // page * page
    end = end // page * page
    if end > start:
        _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # MADV_DONTNEED


# ---- streaming ------------------------------------------------------------------------------------------


class _Reader:
    """Tensor access for one file: the mmap'ed .pth dict, or safetensors handles.

    For safetensors, tensors that will be used in place share one long-lived handle; tensors that are
    converted get a handle of their own, closed right after, so their file pages leave RSS at once.
    """

    def __init__(self, info: T5FileInfo):
        self.info = info
        self._shared = None

    @contextmanager
    def tensor(self, key: str, in_place: bool) -> Iterator[torch.Tensor]:
        if self.info.container == "pth":
            t = self.info._state[key]
            yield t
            if not in_place:
                _drop_pages(t)
            return
        from safetensors import safe_open

        if in_place:
            if self._shared is None:
                self._shared = safe_open(str(self.info.path), framework="pt")
            yield self._shared.get_tensor(key)
            return
        with safe_open(str(self.info.path), framework="pt") as f:
            yield f.get_tensor(key)

    def close(self) -> None:
        self._shared = None


def _assign(model: nn.Module, name: str, t: torch.Tensor) -> None:
    mod_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(mod_name), attr, nn.Parameter(t, requires_grad=False))


def load_umt5(
    path: Union[str, os.PathLike, T5FileInfo],
    device: Union[str, torch.device] = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    embedding_device: Union[str, torch.device, None] = "cpu",
    progress: Optional[Callable[[int, int], None]] = None,
) -> UMT5Encoder:
    """Build the encoder on `meta` and stream the file's tensors into it.

    dtype: compute dtype of the blocks (bf16 as the reference; float32 for tests). float16 is refused: T5
    activations overflow it. embedding_device: where the token table lives ("cpu" keeps it out of VRAM; it
    stays in the file's float dtype there and rows are converted on lookup); None = like the blocks
    (`device` and `dtype`). progress(done_bytes, total_bytes), if given, is called after each tensor.
    """
    if dtype == torch.float16:
        raise ValueError("umT5 overflows in float16; load it in bfloat16 (default) or float32")
    info = path if isinstance(path, T5FileInfo) else inspect_t5_file(path)
    device = torch.device(device)
    emb_device = device if embedding_device is None else torch.device(embedding_device)
    keep_table = embedding_device is not None and emb_device.type == "cpu"
    model = UMT5Encoder.on_meta(info.config)
    reader = _Reader(info)
    total = sum(math.prod(e.shape) * e.dtype.itemsize for e in info.entries.values())
    done = 0
    try:
        scales = {}
        for name, e in info.entries.items():
            if e.scale_key is not None:
                with reader.tensor(e.scale_key, in_place=False) as s:
                    scales[name] = s.to(torch.float32).clone()
        for name, e in info.entries.items():
            dev = emb_device if name == WAN_EMBEDDING else device
            want = dtype
            if name == WAN_EMBEDDING and keep_table and e.dtype in _PLAIN_FLOATS and name not in scales:
                want = e.dtype  # rows are cast on lookup; the table itself is used as stored
            in_place = dev.type == "cpu" and e.dtype == want and name not in scales
            with reader.tensor(e.key, in_place) as src:
                if in_place:
                    t = src
                else:
                    t = src.to(dev)  # move the stored bytes first: on a GPU, conversion happens there
                    if name in scales:
                        t = t.to(torch.float32) * scales[name].to(dev)
                    t = t.to(want)
                    if t.data_ptr() == src.data_ptr():
                        t = t.clone()
            _assign(model, name, t)
            if progress is not None:
                done += math.prod(e.shape) * e.dtype.itemsize
                progress(done, total)
    finally:
        reader.close()
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise T5FormatError(f"{info.path}: tensors never loaded: {left[:3]}")
    return model.eval().requires_grad_(False)

"""Load a tiny Wan2.1 decoder: TAEHV's `taew2_1` (.safetensors or .pth) or lightx2v's `lighttaew2_1`, the files
ComfyUI keeps in models/vae_approx.

The two files have the same tensors but not the same input: `taew2_1` decodes the DiT's normalised latents,
`lighttaew2_1` the Wan VAE's raw ones (z·std + mean). The file's contents tell them apart, never its name: TAEHV
releases its decoders in float16 only, lightx2v in float32 (ComfyUI decides the same way); a float32 or bfloat16
file is read as LightTAE. Only the decoder's tensors are read (an encoder in the file is ignored). Keys may carry ComfyUI's `taehv_` prefix
(`taehv_decoder.3.conv.0.weight`). The widths come from the file; the checks say in one line what is wrong with a
file that is not a Wan2.1 tiny decoder (another model's tiny decoder, the full VAE, a DiT). A .pth is read with
`weights_only=True`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Dict, Union

import torch
from safetensors import SafetensorError, safe_open

from ..wan.vae.tiny import GROW, IN_CONV, LATENT_CHANNELS, OUT_CONV, PROJECT, TIME_GROWTH, TinyConfig, TinyDecoder

log = logging.getLogger(__name__)
PathLike = Union[str, os.PathLike]
TINY_VAE_NAMES = ("taew2_1", "lighttaew2_1")  # what to download; the name itself is not checked


class TinyVAEFileError(ValueError):
    """The file is not a usable tiny Wan2.1 decoder."""


def read_decoder_tensors(path: PathLike) -> Dict[str, torch.Tensor]:
    """The file's `decoder.*` tensors (CPU, as stored), keys without ComfyUI's `taehv_` prefix."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"tiny VAE file {p} does not exist; download taew2_1.safetensors (TAEHV) or "
                                f"lighttaew2_1.safetensors (lightx2v) and point to it")
    if p.suffix == ".safetensors":
        try:
            with safe_open(str(p), framework="pt", device="cpu") as f:
                sd = {k: f.get_tensor(k) for k in f.keys() if _decoder_key(k)}
        except (SafetensorError, OSError) as e:
            raise TinyVAEFileError(f"{p}: not a readable safetensors file ({e})") from e
    elif p.suffix in (".pth", ".pt"):
        try:
            raw = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 -- every failure here means "unreadable"
            raise TinyVAEFileError(f"{p}: not a plain PyTorch state dict that loads with weights_only=True "
                                   f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); use the "
                                   f".safetensors file instead") from e
        if not isinstance(raw, dict):
            raise TinyVAEFileError(f"{p}: expected a state dict, found a {type(raw).__name__}")
        sd = {k: v for k, v in raw.items() if isinstance(k, str) and _decoder_key(k) and isinstance(v, torch.Tensor)}
    else:
        raise TinyVAEFileError(f"{p}: unknown tiny VAE file type {p.suffix!r}; expected .safetensors or .pth")
    return {k.removeprefix("taehv_"): v for k, v in sd.items()}


def tiny_config(shapes: Dict[str, tuple], path: PathLike = "<state dict>") -> TinyConfig:
    """The widths of the decoder these tensor shapes describe; TinyVAEFileError if it is not a Wan2.1 one."""
    first = shapes.get(f"decoder.{IN_CONV}.weight")
    if first is None:
        hint = (" (this looks like the full Wan VAE, not a tiny decoder)" if any(k.startswith("decoder.middle")
                                                                             for k in shapes) else "")
        raise TinyVAEFileError(f"{path}: no tiny decoder in this file (no 'decoder.{IN_CONV}.weight'){hint}; use "
                               f"taew2_1.safetensors or lighttaew2_1.safetensors")
    if len(first) != 4 or first[1] != LATENT_CHANNELS:
        raise TinyVAEFileError(f"{path}: a tiny decoder for {first[1] if len(first) > 1 else '?'}-channel latents; "
                               f"LingBot-World's Wan2.1 latents have {LATENT_CHANNELS} channels: use taew2_1 or "
                               f"lighttaew2_1 (not taew2_2 / taehv1_5)")
    widths = [first[0]] + [shapes.get(f"decoder.{i}.weight", (None,))[0] for i in PROJECT]
    out = shapes.get(f"decoder.{OUT_CONV}.weight", (None,))[0]
    if None in widths or out is None or out % 3 or int(round((out // 3) ** 0.5)) ** 2 != out // 3:
        raise TinyVAEFileError(f"{path}: not TAEHV's decoder layout (projection or output convs missing or odd); "
                               f"use taew2_1.safetensors or lighttaew2_1.safetensors")
    cfg = TinyConfig(widths=tuple(int(w) for w in widths), patch=int(round((out // 3) ** 0.5)))
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in TinyDecoder(cfg).state_dict().items()}
    missing = sorted(expected.keys() - shapes.keys())
    wrong = sorted(k for k in expected.keys() & shapes.keys() if tuple(shapes[k]) != expected[k]
                   and not _wider_grow(k, shapes[k], expected[k]))
    if missing or wrong:
        what = ([f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"] if missing else []) + \
               [f"{k}: file {list(shapes[k])} vs {list(expected[k])}" for k in wrong[:4]]
        raise TinyVAEFileError(f"{path}: not a Wan2.1 tiny decoder ({'; '.join(what)}); use taew2_1.safetensors or "
                               f"lighttaew2_1.safetensors")
    return cfg


def takes_raw_latents(dtype: torch.dtype) -> bool:
    """Whether a decoder stored in `dtype` is lightx2v's LightTAE (raw latents in: float32, or a bfloat16 copy)
    rather than TAEHV's taew2_1 (normalised latents in: float16, as released)."""
    return dtype != torch.float16


def tiny_vae_kind(cfg: TinyConfig) -> str:
    """The log's words for the format a decoder was read as."""
    return ("lightx2v's LightTAE (float32 weights: decodes the VAE's raw latents)" if cfg.raw_latents else
            "TAEHV's taew2_1 (float16 weights: decodes the normalised latents)")


def check_tiny_decoder_file(path: PathLike) -> TinyConfig:
    """Everything load_tiny_decoder checks (readable, a Wan2.1 tiny decoder's tensors and shapes) without building
    the decoder; its widths."""
    return _checked(path)[1]


def load_tiny_decoder(path: PathLike, device: Union[str, torch.device] = "cpu",
                      dtype: torch.dtype = torch.float32) -> TinyDecoder:
    """The checked decoder on `device` in `dtype` (bf16 on a GPU: it is a preview decoder; float32 on the CPU)."""
    sd, cfg = _checked(path)
    with torch.device("meta"):
        model = TinyDecoder(cfg)
    expected = model.state_dict()
    weights = {}
    for k, ref in expected.items():
        v = sd[k]
        if v.shape != ref.shape:  # a grow layer stored for more frames than it makes: its last frames' channels
            v = v[-ref.shape[0]:]
        weights[k] = v.to(device=device, dtype=dtype)
    model.load_state_dict(weights, strict=True, assign=True)
    log.info("tiny decoder %s: %s", Path(path).name, tiny_vae_kind(cfg))
    return model.eval().requires_grad_(False)


def _checked(path: PathLike) -> tuple[Dict[str, torch.Tensor], TinyConfig]:
    sd = read_decoder_tensors(path)
    cfg = tiny_config({k: tuple(v.shape) for k, v in sd.items()}, Path(path))
    return sd, dataclasses.replace(cfg, raw_latents=takes_raw_latents(sd[f"decoder.{IN_CONV}.weight"].dtype))


def _decoder_key(key: str) -> bool:
    return key.startswith(("decoder.", "taehv_decoder."))


def _wider_grow(key: str, got: tuple, want: tuple) -> bool:
    """TAEHV files may store a grow layer for more output frames than Wan's layout uses (x2 where x1 is run)."""
    is_grow = any(key == f"decoder.{i}.conv.weight" for i, s in zip(GROW, TIME_GROWTH))
    return is_grow and len(got) == 4 and got[1:] == want[1:] and got[0] > want[0] and got[0] % want[0] == 0

"""Read a Wan2.1 VAE file's config from its tensor shapes, so tiny demo VAEs load like the real one.

`loaders.vae_files.load_vae` needs a `VAEConfig`; the release's file matches the default config, but a
node that loads whatever the user picked (the random-weight demo VAE included) must not guess. The
shapes tell everything: base width from `encoder.conv1`, latent channels from `conv2`, and the level
structure (residual blocks per level, channel multipliers, which downsamples are temporal) from the
`encoder.downsamples.N` entries. Only headers / the pickle index are read, never the data.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Sequence, Union

import torch

from ..wan.vae.model import VAEConfig
from .safetensors_stream import read_header
from .vae_files import VAEFileError, describe_foreign_checkpoint

PathLike = Union[str, os.PathLike]
_DOWN = re.compile(r"encoder\.downsamples\.(\d+)\.(residual\.6|resample\.1|time_conv)\.weight$")


def vae_file_shapes(path: PathLike) -> dict[str, tuple[int, ...]]:
    """key -> shape of a `.safetensors` (header only) or `.pth` (weights_only, memory-mapped) VAE file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"VAE file {p} does not exist; download Wan2.1_VAE.pth (or ComfyUI's "
                                f"wan_2.1_vae.safetensors) and point to it")
    if p.suffix in (".safetensors", ".sft"):
        return read_header(p).shapes()
    try:
        sd = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # pickle refusals and zip errors alike: the file is not a plain state dict
        raise VAEFileError(f"{p}: not a readable weights-only torch checkpoint ({e})") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise VAEFileError(f"{p}: expected a state dict of tensors, got {type(sd).__name__}")
    return {k: tuple(v.shape) for k, v in sd.items()}


def infer_vae_config(shapes: Mapping[str, Sequence[int]], source: str = "VAE file") -> VAEConfig:
    """The `VAEConfig` whose state dict has these shapes (latent mean/std keep the Wan2.1 values)."""
    if "encoder.conv1.weight" not in shapes or "conv2.weight" not in shapes:
        what = describe_foreign_checkpoint(shapes.keys()) or "not a Wan2.1 VAE"
        raise VAEFileError(f"{source}: no encoder.conv1/conv2 tensors; {what}")
    dim = int(shapes["encoder.conv1.weight"][0])
    z_dim = int(shapes["conv2.weight"][0])
    layers: dict[int, str] = {}
    channels: dict[int, int] = {}
    temporal: set[int] = set()
    for k, shape in shapes.items():
        m = _DOWN.match(k)
        if not m:
            continue
        i, kind = int(m.group(1)), m.group(2)
        if kind == "residual.6":
            layers[i] = "res"
            channels[i] = int(shape[0])
        elif kind == "resample.1":
            layers[i] = "down"
        else:
            temporal.add(i)
    if not layers:
        raise VAEFileError(f"{source}: no encoder.downsamples.* tensors; not a Wan2.1 VAE")
    order = [layers[i] for i in sorted(layers)]
    if sorted(layers) != list(range(len(layers))):
        raise VAEFileError(f"{source}: encoder.downsamples indices {sorted(layers)} are not 0..N-1")
    # Levels: runs of residual blocks, separated by one downsample each (none after the last level).
    levels: list[list[int]] = [[]]
    down_idx: list[int] = []
    for i, kind in zip(sorted(layers), order):
        if kind == "res":
            levels[-1].append(channels[i])
        else:
            down_idx.append(i)
            levels.append([])
    sizes = {len(lv) for lv in levels}
    if len(sizes) != 1 or 0 in sizes:
        raise VAEFileError(f"{source}: uneven encoder levels {[len(lv) for lv in levels]}; not a Wan2.1 VAE")
    mults = []
    for lv in levels:
        if lv[-1] % dim:
            raise VAEFileError(f"{source}: level width {lv[-1]} is not a multiple of the base width {dim}")
        mults.append(lv[-1] // dim)
    try:
        return VAEConfig(
            dim=dim,
            z_dim=z_dim,
            dim_mult=tuple(mults),
            num_res_blocks=sizes.pop(),
            temporal_downsample=tuple(i in temporal for i in down_idx),
        )
    except ValueError as e:
        raise VAEFileError(f"{source}: inconsistent VAE shapes ({e})") from None


def vae_config_for_file(path: PathLike) -> VAEConfig:
    return infer_vae_config(vae_file_shapes(path), str(path))

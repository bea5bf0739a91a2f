"""Load the Wan2.1 VAE from the release's `Wan2.1_VAE.pth` or ComfyUI's `wan_2.1_vae.safetensors`.

Both files hold the same keys (spec §8.1, comfyui-integration §6.2); the safetensors one may be fp16/bf16.
The model is built on the `meta` device and every tensor goes straight from the file to the target device
as float32, so neither a random-initialised copy nor a second host copy of the weights is ever made.
The file is checked before anything is allocated: a DiT or T5 file given as the VAE, missing or unexpected
keys, and wrong shapes are refused with a message that says what was found.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple, Union

import torch
from safetensors import SafetensorError, safe_open

from ..wan.vae.model import VAEConfig, WanVAE

PathLike = Union[str, os.PathLike]
VAE_MARKER = "decoder.middle.0.residual.0.gamma"  # what ComfyUI detects a Wan VAE by
_SHOW = 8  # keys named in an error message before "... and N more"


class VAEFileError(ValueError):
    """The file is not a usable Wan2.1 VAE checkpoint."""


def describe_foreign_checkpoint(keys: Iterable[str]) -> Optional[str]:
    """What a non-Wan2.1-VAE state dict looks like, from its keys (None when it looks like the VAE)."""
    keys = set(keys)

    def has(*fragments: str) -> Optional[str]:
        return next((k for k in sorted(keys) if any(f in k for f in fragments)), None)

    if VAE_MARKER in keys:
        if "decoder.upsamples.0.upsamples.0.residual.2.weight" in keys:
            return ("this looks like the Wan2.2 VAE (48-channel latents, used by TI2V-5B); LingBot-World needs "
                    "the Wan2.1 VAE (Wan2.1_VAE.pth or wan_2.1_vae.safetensors)")
        return None
    k = has("blocks.0.self_attn", "patch_embedding", "head.modulation")
    if k:
        return f"this looks like a Wan DiT expert (key {k!r}), not the VAE"
    k = has("blocks.0.attn.q", "encoder.block.", "token_embedding", "shared.weight")
    if k:
        return f"this looks like a umT5 text encoder (key {k!r}), not the VAE"
    k = has("up_blocks.0.resnets", "quant_conv.weight")
    if k:
        return (f"this looks like a diffusers-format AutoencoderKLWan (key {k!r}); use the original "
                f"Wan2.1_VAE.pth or ComfyUI's wan_2.1_vae.safetensors instead")
    k = has("." + VAE_MARKER)
    if k:
        prefix = k[: -len(VAE_MARKER)]
        return f"the VAE keys carry the prefix {prefix!r}; save the state dict without it"
    return None


class _TensorSource:
    """Shapes, dtypes and per-key access for a .pth or .safetensors file."""

    def __init__(self, path: Path):
        self.path = path
        if path.suffix == ".safetensors":
            self._open_safetensors()
        elif path.suffix in (".pth", ".pt", ".ckpt", ".bin"):
            self._open_pth()
        else:
            raise VAEFileError(f"{path}: unknown VAE file type {path.suffix!r}; expected .pth or .safetensors")

    def _open_safetensors(self) -> None:
        try:
            f = safe_open(str(self.path), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:
            raise VAEFileError(f"{self.path}: not a readable safetensors file ({e})") from e
        self.keys = list(f.keys())
        meta = {k: f.get_slice(k) for k in self.keys}
        self.shapes = {k: tuple(s.get_shape()) for k, s in meta.items()}
        self.dtypes = {k: s.get_dtype() for k, s in meta.items()}
        self.get = f.get_tensor  # keeps the file open for as long as the source lives

    def _open_pth(self) -> None:
        sd = self._torch_load()
        if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            what = type(sd).__name__ if not isinstance(sd, dict) else f"dict with keys {list(sd)[:_SHOW]}"
            raise VAEFileError(f"{self.path}: expected a plain state dict of tensors, found a {what}")
        self.keys = list(sd)
        self.shapes = {k: tuple(v.shape) for k, v in sd.items()}
        self.dtypes = {k: str(v.dtype) for k, v in sd.items()}
        self.get = sd.__getitem__

    def _torch_load(self):
        # every failure here means "unreadable"; it is reported with its cause
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001
            if "mmap" not in str(e):  # only the old (non-zip) format cannot be memory-mapped
                raise self._load_error(e) from e
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise self._load_error(e) from e

    def _load_error(self, e: Exception) -> VAEFileError:
        msg = str(e)
        if "legacy .tar format" in msg:
            why = "it uses PyTorch's legacy .tar format, which cannot be read without unsafe unpickling"
        elif "Weights only load failed" in msg:
            why = "it contains Python objects besides tensors, and only weights are loaded (weights_only=True)"
        else:
            why = f"it is not a readable PyTorch checkpoint ({msg.splitlines()[0] if msg else type(e).__name__})"
        return VAEFileError(f"{self.path}: {why}; use ComfyUI's wan_2.1_vae.safetensors instead")


def _name_some(keys) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - _SHOW} more" if len(keys) > _SHOW else ""
    return ", ".join(keys[:_SHOW]) + more


def check_vae_keys(shapes: Dict[str, Tuple[int, ...]], cfg: VAEConfig, path: PathLike = "<state dict>") -> None:
    """Raise VAEFileError unless `shapes` (key -> shape) is exactly the VAE of `cfg`."""
    foreign = describe_foreign_checkpoint(shapes)
    if foreign:
        raise VAEFileError(f"{path}: {foreign}")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in WanVAE(cfg).state_dict().items()}
    missing = expected.keys() - shapes.keys()
    unexpected = shapes.keys() - expected.keys()
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {_name_some(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_name_some(unexpected)}")
    wrong = sorted(k for k in expected.keys() & shapes.keys() if shapes[k] != expected[k])
    if wrong:
        shown = "; ".join(f"{k}: file {list(shapes[k])} vs model {list(expected[k])}" for k in wrong[:_SHOW])
        more = f" ... and {len(wrong) - _SHOW} more" if len(wrong) > _SHOW else ""
        problems.append(f"{len(wrong)} shape mismatch(es): {shown}{more}")
    if problems:
        raise VAEFileError(f"{path}: not a Wan2.1 VAE checkpoint for this config ({len(expected)} tensors "
                           f"expected): " + " | ".join(problems))


def read_vae_state_dict(path: PathLike) -> Dict[str, torch.Tensor]:
    """The file's tensors exactly as stored (CPU, original dtype). Mostly for tools and tests."""
    src = _open(path)
    return {k: src.get(k) for k in src.keys}


def _checked_source(path: PathLike, cfg: VAEConfig) -> _TensorSource:
    src = _open(path)
    check_vae_keys(src.shapes, cfg, src.path)
    not_float = [k for k in src.keys if not _is_float(src.dtypes[k])]
    if not_float:
        raise VAEFileError(f"{src.path}: non-floating tensors in a VAE file: {_name_some(not_float)}")
    return src


def check_vae_file(path: PathLike, config: Optional[VAEConfig] = None) -> None:
    """Everything load_vae checks (readable, keys, shapes, dtypes) without reading the weights."""
    _checked_source(path, config or VAEConfig())


def load_vae(path: PathLike, device: Union[str, torch.device] = "cpu",
             config: Optional[VAEConfig] = None) -> WanVAE:
    """Build the VAE on `meta` and fill it from `path`, each tensor upcast to float32 on `device`."""
    cfg = config or VAEConfig()
    src = _checked_source(path, cfg)
    with torch.device("meta"):
        vae = WanVAE(cfg)
    weights = {k: src.get(k).to(device=device, dtype=torch.float32) for k in src.keys}
    vae.load_state_dict(weights, strict=True, assign=True)
    del weights
    return vae.eval().requires_grad_(False)


def _open(path: PathLike) -> _TensorSource:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"VAE file {p} does not exist; download Wan2.1_VAE.pth (or ComfyUI's "
                                f"wan_2.1_vae.safetensors) and point to it")
    return _TensorSource(p)


def _is_float(dtype) -> bool:
    name = str(dtype).lower().replace("torch.", "")
    return name.startswith(("float", "bfloat", "f16", "f32", "f64", "bf16", "f8"))

"""Opening a World session from files (the player's and the CLI's way; ComfyUI brings its own loaded pieces).

`open_pieces` checks the files from their headers, plans the memory for the size asked for, and returns what a
session is made of: the placement (with the model loaded on demand, LoRAs on it), the VAE on the device, the
config. `start_inputs` turns an image and a prompt into the video's size, conditioning track and prompt embedding.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

import torch

from ..loaders.fast_state_file import model_fingerprint, model_label
from ..memory.kv_placement import FastPlacement
from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..speed.levers import plan_levers
from ..wan.i2v import ConditionTrack
from ..wan.sampling.fast_state import FastSettings
from ..wan.sizes import max_area_for, target_size
from .files import FastFiles
from .plan import compute_dtype, plan_world_memory, play_layout
from .settings import WorldSettings

log = logging.getLogger(__name__)


@dataclass
class Pieces:
    placement: FastPlacement
    load_model: Callable
    vae: object
    fmt: object
    plan_reason: str
    tiny_decoder: object = None  # a wan.vae.tiny.TinyDecoder when the settings ask for one


def planning_size(size: str) -> tuple[int, int]:
    """The (height, width) the memory is planned for: an "H*W" size as given, a named one as 16:9 landscape."""
    key = size.strip().lower()
    for sep in ("*", "x"):
        a, _, b = key.partition(sep)
        if b and a.strip().isdigit() and b.strip().isdigit():
            return target_size(int(a), int(b), max_area_for(size))
    return target_size(9, 16, max_area_for(size))


def read_loras(settings: WorldSettings, cfg) -> list:
    """The settings' LoRA files read and matched against the model (a LoraFileError names the bad one)."""
    if not settings.loras:
        return []
    from ..loaders.lora_files import dit_weight_shapes, load_lora

    shapes = dit_weight_shapes(cfg)
    return [(load_lora(Path(p), shapes), float(s)) for p, s in settings.loras]


def open_pieces(files: FastFiles, settings: WorldSettings, device: torch.device, *, play: bool = True) -> Pieces:
    """Check, plan and prepare (the model loads when the first chunk needs it, or on `load_model()`)."""
    from ..loaders.vae_files import load_vae

    if settings.weights in LOWP_WEIGHTS:  # refused in one line before anything is read or planned
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(settings.weights, device)
    fmt, note = files.check(settings.weights)
    if note:
        log.warning("%s", note)
    cfg = fmt.config
    loras = read_loras(settings, cfg)
    tiny = load_tiny(settings.tiny_vae, device)  # a bad file is refused before the plan and the VAE
    height, width = planning_size(settings.size)
    probe = fast_settings(settings, fmt, device, height, width)
    layout = play_layout(probe) if play else probe.layout(3)
    plan, _ = plan_world_memory(cfg, layout, device, height, width, weights=settings.weights,
                                kv_cache=settings.kv_cache, kv_layers_on_gpu=settings.kv_layers_on_gpu,
                                stream_decode="on", vae_cfg=files.vae_config(),
                                decode_bytes=tiny_bytes(tiny, height, width, beside_vae=files.vae_config()),
                                **plan_levers(settings.speed))
    log.info("memory plan: %s", plan.reason)
    placement = FastPlacement(plan, device, log.info)
    dtype = compute_dtype(settings.weights, device)

    def load_model(progress=None):
        model = placement.load_model(files.fast, settings.weights, compute_dtype=dtype, progress=progress)
        if loras:
            from ..loaders.lora_apply import put_loras

            put_loras(model, loras, dtype=dtype, device=device, name=files.fast.name)
        return model

    vae = load_vae(files.vae, device, config=files.vae_config())
    return Pieces(placement, load_model, vae, fmt, plan.reason, tiny)


def load_tiny(path, device: torch.device):
    """The tiny decoder of `path` (None: none asked for): bf16 on a GPU, float32 on the CPU."""
    if path is None:
        return None
    from ..loaders.tiny_vae_files import load_tiny_decoder

    return load_tiny_decoder(path, device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def tiny_bytes(tiny, height: int, width: int, beside_vae=False):
    """What the memory plan counts for the tiny decoder (None: the VAE decodes). beside_vae: the VAE stays on the
    device too (the player encodes new start images with it): its weights are counted as well (a VAEConfig, or
    None for the Wan2.1 VAE's; False: the VAE leaves the device, as in the CLI)."""
    if tiny is None:
        return None
    from ..wan.vae.tiny import tiny_decode_bytes

    total = tiny_decode_bytes(tiny.cfg, height, width, tiny.dtype.itemsize)
    if beside_vae is not False:
        from ..wan.vae.footprint import vae_weight_bytes
        from ..wan.vae.model import VAEConfig

        total += vae_weight_bytes(beside_vae or VAEConfig())
    return total


def fast_settings(settings: WorldSettings, fmt, device: torch.device, height: int, width: int) -> FastSettings:
    """The fixed settings of a video of this size (what a saved state checks when it is continued)."""
    dtype = compute_dtype(settings.weights, device)
    window = settings.window
    if settings.speed is not None:  # a preset's window cap (draft: 15 latent frames)
        window = settings.speed.fast_window(window)
    return FastSettings(height, width, int(settings.seed), settings.noise, settings.rule, window=window,
                        sink=settings.sink, max_attention=settings.max_attention, precision=settings.precision,
                        weights=settings.weights, cache_dtype=str(dtype).replace("torch.", ""),
                        model=model_fingerprint(fmt), model_label=model_label(fmt), vae_tiled=settings.vae_tiled)


def load_start_image(image: Union[str, Path, torch.Tensor]) -> torch.Tensor:
    """A path (PNG/JPEG) or a [3, H, W] tensor in [-1, 1] -> the tensor."""
    if isinstance(image, torch.Tensor):
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"the start image must be [3, H, W] in [-1, 1], got {tuple(image.shape)}")
        return image.float()
    from ..loaders.image_files import load_image

    decoded = load_image(image)
    for n in decoded.notes:
        log.info("image %s: %s", image, n)
    return decoded.pixels


def start_inputs(files: FastFiles, settings: WorldSettings, vae, image: torch.Tensor, prompt: str,
                 device: torch.device) -> tuple[int, int, ConditionTrack, torch.Tensor]:
    """(height, width, conditioning track, prompt embedding [L, dim]) of a new video."""
    from ..text_encoder.encode import encode_prompts

    height, width = target_size(image.shape[1], image.shape[2], max_area_for(settings.size))
    t = settings.text
    context = encode_prompts(files.t5, files.tokenizer, [prompt], device=t.device, cache_dir=t.cache_dir,
                             use_cache=t.use_cache, timeout=t.timeout)[0]
    with torch.inference_mode():
        condition = ConditionTrack.build(vae, image, height, width, tiled=settings.vae_tiled)
    return height, width, condition, context

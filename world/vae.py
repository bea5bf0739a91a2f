"""The Wan 2.1 VAE as a door uses it outside a world's session (ComfyUI's VAE, image-to-video and Fast nodes): its
file read with the configuration its shapes give, the memory an encode or a decode takes, the first frame's I2V
conditioning and the conditioning track of a whole video, and a chunk-by-chunk decoder warmed up on the frames
before a part (with the kernels the pack's other decodes run on the device). wan/vae/ and wan/i2v.py do the work;
loaders/ reads the files.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..loaders.vae_files import load_vae
from ..loaders.vae_shapes import vae_config_for_file
from ..speed.vae_norm import decoder_norm_silu
from ..wan.i2v import ConditionTrack, build_i2v_condition, first_frame_mask, image_to_model_range, resize_first_frame
from ..wan.vae.footprint import vae_work_bytes
from ..wan.vae.model import DEFAULT_OVERLAP, VAEConfig
from ..wan.vae.reach import encoder_reach
from ..wan.vae.streaming import StreamingDecoder, context_latents, streaming_decode_bytes, warm_up

__all__ = ["DEFAULT_OVERLAP", "ConditionTrack", "VAEConfig", "build_i2v_condition", "chunk_decoder",
           "context_latents", "decoder_norm_silu", "first_frame_mask", "image_to_model_range", "read_vae",
           "resize_first_frame", "streaming_decode_bytes", "track_work_bytes", "vae_work_bytes"]

ENCODE_TILE_PX = 256  # the tile side an encode's memory is counted for (an untiled encode is counted whole)


def read_vae(path: Path, device) -> torch.nn.Module:
    """The VAE of `path` (the release's .pth or ComfyUI's .safetensors), its configuration read from the file's
    shapes, in float32 on `device`."""
    return load_vae(path, device=device, config=vae_config_for_file(path))


def track_work_bytes(cfg: VAEConfig, height: int, width: int, tiled: bool) -> int:
    """The memory a ConditionTrack's build takes beyond the weights: one encode of the frames the first frame
    reaches (about 117 for the Wan 2.1 VAE)."""
    frames = cfg.temporal_factor * (encoder_reach(cfg) + 1) + 1
    return vae_work_bytes(cfg, height, width, frames, tiled, ENCODE_TILE_PX)


def chunk_decoder(vae, before: Optional[torch.Tensor] = None) -> StreamingDecoder:
    """A decoder of one chunk at a time on the VAE's device. before: the video's latent so far (normalised); the
    decoder is warmed up on its last frames, so a continued part's chunks decode exactly as in the whole video."""
    decoder = StreamingDecoder(vae, norm_silu=decoder_norm_silu(vae.device))
    if before is not None:
        try:
            with torch.inference_mode():
                warm_up(decoder, before.to(vae.device))
        except BaseException:
            decoder.close()
            raise
    return decoder

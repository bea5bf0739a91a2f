"""Decoding in a World session: the streaming decoder of the VAE or the tiny decoder, warmed up on the frames before
a chunk, and the whole video decoded again from its latents (a mixin of WorldSession, world/session.py)."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ..wan.vae.streaming import StreamingDecoder, context_latents
from ..wan.vae.tiny import TinyStreamingDecoder, tiny_context_latents
from .errors import WorldError
from .frames import to_uint8


class SessionDecoding:
    """The session's decoder (`decoder`, made on demand) and decodes; uses its vae, tiny_decoder, speed, latents."""

    def latent(self) -> torch.Tensor:
        """The whole video's latent so far [1, 16, F, h, w] (normalised, CPU)."""
        if not self.parts:
            raise WorldError("no chunk made yet")
        return self.state.latent()

    def video_frames(self) -> Iterator[np.ndarray]:
        """The whole video so far, decoded again from its latents (uint8 [n, H, W, 3] per latent frame): what a
        batch run writes."""
        if not self.decodes:
            raise WorldError("this session has no VAE to decode with")
        z = self.latent()
        decoder = self._new_decoder()
        try:
            for i in range(z.shape[2]):
                with torch.inference_mode():
                    yield to_uint8(self._decode(decoder, z[:, :, i:i + 1].to(self.device)))
        finally:
            decoder.close()

    @property
    def decodes(self) -> bool:
        """Whether this session decodes frames (it has a VAE or a tiny decoder)."""
        return self.vae is not None or self.tiny_decoder is not None

    def _decoder_for(self, on_frames):
        if on_frames is None or not self.decodes:
            return None
        if self.decoder is None:
            self.decoder = self._new_decoder()
            if self.parts:  # start from the frames before (decoded as they were: maybe in bf16)
                z = self.latent()
                if self.tiny_decoder is not None:
                    n = tiny_context_latents(self.tiny_decoder.cfg, z.shape[2])
                else:
                    n = context_latents(self.vae.cfg, z.shape[2])
                with torch.inference_mode():
                    self._decode(self.decoder, z[:, :, z.shape[2] - n:].to(self.device))
        return self.decoder

    def _new_decoder(self):
        """The tiny decoder's streaming decoder, or the VAE's with the device's norm + SiLU (speed/vae_norm.py:
        fused on a CUDA GPU with Triton)."""
        if self.tiny_decoder is not None:
            return TinyStreamingDecoder(self.tiny_decoder)
        from ..speed.vae_norm import decoder_norm_silu

        return StreamingDecoder(self.vae, tiled=self.settings.vae_tiled, norm_silu=decoder_norm_silu(self.vae.device))

    def _decode(self, decoder, z: torch.Tensor) -> torch.Tensor:
        """The frames of latent frames `z`, in bf16 when the speed plan's decode lever says so."""
        from ..speed.decode import decode_precision
        from ..speed.levers import plan_levers

        with decode_precision(self.device, plan_levers(self.speed)["decode_bf16"]):
            return decoder.decode(z)

    def _reset_decoder(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
        self.decoder = None

"""Decoding in a World session: the streaming decoder of the VAE or the tiny decoder, warmed up on the frames before
a chunk, a played chunk's preview, and the whole video decoded again from its latents (a mixin of WorldSession,
world/session.py)."""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from ..wan.vae.streaming import StreamingDecoder, context_latents
from ..wan.vae.tiny import TinyStreamingDecoder, tiny_context_latents
from .errors import WorldError, check_finite_frames
from .frames import ChunkFrames, to_uint8


def decode_dtype_of(speed) -> str:
    """The decode precision a speed plan names ("float32", "fp16" or "bf16"; None: the release's float32)."""
    from ..speed.levers import plan_levers

    return plan_levers(speed)["decode_dtype"]


def decode_in(device, dtype: str, decode: Callable[[], torch.Tensor]) -> torch.Tensor:
    """decode() in the precision `dtype` (speed/decode.py), its frames checked finite."""
    from ..speed.decode import decode_precision

    with decode_precision(device, dtype):
        frames = decode()
    return check_finite_frames(frames, dtype)


def plan_decode(device, speed, decode: Callable[[], torch.Tensor]) -> torch.Tensor:
    """decode() in the precision the speed plan names: every decode of a session, a base video, a first part or a
    continuation goes through here (ComfyUI's LingBot VAE Decode through decode_in, with the precision its LATENT
    carries), so the same latents give the same frames in each."""
    return decode_in(device, decode_dtype_of(speed), decode)


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
        if not self.parts:
            raise WorldError("no chunk made yet")
        decoder = self._new_decoder()
        try:
            for z in self.state.latents:  # part by part: a long video's latents are never all in RAM at once
                for i in range(z.shape[2]):
                    with torch.inference_mode():
                        yield to_uint8(self._decode(decoder, z[:, :, i:i + 1].to(self.device)))
        finally:
            decoder.close()

    def _last_latent_frames(self, n: int) -> torch.Tensor:
        """The video's last `n` latent frames, read from the newest parts only."""
        if n <= 0:
            return self.state.latents[-1][:, :, :0]
        pieces, have = [], 0
        for z in reversed(self.state.latents):
            if have >= n:
                break
            pieces.append(z)
            have += z.shape[2]
        z = torch.cat(pieces[::-1], dim=2)
        return z[:, :, z.shape[2] - n:]

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
                total = self.state.latent_frames
                if self.tiny_decoder is not None:
                    n = tiny_context_latents(self.tiny_decoder.cfg, total)
                else:
                    n = context_latents(self.vae.cfg, total)
                with torch.inference_mode():
                    self._decode(self.decoder, self._last_latent_frames(n).to(self.device))
        return self.decoder

    def _chunk_preview(self, decoder, chunk: int, first_frame: int,
                       on_preview: Optional[Callable[[ChunkFrames], None]]) -> Optional["ChunkPreview"]:
        """The step callback that previews one played chunk (None: no preview asked for, or the frames come from the
        VAE, whose decode costs too much to make twice)."""
        if on_preview is None or not isinstance(decoder, TinyStreamingDecoder):
            return None
        return ChunkPreview(self, decoder, chunk, first_frame, on_preview, self.callback)

    def _new_decoder(self):
        """The tiny decoder's streaming decoder, or the VAE's with the device's norm + SiLU (speed/vae_norm.py:
        fused on a CUDA GPU with Triton)."""
        if self.tiny_decoder is not None:
            return TinyStreamingDecoder(self.tiny_decoder)
        from ..speed.vae_norm import decoder_norm_silu

        return StreamingDecoder(self.vae, tiled=self.settings.vae_tiled, norm_silu=decoder_norm_silu(self.vae.device))

    def _decode(self, decoder, z: torch.Tensor) -> torch.Tensor:
        """The frames of latent frames `z`, in the precision the speed plan's decode lever names."""
        return plan_decode(self.device, self.speed, lambda: decoder.decode(z))

    def _reset_decoder(self) -> None:
        if self.decoder is not None:
            self.decoder.close()
        self.decoder = None


class ChunkPreview:
    """A played chunk's run callback: after the chunk's first model call its x0 is decoded by a fork of the session's
    tiny decoder and handed to `on_preview` as ChunkFrames(preview=True); then the session's own callback runs.

    The fork starts from the decoder's memory and leaves the decoder where it was, so the chunk's real frames are
    decoded exactly as without a preview; the preview's x0 is never written anywhere (the K/V cache, the latents and
    every saved file hold the finished chunk only)."""

    def __init__(self, session, decoder: TinyStreamingDecoder, chunk: int, first_frame: int,
                 on_preview: Callable[[ChunkFrames], None], callback: Optional[Callable] = None):
        self.session, self.decoder, self.chunk, self.first_frame = session, decoder, chunk, first_frame
        self.on_preview, self.callback = on_preview, callback
        self.seconds = 0.0  # the preview's decode (the chunk's run took this much longer)

    def __call__(self, info) -> None:
        if info.step == 0:
            t = time.perf_counter()
            fork = self.decoder.fork()
            try:
                with torch.inference_mode():
                    frames = to_uint8(self.session._decode(fork, info.x0))
            finally:
                fork.close()
            self.seconds += time.perf_counter() - t
            self.on_preview(ChunkFrames(self.chunk, self.first_frame, frames, preview=True))
        if self.callback is not None:
            self.callback(info)

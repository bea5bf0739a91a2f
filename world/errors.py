"""What a world raises at a door: a request it cannot carry out as given, a run stopped on request, and a chunk whose
latent or frames came out as inf or NaN."""
from typing import Optional

from ..wan.sampling.sampler import Cancelled  # a run's cancel check said stop (between two model calls)

__all__ = ["Cancelled", "WorldError", "check_finite_chunk", "check_finite_frames"]


class WorldError(ValueError):
    """A request the session cannot carry out as given; the message says what to do."""


def check_finite_chunk(x0, chunk: int, compute: Optional[str]) -> None:
    """Raise WorldError when a chunk's latent holds inf or NaN, before it is decoded, saved or shown (its frames
    would be black, and every later chunk reads it through the K/V cache). `compute`: the speed plan's GEMM mode,
    which names the likely cause. One small reduction and a wait for the chunk's last kernels, which its decode
    waits for anyway."""
    if bool(x0.isfinite().all()):
        return
    if compute == "fp16acc":
        cause = ("with --compute fp16acc the DiT computes in fp16, and these weights pass fp16's largest value "
                 "(65504); run it with compute bf16 (--compute bf16, or LingBot Speed Options' compute widget)")
    else:
        cause = ("the model's output is not finite; check the weights with `lingbot-world check-expert`, or run "
                 "it with --speed exact")
    raise WorldError(f"chunk {chunk + 1} of this part came out as inf/NaN: {cause} (the video stays at its last "
                     "whole part)")


def check_finite_frames(frames, decode_dtype: str):
    """The decoded frames, or WorldError when they hold inf or NaN (they would be shown and saved black).
    `decode_dtype`: the speed plan's decode precision, which names the likely cause."""
    if bool(frames.isfinite().all()):
        return frames
    if decode_dtype == "fp16":
        cause = ("the VAE decode runs in fp16 and this decoder passed fp16's largest value (65504); decode in float32 "
                 "with --speed exact (LingBot Speed Options: speed exact)")
    else:
        cause = f"the {decode_dtype} decode of finite latents is not finite; check the VAE / tiny decoder file"
    raise WorldError(f"the decoded frames came out as inf/NaN: {cause}")

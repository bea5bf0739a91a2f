"""The Fast model's chunk-schedule levers (issue 26): what a speed preset changes in the chunk loop itself.

These change the output (they are not rounding): the `draft` preset turns them on, every other preset leaves
them at the release's schedule. Each is measured on its own in BENCHMARKS ("Fast model toward real time").

- steps: denoising calls per chunk. 4 is the release's (v1 Fast: [999, 978, 947, 825]); the model's recipe
  (wan/sampling/recipe.py) says which 3 and 2 it keeps: the step closest to its neighbour is dropped first (v1 Fast:
  978, since 999 -> 947 is the smallest jump the distilled schedule can skip), and 2 keep the first and the last.
- fold_context: no separate context pass; the last denoising call writes the K/V later chunks read (from the
  chunk at t = 825, not the clean chunk at t = 0). One model call fewer per chunk.
- window_frames: cap on the K/V window (latent frames): later chunks attend to at most this many frames (the
  sink included), so attention reads fewer keys. None keeps the run's own window.
- kv_fp8: the K/V cache in FP8 (wan/dit/kv_fp8.py: e4m3 codes, a power-of-two scale per token and head). A layer
  streamed from RAM takes half the RAM and moves half the bytes per call: a `draft` run's RSS drops by about 8 GB
  and a `fast` one's by 13 GB, and a chunk gains where the host's copies bound it (6 % for `draft` on one H100,
  nothing measurable on another, nor for `fast`).

And the door's VAE decode of each chunk (speed/decode.py ChunkDecoder; the latents do not change):
- decode_overlap: the chunk's decode on a side stream beside the next chunk's DiT (the same frames, later).
- decode_dtype: "float32" (the release's), or the decoder's convolutions in "fp16" or "bf16" (approximate frames;
  speed/decode.py says how far each is from float32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..wan.sampling.recipe import ChunkRecipe
from .decode import DECODE_DTYPES

# Denoising calls per chunk the levers offer: the release's 4 and the fewer-step variants every causal recipe has.
STEP_CHOICES = (4, 3, 2)
RELEASE_STEPS = 4


@dataclass(frozen=True)
class ChunkLevers:
    steps: int = RELEASE_STEPS
    fold_context: bool = False
    window_frames: Optional[int] = None
    decode_overlap: bool = False
    decode_dtype: str = "float32"
    kv_fp8: bool = False

    def __post_init__(self):
        if self.steps not in STEP_CHOICES:
            raise ValueError(f"steps={self.steps!r}: the Fast schedule has {sorted(STEP_CHOICES)} step variants")
        if self.window_frames is not None and (isinstance(self.window_frames, bool)
                                               or not isinstance(self.window_frames, int) or self.window_frames < 3):
            raise ValueError(f"window_frames={self.window_frames!r} must be None or at least one 3-frame chunk")
        if self.decode_dtype not in DECODE_DTYPES:
            raise ValueError(f"decode_dtype={self.decode_dtype!r}: choose one of {', '.join(DECODE_DTYPES)}")

    @property
    def exact(self) -> bool:
        """True when nothing changes the latents or the frames (overlapping the decode alone changes only when)."""
        return (self.steps == RELEASE_STEPS and not self.fold_context and self.window_frames is None
                and self.decode_dtype == "float32" and not self.kv_fp8)

    def fast_run_options(self, recipe: ChunkRecipe) -> dict:
        """FastRun keyword options for these levers on a model of `recipe`; empty for the release's schedule (the
        recipe's own, which the part's run takes by default)."""
        opts: dict = {}
        if self.steps != recipe.steps:
            opts["schedule"] = recipe.schedule(self.steps)
        if self.fold_context:
            opts["fold_context"] = True
        return opts

    def window(self, window_frames: Optional[int], latent_frames: Optional[int] = None) -> Optional[int]:
        """The K/V window a run uses under these levers: the smaller of the run's and the cap (None = no window).
        A cap at or above the video's latent frames changes nothing."""
        cap = self.window_frames
        if cap is None or (latent_frames is not None and cap >= latent_frames and window_frames is None):
            return window_frames
        return cap if window_frames is None else min(window_frames, cap)

    def describe(self) -> list[str]:
        """One phrase per lever that is on (for the plan's notes)."""
        out = []
        if self.steps != RELEASE_STEPS:
            out.append(f"{self.steps} steps per chunk instead of the release's {RELEASE_STEPS} (the model's "
                       f"{self.steps}-step variant of its schedule)")
        if self.fold_context:
            out.append("the context pass folded into the last step (later chunks read the K/V of the chunk at its "
                       "last timestep, not at t = 0)")
        if self.window_frames is not None:
            out.append(f"a K/V window of at most {self.window_frames} latent frames")
        if self.decode_overlap:
            out.append("each chunk's VAE decode on a side stream beside the next chunk's DiT (same frames)")
        if self.decode_dtype != "float32":
            out.append(f"the VAE decode in {self.decode_dtype} (approximate frames)")
        if self.kv_fp8:
            out.append("the K/V cache in FP8 (e4m3, a power-of-two scale per token and head)")
        return out


def plan_levers(speed_plan) -> dict:
    """The levers of a SpeedPlan (speed/options.py; None: the defaults) that the memory plan counts, as
    plan_world_memory's keywords: the decode's precision (a half-precision decoder's rings take half the bytes) and
    an FP8 K/V cache. Every world decode runs in that precision (world/decoding.py plan_decode)."""
    levers = getattr(speed_plan, "levers", None) or ChunkLevers()
    return {"decode_dtype": levers.decode_dtype, "kv_fp8": bool(levers.kv_fp8)}

"""Continuing a Fast video: a run stops after any chunk and the next part (new keys, a new camera) goes on from there.

What a continuation needs besides the K/V cache (kept by memory/kv_park.py or a state file, loaders/fast_state.py):
the generator's state, the chunks made so far, the prompt embedding, where the camera is (`CameraTrack`), the
I2V conditioning of later frames (`ConditionTrack`) and the latents so far (for the whole video and for decoding the
new part exactly). `FastState` holds them, and `FastSettings` what stays fixed along the video. The parts themselves
(what steers a part, planning it into chunks and a camera tensor, running it and the state after it) are in
fast_parts.py.

Two rules (`FastSettings.mode`), chosen when the video starts:
- "reference" (default): the first part is exactly the released pipeline's run (its noise drawn for the whole part
  up front, its camera resampled and normalised over the whole part); parts after it follow the continuable rule
  below. Right when the video is not meant to be continued, and a close match when it is.
- "continuable": every part, the first one included, follows rules that never look ahead: each chunk draws its
  initial noise when it starts, and the camera is built latent frame by latent frame (`camera_track.py`). Then
  any chain of parts gives exactly the latents of one run of the concatenated keys (tests/test_fast_continue.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch

from ..control.camera import DEFAULT_POSE_PRECISION, check_precision
from ..control.camera_track import CameraTrack
from ..dit.kv_cache import CacheLayout, cache_layout
from ..i2v import ConditionTrack
from ..sizes import VAE_TEMPORAL_STRIDE, latent_size
from .fast_sampler import make_generator
from .recipe import ChunkRecipe

FAST_MODES = ("reference", "continuable")


class StateMismatchError(ValueError):
    """A state that cannot be continued here (another model, size, cache rule, compute dtype...)."""


@dataclass(frozen=True)
class FastSettings:
    """What stays fixed along a continued video (checked when a state is continued)."""

    height: int
    width: int
    seed: int
    noise_source: str  # "cpu" | "cuda"
    mode: str = "reference"
    window: Optional[int] = None  # latent frames (non-reference bounded cache)
    sink: int = 0
    max_attention: Optional[int] = None  # tokens
    precision: str = DEFAULT_POSE_PRECISION  # camera arithmetic
    weights: str = "nf4"
    cache_dtype: str = "bfloat16"
    model: str = ""  # fingerprint of the Fast model's files (loaders/fast_state.py)
    model_label: str = ""  # what to call the model in messages
    vae_tiled: bool = False
    compile: str = ""  # the DiT kernels the video was made with: "blocks" / "off" ("" = not recorded)
    speed: str = ""  # the speed preset it was made with ("" = none, or not recorded)
    chunk_steps: int = 0  # denoising calls per chunk it was made with (0 = not recorded)
    model_name: str = ""  # the registry's name of the model (world/models.py; "" = not recorded)
    # how the model cuts and denoises its chunks (chunk size, steps, shift, camera form): the model's, recorded so
    # that a continuation runs the same recipe
    recipe: ChunkRecipe = field(kw_only=True)

    def __post_init__(self):
        if self.mode not in FAST_MODES:
            raise ValueError(f"mode {self.mode!r}: choose one of {', '.join(FAST_MODES)}")
        check_precision(self.precision)
        latent_size(self.height, self.width)

    @property
    def frame_tokens(self) -> int:
        lat_h, lat_w = latent_size(self.height, self.width)
        return (lat_h // 2) * (lat_w // 2)

    def layout(self, latent_frames: int) -> CacheLayout:
        """The cache of a video of `latent_frames` (the whole video so far plus the next part)."""
        return cache_layout(latent_frames, self.frame_tokens, self.chunk_frames, window_frames=self.window,
                            sink_frames=self.sink, max_attention=self.max_attention,
                            release=(self.recipe.window, self.recipe.sink))

    @property
    def evicting(self) -> bool:
        """Whether the cache drops old tokens at some length (a window or max attention)."""
        return self.window is not None or self.max_attention is not None

    @property
    def chunk_frames(self) -> int:
        return self.recipe.chunk_frames

    def to_json(self) -> dict:
        d = asdict(self)
        d["recipe"] = self.recipe.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict, legacy_recipe: Optional[ChunkRecipe] = None) -> "FastSettings":
        """From `to_json`. A state written before the recipe was recorded has none: `legacy_recipe` is the one its
        model used (the caller knows which model wrote such files)."""
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        if "recipe" in kw:
            kw["recipe"] = ChunkRecipe.from_json(kw["recipe"])
        elif legacy_recipe is not None:
            kw["recipe"] = legacy_recipe
        else:
            raise StateMismatchError("the state records no chunk recipe (chunk size, steps, shift)")
        return cls(**kw)

    def check_continue(self, here: "FastSettings", source: str = "the state") -> None:
        """Refuse (one line naming the difference and the fix) to continue `self` with the settings `here`."""
        if self.model_name and here.model_name and self.model_name != here.model_name:
            raise StateMismatchError(
                f"{source} was made with the model {self.model_name}; this run loads {here.model_name}: continue it "
                f"with --model {self.model_name} and that model's files")
        if self.model and here.model and self.model != here.model:
            raise StateMismatchError(
                f"{source} was made with another Fast model ({self.model_label or self.model[:12]}); this run loads "
                f"{here.model_label or here.model[:12]}: continue with the model file the video was started with")
        for name, fix in (("weights", "--weights"),
                          ("cache_dtype", "the same kind of device (GPU / CPU) and --compute (fp16acc: float16)")):
            a, b = getattr(self, name), getattr(here, name)
            if a != b:
                raise StateMismatchError(f"{source} was made with {name} {a}, this run uses {b}: the continuation would "
                                         f"not be the same video; use {fix} as when it was started")
        if self.recipe != here.recipe:
            raise StateMismatchError(f"{source} was made with {self.recipe.describe()}; this model makes "
                                     f"{here.recipe.describe()}: continue it with the model it was started with")
        if (self.height, self.width) != (here.height, here.width):
            raise StateMismatchError(f"{source} is a {self.width}x{self.height} video; this run is {here.width}x"
                                     f"{here.height}: a continuation keeps the size it was started with")


@dataclass
class FastState:
    """A Fast video after some chunks, ready for the next part (everything but the K/V tensors themselves)."""

    settings: FastSettings
    chunks: int  # chunks made so far
    generator: torch.Tensor  # uint8 state of the run's generator
    context: torch.Tensor  # [L, text_dim] float32 prompt embedding (trimmed, CPU)
    prompt: str
    camera: CameraTrack
    has_camera: bool  # the video so far was steered by a camera (a part without input then stands still)
    latents: tuple = ()  # normalised latents [1, 16, n, h, w] float32 (CPU), one per part
    kv_global_end: int = 0
    kv_local_end: int = 0
    condition: Optional[ConditionTrack] = None  # the I2V conditioning of later frames (made on demand)
    parts: list = field(default_factory=list)  # one line of history per part (label, chunks)

    @property
    def latent_frames(self) -> int:
        return self.chunks * self.settings.chunk_frames

    @property
    def frames(self) -> int:
        return VAE_TEMPORAL_STRIDE * (self.latent_frames - 1) + 1

    def latent(self) -> torch.Tensor:
        """The whole video's latent so far [1, 16, latent_frames, h, w]."""
        return torch.cat(list(self.latents), dim=2)

    def generator_for(self, device=None) -> torch.Generator:
        g = make_generator(self.settings.seed, self.settings.noise_source)
        g.set_state(self.generator.clone())
        return g

    def context_batch(self, text_len: int, device=None) -> torch.Tensor:
        from ..dit.model import pad_context

        return pad_context([self.context], text_len).to(device if device is not None else "cpu")


def with_settings(state: FastState, **changes) -> FastState:
    return replace(state, settings=replace(state.settings, **changes))

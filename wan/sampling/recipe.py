"""A causal model's chunk recipe: how its video is cut into chunks and denoised, as plain numbers.

Each causal model of the registry (world/models.py) gives one: v1 Fast makes chunks of 3 latent frames in 4 steps
at grid indices [0, 179, 358, 679] of the shift-10 flow grid; the v2 models make chunks of 4 at [0, 250, 500, 750]
(shift 10 for the 14B, 5 for the 1.3B) and build their camera in another float order. Everything below the registry
(the chunk loop, the frame rounding, the cache layout, the speed levers) takes the recipe instead of constants, so
a new causal model with the same maths is a new recipe, not new code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..sizes import VAE_TEMPORAL_STRIDE
from .fast_sampler import FastSchedule, fast_schedule

CAMERA_FORMS = ("v1", "v2")  # the Plücker rays' float order (wan/control/camera.py)


@dataclass(frozen=True)
class ChunkRecipe:
    chunk_frames: int  # latent frames per chunk
    step_indices: tuple[int, ...]  # the release's denoising calls per chunk: indices into the 1000-step grid
    shift: float  # the flow grid's shift
    # fewer-step variants the speed levers may pick: ((steps, indices), ...), e.g. ((3, (0, 358, 679)), (2, (0, 679)))
    fewer_steps: tuple[tuple[int, tuple[int, ...]], ...] = ()
    camera_form: str = "v1"
    # the release's K/V cache: latent frames kept and never evicted (None: the whole video, v1 Fast's release)
    window: Optional[int] = None
    sink: int = 0

    def __post_init__(self):
        if isinstance(self.chunk_frames, bool) or not isinstance(self.chunk_frames, int) or self.chunk_frames < 1:
            raise ValueError(f"chunk_frames={self.chunk_frames!r} must be a positive number of latent frames")
        if self.camera_form not in CAMERA_FORMS:
            raise ValueError(f"camera form {self.camera_form!r}: choose one of {', '.join(CAMERA_FORMS)}")
        fast_schedule(self.step_indices, self.shift)  # refuses indices outside the grid or out of order
        for steps, indices in self.fewer_steps:
            if len(indices) != steps:
                raise ValueError(f"the {steps}-step variant lists {len(indices)} indices: {indices}")
            fast_schedule(indices, self.shift)

    @property
    def steps(self) -> int:
        """Denoising calls per chunk in the release's schedule."""
        return len(self.step_indices)

    @property
    def step_choices(self) -> tuple[int, ...]:
        """The step counts this recipe can run, most first (the release's, then the fewer-step variants)."""
        return tuple(sorted({self.steps, *(n for n, _ in self.fewer_steps)}, reverse=True))

    def indices_for(self, steps: Optional[int] = None) -> tuple[int, ...]:
        """The grid indices of a chunk run in `steps` calls (None: the release's)."""
        if steps is None or steps == self.steps:
            return tuple(self.step_indices)
        for n, indices in self.fewer_steps:
            if n == steps:
                return tuple(indices)
        raise ValueError(f"{steps} steps per chunk: this model's schedule has "
                         f"{', '.join(map(str, self.step_choices))}")

    def schedule(self, steps: Optional[int] = None) -> FastSchedule:
        return fast_schedule(self.indices_for(steps), self.shift)

    @property
    def chunk_video_frames(self) -> int:
        """Video frames a chunk adds after the first (whose first latent frame is the image alone)."""
        return VAE_TEMPORAL_STRIDE * self.chunk_frames

    def first_part_frames(self, chunks: int) -> int:
        """Video frames of a first part of `chunks` chunks: 4 * (latent frames - 1) + 1."""
        return VAE_TEMPORAL_STRIDE * (chunks * self.chunk_frames - 1) + 1

    def describe(self) -> str:
        ts = list(self.schedule().timesteps)
        window = (f", a K/V window of {self.window} latent frames with a {self.sink}-frame sink"
                  if self.window is not None else "")
        return (f"chunks of {self.chunk_frames} latent frames, {self.steps} steps at timesteps {ts} "
                f"(shift {self.shift:g}){window}")

    def to_json(self) -> dict:
        return {"chunk_frames": self.chunk_frames, "step_indices": list(self.step_indices), "shift": self.shift,
                "fewer_steps": [[n, list(ix)] for n, ix in self.fewer_steps], "camera_form": self.camera_form,
                "window": self.window, "sink": self.sink}

    @classmethod
    def from_json(cls, d: dict) -> "ChunkRecipe":
        return cls(int(d["chunk_frames"]), tuple(int(i) for i in d["step_indices"]), float(d["shift"]),
                   tuple((int(n), tuple(int(i) for i in ix)) for n, ix in d.get("fewer_steps", ())),
                   str(d.get("camera_form", "v1")), d.get("window"), int(d.get("sink", 0)))

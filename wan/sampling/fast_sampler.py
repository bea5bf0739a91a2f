"""The causal (Fast) models: few-step generation, chunk by chunk, with a K/V cache (spec Fast §2-4, v2 §3-5).

The video is denoised in chunks of a few latent frames (a model's recipe, wan/sampling/recipe.py: v1 Fast 3, v2 4).
Each chunk takes a few model calls at fixed timesteps of the 1000-step flow grid (v1 Fast: [999, 978, 947, 825],
indices [0, 179, 358, 679] at shift 10), each turning the velocity into x0 and re-noising x0 to the next timestep
with fresh noise; then one more call at t = 0 on the clean chunk (the "context pass") refreshes the chunk's K/V in
the cache, so later chunks attend to the clean past. No CFG: one forward per call, the text K/V computed once.

The run is an explicit object (`FastRun`: next chunk, the cache, the generator, the finished chunks), so it can
stop after any chunk and continue, and nothing lives in globals. Noise follows the reference's order: the whole
video's initial noise first, then every re-noise draw, all from one seeded generator (CUDA generator =
reference-exact on a GPU; CPU = the same noise on every machine, like the base sampler's `make_noise`). A run
without a noise tensor draws each chunk's initial noise when the chunk starts instead: the order that does not
depend on the video's length, so a video continued later with more chunks (`fast_state.py`) gets the noise of one
longer run. `start_chunk` places a run's chunks after chunks made earlier (RoPE positions and cache slots).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from ..dit.film_cache import FilmCache
from ..dit.kv_cache import KVCache
from ..sizes import VAE_TEMPORAL_STRIDE
from ..uploads import upload
from .sampler import Cancelled, StepInfo
from .unipc import first_step_index, flow_timesteps

log = logging.getLogger(__name__)

NUM_TRAIN_TIMESTEPS = 1000
NOISE_SOURCES = ("cpu", "cuda")


# ---- frames -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FastFrames:
    """How many frames a Fast run produces for a request (spec Fast §2)."""

    requested: int
    pose_frames: int  # 4n+1 frames the camera poses are taken from (request rounded down, clipped to the poses)
    latent_frames: int  # a multiple of the chunk size
    frames: int  # frames of the output video: 4 * (latent_frames - 1) + 1
    note: Optional[str]  # what changed, for the user; None when the request is produced as asked
    chunk: int  # latent frames per chunk the rounding used (v1 Fast 3, v2 4)

    @property
    def chunks(self) -> int:
        return self.latent_frames // self.chunk


def fast_frames(requested: int, num_poses: Optional[int] = None, *, chunk: int) -> FastFrames:
    """Frame rounding of the Fast model.

    The request is rounded down to 4n+1 and clipped to what `num_poses` camera poses cover ((N-1)//4*4+1); its
    latent frames (F-1)/4+1 are rounded down to a multiple of the chunk size; the video then has 4*(lat-1)+1
    frames (chunk 3: 81 -> 81, 25 -> 21, 17 -> 9; chunk 4: 81 -> 77, 361 -> 349). Raises ValueError when that
    leaves no chunk.
    """
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"frame count must be a positive integer, got {requested!r}")
    pose_frames = (requested - 1) // VAE_TEMPORAL_STRIDE * VAE_TEMPORAL_STRIDE + 1
    notes = []
    if num_poses is not None:
        if num_poses < 1:
            raise ValueError("no camera poses given")
        covered = (num_poses - 1) // VAE_TEMPORAL_STRIDE * VAE_TEMPORAL_STRIDE + 1
        if covered < pose_frames:
            notes.append(f"the camera trajectory has {num_poses} poses, enough for {covered} frames")
            pose_frames = covered
    lat = (pose_frames - 1) // VAE_TEMPORAL_STRIDE + 1
    lat -= lat % chunk
    if lat == 0:
        need = VAE_TEMPORAL_STRIDE * (chunk - 1) + 1
        why = f" ({notes[0]})" if notes else ""
        raise ValueError(
            f"{requested} frames give no complete chunk{why}: the Fast model generates {chunk} latent frames at a "
            f"time, so it needs at least {need} frames"
            + (" and as many camera poses" if num_poses is not None else ""))
    frames = VAE_TEMPORAL_STRIDE * (lat - 1) + 1
    if frames != requested:
        notes.append(f"the Fast model works in chunks of {chunk} latent frames ({VAE_TEMPORAL_STRIDE * chunk} video "
                     f"frames), so it generates {frames} frames instead of the requested {requested}")
    note = "; ".join(notes)
    return FastFrames(requested, pose_frames, lat, frames, note[:1].upper() + note[1:] + "." if notes else None,
                      chunk)


# ---- schedule ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FastSchedule:
    """A chunk's timesteps and the sigmas the x0 and re-noise formulas use (spec Fast §3; v1 Fast's in comments)."""

    timesteps: tuple[int, ...]  # [999, 978, 947, 825]
    x0_indices: tuple[int, ...]  # first grid index with that timestep: [0, 176, 354, 678]
    renoise_indices: tuple[int, ...]  # for steps 1.. : second equal index of their timestep: [177, 355, 679]
    sigma_x0: tuple[float, ...]  # float32 values of the grid's sigmas at x0_indices
    sigma_renoise: tuple[float, ...]

    @property
    def steps(self) -> int:
        return len(self.timesteps)


def fast_schedule(step_indices: Sequence[int], shift: float,
                  num_train_timesteps: int = NUM_TRAIN_TIMESTEPS) -> FastSchedule:
    """Timesteps of the 1000-step flow grid (the base sampler's `flow_timesteps`) at `step_indices`.

    x0 = x - sigma_a * v uses the sigma at the *first* index holding the timestep (the reference looks it up with
    argmin |timesteps - t|); re-noising to the next timestep uses the sigma at its *second* equal index (the
    scheduler's `index_for_timestep` rule, `first_step_index` here).
    """
    idx = [int(i) for i in step_indices]
    if not idx or any(b <= a for a, b in zip(idx, idx[1:])) or idx[0] < 0 or idx[-1] >= num_train_timesteps:
        raise ValueError(f"step indices {idx} must increase within 0..{num_train_timesteps - 1}")
    timesteps, sigmas = flow_timesteps(num_train_timesteps, shift, num_train_timesteps)
    ts = [int(timesteps[i]) for i in idx]
    x0_idx = [int((timesteps == t).nonzero()[0]) for t in ts]
    re_idx = [first_step_index(timesteps, t) for t in ts[1:]]
    return FastSchedule(tuple(ts), tuple(x0_idx), tuple(re_idx),
                        tuple(float(sigmas[i]) for i in x0_idx), tuple(float(sigmas[i]) for i in re_idx))


def velocity_to_x0(x: torch.Tensor, v: torch.Tensor, sigma: float) -> torch.Tensor:
    """x0 = x - sigma * v in float64 (sigma is a float32 grid value), returned as float32, like the reference."""
    return (x.double() - torch.tensor(sigma, dtype=torch.float32).double() * v.double()).float()


def renoise(x0: torch.Tensor, eps: torch.Tensor, sigma: float) -> torch.Tensor:
    """(1 - sigma) * x0 + sigma * eps in float32 (the scheduler's add_noise)."""
    s = torch.full((), sigma, dtype=torch.float32, device=x0.device)  # a fill, not a host copy (no sync)
    return (1 - s) * x0.float() + s * eps.float()


# ---- noise ------------------------------------------------------------------------------------------------
def make_generator(seed: int, source: str = "cpu") -> torch.Generator:
    """The run's one generator: initial noise and every re-noise draw come from it, in that order."""
    if source not in NOISE_SOURCES:
        raise ValueError(f"noise source must be 'cpu' or 'cuda', got {source!r}")
    if source == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("noise source 'cuda' needs a CUDA GPU; use 'cpu' noise on this machine")
    return torch.Generator(device="cuda" if source == "cuda" else "cpu").manual_seed(int(seed))


def draw(generator: torch.Generator, shape: Sequence[int], device=None) -> torch.Tensor:
    """Standard normal noise of `shape` [1, C, F, H, W], drawn unbatched ([C, F, H, W]) like the reference."""
    shape = tuple(shape)
    n = torch.randn(shape[1:] if shape[0] == 1 else shape, generator=generator, device=generator.device,
                    dtype=torch.float32).reshape(shape)
    return n if device is None else upload(n, device)


# ---- the run ----------------------------------------------------------------------------------------------
@dataclass
class FastStepInfo(StepInfo):
    """A finished model call of a Fast run (`StepInfo` fields plus where in the chunk loop it was)."""

    chunk: int  # 0-based chunk index
    chunks: int
    step: int  # 0-based denoising step within the chunk
    steps: int


class FastRun:
    """One Fast generation, chunk by chunk. Everything it needs is on the object; `run()` or `next_chunk()`.

    model: the causal DiT (a WanDiT built from a Fast config); it is only called, never moved.
    schedule: the chunk's timesteps (a recipe's `schedule()`); chunk_frames: latent frames per chunk.
    noise: the whole video's initial noise [1, 16, F_lat, h, w] (F_lat a multiple of the chunk), from `generator`; None:
    each chunk's initial noise is drawn from `generator` when the chunk starts (the length-independent order).
    context: text embeddings [1, text_len, text_dim] (zero-padded). y: I2V conditioning [1, 20, F_lat, h, w].
    camera: Plücker tensor [1, 384, F_lat, h, w] or None (camera layers skipped). noise, y and camera may stay in
    host memory: each chunk's slice is moved to `device` when the chunk runs.
    cache: an empty KVCache for this video (placed by the memory planner), or, with start_chunk > 0, one holding
    the first start_chunk chunks of the video.
    generator: the generator that drew `noise`; the re-noise draws continue from it.
    start_chunk: chunks of the video made before this run (F_lat counts this run's frames only).
    callback(FastStepInfo) after every denoising call; on_chunk(index, x0 [1,16,chunk,h,w]) after every chunk.
    cancel_check() before every model call: True (or raising) stops the run with `Cancelled`.
    final_context: run the last chunk's context pass (it only fills the cache, for a continuation of the video);
    False when nothing will continue it: one model call less, the same latent.
    fold_context (a draft lever, speed/levers.py; off by default): no context pass; the last denoising call writes
    the final K/V instead (those of the chunk at the last step's timestep, not of the clean chunk at t = 0). One
    model call fewer per chunk; later chunks differ.
    film: a camera FiLM cache (wan/dit/film_cache.py; the caller makes and closes it) handed to every model call: a
    chunk's calls share its camera slice, so its first call keeps the cached blocks' FiLM and the others read it
    (the same bits; the next chunk's slice starts the cache over).
    """

    def __init__(
        self,
        model: nn.Module,
        noise: Optional[torch.Tensor],
        context: torch.Tensor,
        y: torch.Tensor,
        camera: Optional[torch.Tensor],
        cache: KVCache,
        generator: torch.Generator,
        *,
        schedule: FastSchedule,
        chunk_frames: int,
        device=None,
        callback: Optional[Callable[[FastStepInfo], None]] = None,
        on_chunk: Optional[Callable[[int, torch.Tensor], None]] = None,
        cancel_check: Optional[Callable[[], bool]] = None,
        start_chunk: int = 0,
        final_context: bool = True,
        fold_context: bool = False,
        film: Optional[FilmCache] = None,
    ):
        if noise is not None and (noise.dim() != 5 or noise.shape[0] != 1):
            raise ValueError(f"noise must be [1, 16, F_lat, h, w], got {tuple(noise.shape)}")
        if y.dim() != 5 or y.shape[0] != 1:
            raise ValueError(f"conditioning y must be [1, 20, F_lat, h, w], got {tuple(y.shape)}")
        f_lat = y.shape[2]
        if f_lat % chunk_frames or f_lat == 0:
            raise ValueError(f"{f_lat} latent frames are not a whole number of {chunk_frames}-frame chunks; "
                             "round the frame count with fast_frames()")
        if noise is not None and y.shape[2:] != noise.shape[2:]:
            raise ValueError(f"conditioning y {tuple(y.shape)} does not match the noise {tuple(noise.shape)}")
        if camera is not None and camera.shape[2:] != y.shape[2:]:
            raise ValueError(f"camera tensor {tuple(camera.shape)} covers {camera.shape[2]} latent frames of size "
                             f"{tuple(camera.shape[3:])}; the video has {f_lat} of {tuple(y.shape[3:])}")
        if isinstance(start_chunk, bool) or not isinstance(start_chunk, int) or start_chunk < 0:
            raise ValueError(f"start_chunk must be a chunk count >= 0, got {start_chunk!r}")
        self.model = model
        self.device = torch.device(device) if device is not None else (noise if noise is not None else y).device
        self.noise = noise
        self.context = context
        self.y = y
        self.camera = camera  # may be replaced between chunks (new keys for the rest of the video)
        self.cache = cache
        self.generator = generator
        self.schedule = schedule
        self.callback = callback
        self.on_chunk = on_chunk
        self.cancel_check = cancel_check
        self.chunk_frames = chunk_frames
        self.start_chunk = start_chunk
        self.final_context = final_context
        self.fold_context = bool(fold_context)
        self.film = film
        self.latent_channels = int(getattr(getattr(model, "cfg", None), "out_dim", 16))
        self.chunk = 0  # next chunk of this run to generate
        self.latents: list[torch.Tensor] = []  # finished chunks, [1, 16, chunk, h, w] float32 on the device
        # With fold_context: per finished chunk, the input and timestep of the call that wrote its final K/V (the
        # last denoising step's), so `context_pass(..., x, timestep=t)` replays it (rebuilding a cache exactly).
        # Without it that call is the context pass on the chunk's latent at t = 0 (nothing extra is kept).
        self.folded_inputs: list[tuple[torch.Tensor, int]] = []

    @property
    def chunks(self) -> int:
        return self.y.shape[2] // self.chunk_frames

    @property
    def done(self) -> bool:
        return self.chunk >= self.chunks

    @property
    def calls_per_chunk(self) -> int:
        """Model calls of a chunk that writes its context: its steps, plus the context pass unless it is folded."""
        return self.schedule.steps + (0 if self.fold_context else 1)

    @property
    def model_calls(self) -> int:
        """Model calls of the whole run: calls_per_chunk per chunk, but the last without its context pass when
        final_context is off (and the pass is not folded)."""
        return self.chunks * self.calls_per_chunk - (0 if self.final_context or self.fold_context else 1)

    def _cancel(self) -> None:
        if self.cancel_check is not None and self.cancel_check():
            raise Cancelled("sampling cancelled")

    def _slice(self, t: Optional[torch.Tensor], start: int) -> Optional[torch.Tensor]:
        if t is None:
            return None
        return upload(t[:, :, start:start + self.chunk_frames], self.device)

    def next_chunk(self) -> torch.Tensor:
        """Denoise the next chunk (its steps + the context pass); returns its x0 [1, 16, chunk, h, w] float32."""
        if self.done:
            raise RuntimeError(f"all {self.chunks} chunks are done")
        c, s = self.chunk, self.schedule
        local = c * self.chunk_frames
        start = (self.start_chunk + c) * self.chunk_frames  # latent frame of the whole video
        y = self._slice(self.y, local).float()
        if self.noise is None:
            x = draw(self.generator, (1, self.latent_channels, *y.shape[2:]), self.device)
        else:
            x = self._slice(self.noise, local).float()
        cam = self._slice(self.camera, local)
        ctx = upload(self.context, self.device)
        x0 = x
        writes_context = self.final_context or c + 1 < self.chunks
        with torch.no_grad():
            for i, t_int in enumerate(s.timesteps):
                self._cancel()
                t = torch.full((1,), t_int, device=self.device, dtype=torch.long)
                final = self.fold_context and writes_context and i + 1 == s.steps
                if self.fold_context and i + 1 == s.steps:
                    folded = (x, t_int)
                v = self.model(x, t, ctx, y, camera=cam, kv_cache=self.cache, start_frame=start, cache_final=final,
                               **_film_kw(self.film, cam))
                x0 = velocity_to_x0(x, v.float(), s.sigma_x0[i])
                del v
                if i + 1 < s.steps:
                    eps = draw(self.generator, x0.shape, self.device)
                    x = renoise(x0, eps, s.sigma_renoise[i])
                    del eps
                if self.callback is not None:
                    index = c * s.steps + i
                    self.callback(FastStepInfo(index, self.chunks * s.steps, t_int, "fast", x0, c, self.chunks, i,
                                               s.steps))
            if writes_context and not self.fold_context:
                self._cancel()
                context_pass(self.model, x0, ctx, y, cam, self.cache, start, film=self.film)
        self.latents.append(x0)
        if self.fold_context:
            self.folded_inputs.append(folded)
        self.chunk += 1
        if self.on_chunk is not None:
            self.on_chunk(c, x0)
        return x0

    def run(self) -> torch.Tensor:
        """Every remaining chunk; returns the whole latent [1, 16, F_lat, h, w] float32."""
        while not self.done:
            self.next_chunk()
        return self.latent()

    def latent(self) -> torch.Tensor:
        """The finished chunks concatenated along frames."""
        if not self.latents:
            raise RuntimeError("no chunk finished yet")
        return torch.cat(self.latents, dim=2)


def context_pass(model: nn.Module, x0: torch.Tensor, context: torch.Tensor, y: torch.Tensor,
                 camera: Optional[torch.Tensor], cache: KVCache, start_frame: int, timestep: int = 0,
                 film: Optional[FilmCache] = None) -> None:
    """The clean chunk x0 at t = 0 through the model: it writes the K/V later chunks attend to (its output is
    unused). The only forward of a chunk whose K/V survive it, so replaying these rebuilds a cache exactly.
    A run with fold_context wrote them from its last step instead: replay `FastRun.folded_inputs` (x, timestep).
    film: the chunk's camera FiLM cache, filled by its denoising calls over the same `camera` tensor."""
    t0 = torch.full((1,), int(timestep), device=x0.device, dtype=torch.long)
    model(x0, t0, context, y, camera=camera, kv_cache=cache, start_frame=start_frame, cache_final=True,
          **_film_kw(film, camera))


def _film_kw(film: Optional[FilmCache], camera: Optional[torch.Tensor]) -> dict:
    """The model call's film argument: only with a camera (no camera, no camera layers to keep)."""
    return {} if film is None or camera is None else {"film": film}


def sample_fast(
    model: nn.Module,
    noise: torch.Tensor,
    context: torch.Tensor,
    y: torch.Tensor,
    camera: Optional[torch.Tensor],
    cache: KVCache,
    generator: torch.Generator,
    **kw,
) -> torch.Tensor:
    """`FastRun(...).run()`: the whole Fast video's latent [1, 16, F_lat, h, w] (normalised VAE space)."""
    return FastRun(model, noise, context, y, camera, cache, generator, **kw).run()

"""The parts of a continued Fast video: what steers a part, planning it, and running it.

`CameraSource` is what steers a part (keys or camera files, or nothing); `plan_first_part` / `plan_next_part` turn
it into a `PartPlan` (chunks and its camera tensor, by the rule of the video's `FastSettings.mode`: fast_state.py);
`start_part` builds the `FastRun` of a part and `finish_part` the `FastState` after it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..control.act_to_camera import keys_to_camera
from ..control.actions import KeyTimeline, keys_for_video
from ..control.camera import CameraInputError, camera_condition
from ..control.camera_track import CameraTrack
from ..dit.kv_cache import CacheLayout
from ..sizes import VAE_TEMPORAL_STRIDE
from .fast_sampler import FastRun, draw, fast_frames, make_generator
from .fast_state import FastSettings, FastState

DEFAULT_FRAMES = 81  # a part without a length, keys or a camera: the release's frame_num


# ---- what steers a part --------------------------------------------------------------------------------------
@dataclass
class CameraSource:
    """Keys (with their intrinsics) or camera files (poses + intrinsics) for a part; neither = no input."""

    keys: Optional[KeyTimeline] = None
    poses: Optional[np.ndarray] = None  # [N, 4, 4] camera-to-world
    intrinsics: Optional[np.ndarray] = None  # [N, 4] at 480x832 (camera files), or the key files' row(s)
    per_frame_intrinsics: bool = False
    label: str = ""
    from_file: bool = False  # key files are cut to the video; a longer action string is refused

    @property
    def kind(self) -> str:
        return "keys" if self.keys is not None else ("camera" if self.poses is not None else "none")


@dataclass
class PartPlan:
    """One part of a video: its chunks and its camera tensor, and the camera track after it."""

    chunks: int
    frames: int  # video frames the part adds
    camera: Optional[torch.Tensor]  # [1, 384, chunk * chunks, lat_h, lat_w] or None
    track: CameraTrack
    has_camera: bool
    keys: Optional[KeyTimeline] = None  # the keys used (padded), for the picture
    path: Optional[np.ndarray] = None  # camera-to-world poses of the part's frames, for the picture
    intrinsics: Optional[np.ndarray] = None
    note: Optional[str] = None
    requested: Optional[int] = None
    chunk_frames: int = field(kw_only=True)  # latent frames per chunk (the model's recipe)

    @property
    def latent_frames(self) -> int:
        return self.chunks * self.chunk_frames


def camera_track(settings: FastSettings) -> CameraTrack:
    """An empty camera track for a video of these settings (its size, camera arithmetic and the model's form)."""
    return CameraTrack(settings.height, settings.width, settings.precision, form=settings.recipe.camera_form)


def plan_first_part(source: CameraSource, frames: Optional[int], settings: FastSettings) -> PartPlan:
    """The first part of a video: `frames` requested (None: as long as the keys / 81), by the settings' rule and the
    model's recipe (chunk size, camera form)."""
    track = camera_track(settings)
    r = settings.recipe
    chunk, per_chunk = r.chunk_frames, r.chunk_video_frames
    if settings.mode == "reference":
        return _reference_first(source, frames, settings, track)
    if source.kind == "keys":
        k = source.keys
        label = source.label or "keys"
        chunks = max(1, math.ceil((k.frames + VAE_TEMPORAL_STRIDE) / per_chunk))  # keys for frames 1..F-1
        notes = []
        if frames is not None:
            want = fast_frames(frames, chunk=chunk)
            if want.chunks < chunks:
                used = track.keys_needed(want.latent_frames)
                if k.pressed[used:].any() and not source.from_file:
                    notes.append(f"{label}: {k.frames} frames of keys need {r.first_part_frames(chunks)} frames (the "
                                 f"keys of frame j move the camera into frame j+1); the video has {want.frames}, so "
                                 f"the last {k.frames - used} frame(s) of keys are not used")
                k = k[:used]
            elif want.note:
                notes.append(want.note)
            chunks = want.chunks
        need = track.keys_needed(chunks * chunk)
        if k.frames < need:
            notes.append(f"{label}: {k.frames} frames of keys, padded with {need - k.frames} frame(s) without keys "
                         f"to whole chunks ({r.first_part_frames(chunks)} frames)")
            k = k.padded(need)
        part = track.keys(k, chunks * chunk, source.intrinsics)
        return PartPlan(chunks, r.first_part_frames(chunks), part.plucker, track, True, k, part.path, part.intrinsics,
                        " ".join(notes) or None, frames, chunk_frames=chunk)
    if source.kind == "camera":
        n = source.poses.shape[0]
        plan = fast_frames(frames if frames is not None else n, n, chunk=chunk)
        part = track.poses(source.poses, source.intrinsics, plan.latent_frames, source.per_frame_intrinsics,
                           source.label or "camera")
        return PartPlan(plan.chunks, plan.frames, part.plucker, track, True, None, part.path, part.intrinsics,
                        plan.note, frames, chunk_frames=chunk)
    plan = fast_frames(frames if frames is not None else DEFAULT_FRAMES, chunk=chunk)
    track.skip(plan.latent_frames)
    return PartPlan(plan.chunks, plan.frames, None, track, False, note=plan.note, requested=frames,
                    chunk_frames=chunk)


def _reference_first(source: CameraSource, frames: Optional[int], settings: FastSettings,
                     track: CameraTrack) -> PartPlan:
    """The released pipeline's camera for the first part, and the track it leaves behind."""
    h, w = settings.height, settings.width
    chunk = settings.chunk_frames
    form = settings.recipe.camera_form
    if source.kind == "keys":
        keys, video_frames, note = keys_for_video(source.keys, frames, source=source.label or "keys",
                                                  from_file=source.from_file)
        path, end = keys_to_camera(keys, source.intrinsics)
        plan = fast_frames(video_frames, chunk=chunk)
        cond = camera_condition(path.poses, path.intrinsics, h, w, plan.pose_frames, includes_end_pose=True,
                                precision=settings.precision, latent_frames=plan.latent_frames, form=form)
        track.record(cond, end)
        notes = [n for n in (note, plan.note) if n]
        return PartPlan(plan.chunks, plan.frames, cond.plucker, track, True, keys, np.asarray(path.poses),
                        np.asarray(path.intrinsics[0]), " ".join(notes) or None, frames, chunk_frames=chunk)
    if source.kind == "camera":
        plan = fast_frames(frames if frames is not None else DEFAULT_FRAMES, source.poses.shape[0], chunk=chunk)
        cond = camera_condition(source.poses, source.intrinsics, h, w, plan.pose_frames,
                                per_frame_intrinsics=source.per_frame_intrinsics, precision=settings.precision,
                                latent_frames=plan.latent_frames, form=form)
        track.record(cond)
        notes = [n for n in (cond.message, plan.note) if n]
        return PartPlan(plan.chunks, plan.frames, cond.plucker, track, True, None, cond.poses.numpy().astype(np.float64),
                        cond.intrinsics[0].numpy(), " ".join(notes) or None, frames, chunk_frames=chunk)
    plan = fast_frames(frames if frames is not None else DEFAULT_FRAMES, chunk=chunk)
    track.skip(plan.latent_frames)
    return PartPlan(plan.chunks, plan.frames, None, track, False, note=plan.note, requested=frames,
                    chunk_frames=chunk)


def plan_next_part(state: FastState, source: CameraSource, frames: Optional[int] = None) -> PartPlan:
    """The next part of a video (4 video frames per latent frame of a chunk): as long as the keys or the camera, or
    `frames` (rounded down to whole chunks; without keys or camera one chunk). Without input a video steered so far
    stands still."""
    track = state.camera.copy()
    chunk = state.settings.chunk_frames
    per_chunk = state.settings.recipe.chunk_video_frames
    want = None
    if frames is not None:
        if frames < per_chunk:
            raise ValueError(f"{frames} new frames are less than one chunk: a continuation adds "
                             f"{per_chunk} frames per chunk ({chunk} latent frames)")
        want = frames // per_chunk
    note = None
    if want is not None and want * per_chunk != frames:
        note = (f"{frames} new frames are {frames / per_chunk:.2f} chunks; making {want} ({want * per_chunk} "
                f"frames)")
    if source.kind == "keys":
        k = source.keys
        chunks = max(1, math.ceil(k.frames / per_chunk))
        if want is not None:
            if want < chunks:
                used = want * per_chunk
                if k.pressed[used:].any() and not source.from_file:
                    note = (f"{source.label or 'keys'}: {k.frames} frames of keys, {frames} new frames asked for: "
                            f"the last {k.frames - used} frame(s) of keys are not used")
                k = k[:used]
            chunks = want
        need = chunks * per_chunk
        if k.frames < need:
            note = (f"{source.label or 'keys'}: {k.frames} frames of keys, padded with {need - k.frames} frame(s) "
                    f"without keys to whole chunks ({need} frames)")
            k = k.padded(need)
        part = track.keys(k, chunks * chunk, source.intrinsics)
        return PartPlan(chunks, need, part.plucker, track, True, k, part.path, part.intrinsics, note, frames,
                        chunk_frames=chunk)
    if source.kind == "camera":
        n = source.poses.shape[0]
        chunks = (n - 1) // per_chunk
        if chunks < 1:
            raise CameraInputError(f"{source.label or 'camera'}: {n} poses cover {n - 1} frames; a continuation needs "
                                   f"{per_chunk + 1} poses per chunk (the first is where the video is now)")
        if want is not None and want < chunks:
            chunks = want
        elif want is not None and want > chunks:
            note = (f"{source.label or 'camera'}: {n} poses cover {chunks} chunk(s) ({chunks * per_chunk} "
                    f"frames), not the {frames} asked for")
        part = track.poses(source.poses, source.intrinsics, chunks * chunk, source.per_frame_intrinsics,
                           source.label or "camera")
        return PartPlan(chunks, chunks * per_chunk, part.plucker, track, True, None, part.path,
                        part.intrinsics, note, frames, chunk_frames=chunk)
    chunks = want or 1
    if state.has_camera:
        part = track.still(chunks * chunk)
        return PartPlan(chunks, chunks * per_chunk, part.plucker, track, True, KeyTimeline.none(chunks * per_chunk),
                        part.path, part.intrinsics, note, frames, chunk_frames=chunk)
    track.skip(chunks * chunk)
    return PartPlan(chunks, chunks * per_chunk, None, track, False, note=note, requested=frames,
                    chunk_frames=chunk)


# ---- running a part -----------------------------------------------------------------------------------------
def start_part(model, plan: PartPlan, settings: FastSettings, y: torch.Tensor, context: torch.Tensor, cache,
               state: Optional[FastState] = None, *, device=None, **run_kw) -> FastRun:
    """The FastRun of a part: the first part (state None) or the next part of `state` (cache restored already).

    y: the part's I2V conditioning [1, 20, chunk * chunks, h, w]; context: [1, text_len, dim] (padded).
    run_kw: FastRun's options; its schedule is the recipe's unless the speed levers give another (fewer steps).
    """
    run_kw = {"schedule": settings.recipe.schedule(), "chunk_frames": settings.chunk_frames, **run_kw}
    if y.shape[2] != plan.latent_frames:
        raise ValueError(f"conditioning of {y.shape[2]} latent frames for a part of {plan.latent_frames}")
    if state is None:
        generator = make_generator(settings.seed, settings.noise_source)
        noise = None
        if settings.mode == "reference":  # the released order: the whole part's noise first
            noise = draw(generator, (1, int(getattr(model.cfg, "out_dim", 16)), *y.shape[2:]), device)
        return FastRun(model, noise, context, y, plan.camera, cache, generator, device=device, **run_kw)
    if (cache.global_end, cache.local_end) != (state.kv_global_end, state.kv_local_end):
        raise ValueError(f"the cache holds {cache.local_end} tokens up to video token {cache.global_end}; the state "
                         f"ends at {state.kv_local_end} / {state.kv_global_end}: restore it first")
    return FastRun(model, None, context, y, plan.camera, cache, state.generator_for(), device=device,
                   start_chunk=state.chunks, **run_kw)


def finish_part(run: FastRun, plan: PartPlan, settings: FastSettings, state: Optional[FastState], *,
                context: torch.Tensor, prompt: str, label: str = "") -> FastState:
    """The state after a finished part (the run must be done; its cache's counters are read, not its tensors)."""
    if not run.done:
        raise ValueError(f"the part stopped after {run.chunk} of {run.chunks} chunks")
    latent = run.latent().detach().to("cpu", torch.float32)
    before = () if state is None else state.latents
    parts = ([] if state is None else list(state.parts)) + [{"label": label, "chunks": plan.chunks,
                                                             "frames": plan.frames}]
    return FastState(
        settings=settings, chunks=(0 if state is None else state.chunks) + plan.chunks,
        generator=run.generator.get_state().clone(), context=context.detach().to("cpu", torch.float32),
        prompt=prompt, camera=plan.track, has_camera=plan.has_camera or (state is not None and state.has_camera),
        latents=tuple(before) + (latent,), kv_global_end=run.cache.global_end, kv_local_end=run.cache.local_end,
        condition=None if state is None else state.condition, parts=parts)


def next_layout(state: FastState, plan: PartPlan) -> CacheLayout:
    """The cache for the video so far plus the next part."""
    return state.settings.layout(state.latent_frames + plan.latent_frames)

"""Playing a World session chunk by chunk (`step`), and what it has played: its keys, its camera path, the picture
of it, and saving it to files (a mixin of WorldSession, world/session.py)."""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch

from ..wan.control.actions import KeyInputError, KeyTimeline
from ..wan.sampling.fast_parts import CameraSource
from .errors import WorldError
from .frames import ChunkFrames, ChunkTimes, to_uint8


class PlayedVideo:
    """The video played chunk by chunk, and the video so far as keys, a camera path and files. Uses the session's
    parts, its decoder, `run_part` and `_walked`."""

    def step(self, keys: Union[KeyTimeline, str, None] = None,
             on_preview: Optional[Callable[[ChunkFrames], None]] = None) -> Iterator[ChunkFrames]:
        """One chunk steered by `keys` (a KeyTimeline, an action string, or None: no key pressed), yielding its
        frames latent frame by latent frame as they are decoded. Keys shorter than `keys_for_next_chunk()` are
        padded with frames without keys.

        on_preview(ChunkFrames with preview=True): the whole chunk's frames as its first denoising step sees them,
        called on this thread from inside the chunk's run right after its first model call, before any frame is
        yielded. Only a session that decodes with a tiny decoder previews (a second VAE decode would cost more than
        it saves: with the VAE on_preview is never called). The preview is decoded by a fork of the tiny decoder
        and changes nothing else: the yielded frames, the cache and every saved file are the same without it."""
        with self.model_lock:  # held across the yields: the consumer decodes on this thread
            need = self.keys_for_next_chunk()
            timeline = self._keys(keys, need)
            if not self.decodes:
                raise WorldError("this session has no VAE: step() decodes the frames as they are made")
            if self._unfinished:
                raise WorldError("the last part skipped its final context pass; the video cannot go on")
            source = CameraSource(keys=timeline, label="keys")
            frames = self.settings.recipe.first_part_frames(1) if not self.parts else self.chunk_video_frames
            part = self.plan_part(source, frames)
            start_frame = self.frames
            chunk = self.chunks
            decoder = self._decoder_for(True)  # before the chunk joins the video (a new decoder warms up on it)
            preview = self._chunk_preview(decoder, chunk, start_frame, on_preview)
            t0 = time.perf_counter()
            self._grow_ahead = True
            self.run_part(part, source, frames, step_callback=preview)
            t_preview = preview.seconds if preview is not None else 0.0
            t_dit = time.perf_counter() - t0 - t_preview
            latent = self.state.latents[-1]
            decoded = 0.0
            first = start_frame
            for i in range(latent.shape[2]):
                t = time.perf_counter()
                with torch.inference_mode():
                    frames_i = to_uint8(self._decode(decoder, latent[:, :, i:i + 1].to(self.device)))
                decoded += time.perf_counter() - t
                self.last_times = ChunkTimes(t_dit, decoded, time.perf_counter() - t0, t_preview)
                yield ChunkFrames(chunk, first, frames_i)
                first += frames_i.shape[0]

    def save(self, prefix, *, write_video: Optional[Callable] = None, state: bool = False, fps: int = 16):
        """Write what was made: prefix.mp4 (with `write_video(frames, path, fps)`, frames an iterator of uint8
        [n, H, W, 3]), prefix.actions.txt, prefix_camera/poses.npy + intrinsics.npy (a video steered by keys)
        and, with state=True, prefix.state to continue it later. Each file is whole or not written."""
        from .saving import save_session

        return save_session(self, prefix, write_video=write_video, state=state, fps=fps)

    def _keys(self, keys, need: int) -> KeyTimeline:
        """A step's keys (a KeyTimeline, an action string or None) as the `need` frames of keys its chunk takes."""
        if keys is None:
            return KeyTimeline.none(need)
        if isinstance(keys, str):
            keys = KeyTimeline.from_string(keys) if keys.strip() else KeyTimeline.none(need)
        if not isinstance(keys, KeyTimeline):
            raise KeyInputError(f"keys must be an action string or a KeyTimeline, got {type(keys).__name__}")
        if keys.frames > need:
            raise KeyInputError(f"{keys.frames} frames of keys for one chunk, which takes {need}; give at most {need}")
        return keys.padded(need)

    def trajectory_picture(self, size: tuple[int, int] = (320, 320)):
        """A PIL picture of the camera path so far (top and side views), None before the first chunk."""
        path = self.camera_path()
        if path is None:
            return None
        from ..wan.control.trajectory_plot import plot_trajectory

        return plot_trajectory(path[0], path[1], size=size, key_frames=3)

    def keys(self) -> Optional[KeyTimeline]:
        """Every key frame of the video so far (None when a part had a camera or no keys)."""
        keys = [p.plan_keys for p in self.parts]
        if not keys or any(k is None for k in keys):
            return None
        return keys[0] if len(keys) == 1 else KeyTimeline(np.concatenate([k.pressed for k in keys]))  # one copy

    def action_string(self) -> str:
        """The keys so far as one action string: `generate --model fast --rule continuable --actions` of it makes
        this video (with the same seed, size and cache rules)."""
        k = self.keys()
        return "" if k is None else k.to_string()

    def camera_path(self) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(camera-to-world poses [N, 4, 4] of every video frame so far, intrinsics [4]) of a video steered by keys.

        The player draws it after every chunk: only the frames added since the last call are walked, from the
        walk's end state (act_to_camera.walk continues a path exactly), so a long video costs no more per chunk.
        The arrays are the session's own: read them, do not write to them."""
        k = self.keys()
        if k is None or not self.parts:
            return None
        from ..wan.control.act_to_camera import keys_to_camera

        done = self._walked
        n = 0 if done is None else done[0].shape[0]
        if done is None or n > k.frames or not np.array_equal(done[0], k.pressed[:n]):  # a rewind or a new video
            done, n = None, 0
        if n < k.frames:
            path, end = keys_to_camera(k[n:], start=None if done is None else done[3])
            poses = np.asarray(path.poses) if done is None else np.concatenate([done[1], np.asarray(path.poses)[1:]])
            done = self._walked = (k.pressed.copy(), poses, np.asarray(path.intrinsics[0]), end)
        return done[1], done[2]

"""Saving a World session's video: the video file, the keys, the camera path and (to continue it) its state."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..loaders.atomic import atomic_write
from ..loaders.camera_files import save_camera_folder
from .errors import WorldError


@dataclass
class SavedFiles:
    video: Optional[Path] = None
    actions: Optional[Path] = None
    camera: Optional[Path] = None  # folder with poses.npy + intrinsics.npy
    state: Optional[Path] = None

    def to_json(self) -> dict:
        return {k: (None if v is None else str(v)) for k, v in self.__dict__.items()}


def save_session(session, prefix, *, write_video: Optional[Callable] = None, state: bool = False,
                 fps: int = 16) -> SavedFiles:
    """See WorldSession.save."""
    if not session.parts:
        raise WorldError("nothing to save yet: make a chunk first")
    prefix = Path(prefix).expanduser()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    out = SavedFiles()
    actions = session.action_string()
    if actions:
        out.actions = prefix.with_name(prefix.name + ".actions.txt")
        with atomic_write(out.actions, mode="w") as fh:
            fh.write(actions + "\n")
        poses, intrinsics = session.camera_path()
        out.camera = save_camera_folder(prefix.with_name(prefix.name + "_camera"), poses,
                                        intrinsics[None].repeat(poses.shape[0], axis=0))
    if state:
        from ..loaders.fast_state_file import save_state
        from ..memory.kv_park import placement_layers

        st = session.state
        if session.cache is None:
            raise WorldError("the cache was freed already; the state can no longer be saved")
        out.state = save_state(prefix.with_name(prefix.name + ".state"), st,
                               placement_layers(session.placement.placement, st.kv_local_end))
    if write_video is not None:
        out.video = Path(write_video(session.video_frames(), prefix.with_name(prefix.name + ".mp4"), fps))
    return out


@dataclass
class StateTarget:
    """Where a video's state is saved after a part (to continue it later), and the size it will have: the K/V cache
    of `tokens` tokens x `layers` layers in `cache_dtype` (`kv_bytes`) and the rest (`estimate` in all), so a door
    can check the target with its other outputs before the run."""

    path: Path
    estimate: int
    tokens: int
    layers: int
    cache_dtype: str
    kv_bytes: int
    written: Optional[Path] = None

    @classmethod
    def plan(cls, path, settings, cfg, latent_frames: int) -> "StateTarget":
        """The target of a video with these settings (a FastSettings) after `latent_frames` latent frames."""
        import torch

        from ..loaders.fast_state_file import HEADER_RESERVE_BYTES, kv_bytes

        path = Path(path).expanduser()
        layout = settings.layout(latent_frames)
        tokens = min(layout.capacity, latent_frames * settings.frame_tokens)
        kv = kv_bytes(tokens, cfg.num_layers, cfg.num_heads, cfg.head_dim, getattr(torch, settings.cache_dtype))
        lat_h, lat_w = settings.height // 8, settings.width // 8
        small = (4 * lat_h * lat_w * (16 * latent_frames + 20 * 32) + cfg.text_len * cfg.text_dim * 4
                 + HEADER_RESERVE_BYTES)
        return cls(path, kv + small, tokens, cfg.num_layers, settings.cache_dtype, kv)

    def write(self, state, placement) -> Path:
        """The state after the part, with the K/V cache as `placement` (a memory CachePlacement) holds it."""
        from ..loaders.fast_state_file import save_state
        from ..memory.kv_park import placement_layers

        self.written = save_state(self.path, state, placement_layers(placement, state.kv_local_end))
        return self.written

    @staticmethod
    def size_text(n: int) -> str:
        """A state's size in words ("26.8 GB")."""
        from ..loaders.fast_state_file import describe_size

        return describe_size(n)

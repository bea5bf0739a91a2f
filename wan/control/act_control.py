"""The Act model's 7-channel control tensor: ray directions (3) + WASD action (4) per pixel (fast-act spec §6).

- Poses: the first `frames` poses resampled to latent frames and made framewise relative exactly as for the
  camera (`camera.camera_geometry`, float32 by default); only the **ray directions** are used,
  d = R normalize(((u + 0.5 - cx)/fx, (v + 0.5 - cy)/fy, 1)), no origin: the Act model takes its motion from the
  keys, its orientation from the poses.
- Actions: [N, 4] (w, a, s, d) values as given (the release's `action.npy` holds 0/1), `actions[:frames][::4]`
  -> one row per latent frame, the same for every pixel of that frame.
- Packing: concat(rays_d, action) per pixel folded into channels like the Plücker tensor,
  channel = c7*64 + py*8 + px with c7 = d_x, d_y, d_z, w, a, s, d -> [1, 448, F_lat, lat_h, lat_w] (the DiT's
  2x2 patchify makes it the 1792-wide input of patch_embedding_wancamctrl).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..sizes import VAE_STRIDE, VAE_TEMPORAL_STRIDE, check_frames
from .camera import (
    DEFAULT_POSE_PRECISION,
    ArrayLike,
    CameraGeometry,
    CameraInputError,
    camera_geometry,
    packed_plucker,
)

ACTION_CHANNELS = 4  # w, a, s, d
ACT_CHANNELS = 3 + ACTION_CHANNELS  # ray direction + action per pixel
ACT_TENSOR_CHANNELS = ACT_CHANNELS * VAE_STRIDE * VAE_STRIDE  # 448


@dataclass
class ActCondition(CameraGeometry):
    """The Act model's control input and the geometry it was built from."""

    tensor: Optional[torch.Tensor] = None  # [1, 448, F_lat, lat_h, lat_w] float32, CPU
    latent_actions: Optional[torch.Tensor] = None  # [F_lat, 4] float32: the w, a, s, d row of each latent frame


def check_actions(actions: ArrayLike, name: str = "actions") -> np.ndarray:
    """[N, 4] w, a, s, d values (ints, bools or floats, finite) -> float32."""
    a = actions.detach().cpu().numpy() if isinstance(actions, torch.Tensor) else np.asarray(actions)
    if a.ndim != 2 or a.shape[1] != ACTION_CHANNELS or a.shape[0] < 1:
        raise CameraInputError(f"{name}: shape {tuple(a.shape)} is not [N, 4] (w, a, s, d per frame)")
    if a.dtype.kind not in "biuf":
        raise CameraInputError(f"{name}: dtype {a.dtype} is not numeric; save 0/1 key values as int or float")
    a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise CameraInputError(f"{name}: NaN or inf in row(s) {np.flatnonzero(~np.isfinite(a).all(axis=1))[:5].tolist()}")
    return a


def pack_act(rays_d: torch.Tensor, latent_actions: torch.Tensor) -> torch.Tensor:
    """Packed ray directions [1, 192, F, lh, lw] + actions [F, 4] -> the Act tensor [1, 448, F, lh, lw]."""
    _, c, f, lh, lw = rays_d.shape
    cell = VAE_STRIDE * VAE_STRIDE
    if c != 3 * cell or latent_actions.shape != (f, ACTION_CHANNELS):
        raise ValueError(f"ray directions {tuple(rays_d.shape)} and actions {tuple(latent_actions.shape)} do not fit")
    acts = latent_actions.to(torch.float32).T[None, :, None, :, None, None].expand(1, ACTION_CHANNELS, cell, f, lh, lw)
    return torch.cat([rays_d, acts.reshape(1, ACTION_CHANNELS * cell, f, lh, lw)], dim=1)


def act_condition(
    poses: ArrayLike,
    intrinsics: ArrayLike,
    actions: ArrayLike,
    height: int,
    width: int,
    frames: int,
    per_frame_intrinsics: bool = False,
    *,
    includes_end_pose: bool = False,
    precision: str = DEFAULT_POSE_PRECISION,
    actions_name: str = "actions",
) -> ActCondition:
    """The Act model's control for a `frames`-frame video of height x width pixels.

    poses / intrinsics as for `camera.camera_condition` (per-frame poses, or a key-built path with an end pose);
    actions: [N, 4] w, a, s, d per frame. The frame count is reduced to what both the poses and the actions
    cover, and `message` says so.
    """
    acts = check_actions(actions, actions_name)
    check_frames(frames)
    notes = []
    if acts.shape[0] < frames:
        covered = ((acts.shape[0] - 1) // VAE_TEMPORAL_STRIDE) * VAE_TEMPORAL_STRIDE + 1
        notes.append(f"The {actions_name} cover {acts.shape[0]} frames; generating {covered} frames instead of {frames}.")
        frames = covered
    geo = camera_geometry(poses, intrinsics, height, width, frames, per_frame_intrinsics,
                          includes_end_pose=includes_end_pose, precision=precision)
    if geo.message:
        notes.append(geo.message)
    latent_actions = torch.from_numpy(acts[:geo.frames][::VAE_TEMPORAL_STRIDE].copy())
    rays_d = packed_plucker(geo.relative_poses, geo.scaled_intrinsics, height, width, origins=False)
    fields = {**vars(geo), "message": " ".join(notes) if notes else None}
    return ActCondition(**fields, tensor=pack_act(rays_d, latent_actions), latent_actions=latent_actions)

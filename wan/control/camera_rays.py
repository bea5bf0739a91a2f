"""Intrinsics and Plücker rays: steps 5-6 of camera.py, from relative poses to the packed [1, 384, F, h/8, w/8].

Intrinsics rescaled from the 480x832 calibration frame (spec §4.4), per-pixel rays [o, d] through the pixel centres
(spec §4.5), and their packing onto the latent grid with channel c = c6*64 + py*8 + px (spec §3). `form` picks the
float rounding: "v1" or "v2" (camera_forms.py).
"""
from __future__ import annotations

import numpy as np
import torch
from einops import rearrange

from ..sizes import VAE_STRIDE
from .camera_forms import CAMERA_FORMS, DEFAULT_CAMERA_FORM, directions_v2, scale_intrinsics_v2
from .camera_input import INTRINSICS_HEIGHT, INTRINSICS_WIDTH, ArrayLike, CameraInputError

PLUCKER_CHANNELS = 6  # o_x, o_y, o_z, d_x, d_y, d_z
CAMERA_CHANNELS = PLUCKER_CHANNELS * VAE_STRIDE * VAE_STRIDE  # 384


def check_form(form: str) -> str:
    """`form` if it names a camera form ('v1' | 'v2', camera_forms.py); raises CameraInputError otherwise."""
    if form not in CAMERA_FORMS:
        raise CameraInputError(f"camera form {form!r}: choose one of {', '.join(CAMERA_FORMS)}")
    return form


def scale_intrinsics(intrinsics: ArrayLike, height: int, width: int, form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """(fx, fy, cx, cy) rows [..., 4] of a 480x832 calibration rescaled to height x width (spec §4.4).

    fx, cx scale with width/832 and fy, cy with height/480; there is no crop offset. form "v1": float64 products
    (float64 result); "v2": v2's float32 products (float32 result).
    """
    if check_form(form) == "v2":
        return scale_intrinsics_v2(torch.as_tensor(np.asarray(intrinsics)), height, width,
                                   INTRINSICS_HEIGHT, INTRINSICS_WIDTH)
    k = torch.as_tensor(np.asarray(intrinsics), dtype=torch.float64)
    scale = torch.tensor(
        [width / INTRINSICS_WIDTH, height / INTRINSICS_HEIGHT, width / INTRINSICS_WIDTH, height / INTRINSICS_HEIGHT],
        dtype=torch.float64,
    )
    return k * scale


def resample_intrinsics(intrinsics: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Intrinsics [L, 4] linearly interpolated at fractional frame positions `targets` [F] -> [F, 4] (float64)."""
    k = intrinsics.to(torch.float64)
    n = k.shape[0]
    if n == 1:
        return k.expand(targets.shape[0], 4).clone()
    lo = targets.floor().long().clamp(0, n - 2)
    frac = (targets.to(torch.float64) - lo)[:, None]
    return k[lo] + frac * (k[lo + 1] - k[lo])


def camera_directions(intrinsics: torch.Tensor, height: int, width: int, form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """Unit ray directions [height, width, 3] float32 in camera axes through the pixel centres (col+0.5, row+0.5).

    form "v1": computed in float64 and rounded; "v2": v2's float32 arithmetic (camera_forms.directions_v2)."""
    if check_form(form) == "v2":
        return directions_v2(intrinsics, height, width)
    fx, fy, cx, cy = intrinsics.to(torch.float64).tolist()
    u = (torch.arange(width, dtype=torch.float64) + 0.5 - cx) / fx
    v = (torch.arange(height, dtype=torch.float64) + 0.5 - cy) / fy
    d = torch.stack(
        [u.expand(height, width), v[:, None].expand(height, width), torch.ones(height, width, dtype=torch.float64)],
        dim=-1,
    )
    return (d / d.norm(dim=-1, keepdim=True)).to(torch.float32)


def _per_frame(intrinsics: torch.Tensor, frames: int) -> torch.Tensor:
    k = intrinsics.reshape(-1, 4)
    if k.shape[0] == 1:
        return k.expand(frames, 4)
    if k.shape[0] != frames:
        raise ValueError(f"got {k.shape[0]} intrinsics rows for {frames} frames; give one row or one per frame")
    return k


def plucker_rays(rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int,
                 form: str = DEFAULT_CAMERA_FORM) -> torch.Tensor:
    """Unpacked embedding [F, height, width, 6] = [o, d] per pixel (spec §4.5), float32.

    rel_poses [F, 4, 4]; intrinsics [4] (shared) or [F, 4] at height x width. o is the frame's (relative)
    camera centre, d = R d_cam the unit ray direction. Memory is F*h*w*6 floats, so use `camera_condition`
    (which packs frame by frame) for full-size videos. form: camera_directions' rounding; "v2" also rotates as
    v2 does (R @ d over the pixels), "v1" as the v1 reference (d @ R^T).
    """
    ks = _per_frame(intrinsics, rel_poses.shape[0])
    rel = rel_poses.to(torch.float32)
    fields = []
    for f in range(rel.shape[0]):
        dirs = camera_directions(ks[f], height, width, form)
        if form == "v2":
            d = (rel[f, :3, :3] @ dirs.reshape(-1, 3).T).T.reshape(height, width, 3)
        else:
            d = dirs @ rel[f, :3, :3].T
        o = rel[f, :3, 3].expand(height, width, 3)
        fields.append(torch.cat([o, d], dim=-1))
    return torch.stack(fields)


def pack_plucker(field: torch.Tensor) -> torch.Tensor:
    """[F, h, w, 6] per-pixel embedding -> [1, 384, F, h/8, w/8] with channel c = c6*64 + py*8 + px.

    Pixel (row, col) = (lat_row*8 + py, lat_col*8 + px). The DiT's patchify
    "b c f (h q) (w r) -> b (f h w) (c q r)" then yields k = ((c6*64 + py*8 + px)*4) + qy*2 + qx (spec §3).
    """
    if field.ndim != 4 or field.shape[-1] != PLUCKER_CHANNELS:
        raise ValueError(f"Plücker field must be [F, h, w, {PLUCKER_CHANNELS}], got {tuple(field.shape)}")
    packed = rearrange(field, "f (lh py) (lw px) c -> (c py px) f lh lw", py=VAE_STRIDE, px=VAE_STRIDE)
    return packed.unsqueeze(0).contiguous()


def packed_plucker(
    rel_poses: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int, origins: bool = True,
    form: str = DEFAULT_CAMERA_FORM,
) -> torch.Tensor:
    """pack_plucker(plucker_rays(...)) without the F*h*w*6 intermediate: [1, 384, F, h/8, w/8] float32.

    The camera-space directions are packed once per distinct intrinsics row ([3, 64*lat_h*lat_w]); each
    frame is then a 3x3 rotation of them plus a constant origin, written straight into the output.
    origins=False leaves the origins out: the ray directions alone, [1, 192, F, h/8, w/8] (the Act tensor's
    first three channels, fast-act spec §6). form: the directions' rounding (camera_directions); the rotation
    R @ d is the same for both and is v2's to the bit.
    """
    if height % VAE_STRIDE or width % VAE_STRIDE:
        raise ValueError(f"frame size {width}x{height} (width x height) must be a multiple of {VAE_STRIDE} to pack into VAE cells")
    lat_h, lat_w = height // VAE_STRIDE, width // VAE_STRIDE
    cell = VAE_STRIDE * VAE_STRIDE
    rel = rel_poses.to(torch.float32)
    frames = rel.shape[0]
    ks = _per_frame(intrinsics, frames)
    first = 3 if origins else 0  # channel of d_x
    out = torch.empty(1, first + 3, cell, frames, lat_h * lat_w, dtype=torch.float32)
    dirs, dirs_k = None, None
    for f in range(frames):
        if dirs_k is None or not torch.equal(ks[f], dirs_k):
            dirs_k = ks[f]
            dirs = rearrange(
                camera_directions(dirs_k, height, width, form),
                "(lh py) (lw px) c -> c (py px lh lw)",
                py=VAE_STRIDE,
                px=VAE_STRIDE,
            )
        if origins:
            out[0, :3, :, f] = rel[f, :3, 3][:, None, None]
        out[0, first:, :, f] = (rel[f, :3, :3] @ dirs).view(3, cell, lat_h * lat_w)
    return out.view(1, (first + 3) * cell, frames, lat_h, lat_w)

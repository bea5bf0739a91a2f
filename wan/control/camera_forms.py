"""The float arithmetic of the camera rays, per release ("form"): the same geometry, rounded two ways.

Both releases take (fx, fy, cx, cy) of a 480x832 calibration, rescale them to the output size, build one unit ray
per pixel centre, d = normalize(((x + 0.5 - cx) / fx, (y + 0.5 - cy) / fy, 1)), and rotate it by the framewise
relative rotation R (lingbot-world-v2.md §4.1).

- "v1": this project's rounding since the v1 releases: intrinsics scaled and directions built in float64, then
  rounded to float32 (within 1e-6 of the v1 reference, tests/test_camera_numerics.py). Kept as it was, so every
  existing camera tensor stays bit for bit what it was.
- "v2": LingBot-World v2's rounding (v2 `wan/utils/cam_utils.py:95-129`, `get_Ks_transformed` :132-): intrinsics
  scaled in float32 by the Python-float ratios, the pixel grid, the division and the normalisation in float32.
  With the R @ d product of `packed_plucker` this is bit-identical to v2's `get_plucker_embeddings` on the CPU.

The rotation is the same for both: `packed_plucker` multiplies R [3, 3] by the packed directions [3, N], which on the
CPU gives the bits of v2's batched `[f, 3, 3] @ [3, h*w]` (checked on the release's example 03 by
tests/test_v2_parity.py). `camera.check_form` validates a form name.
"""
from __future__ import annotations

import torch

CAMERA_FORMS = ("v1", "v2")
DEFAULT_CAMERA_FORM = "v1"


def scale_intrinsics_v2(intrinsics: torch.Tensor, height: int, width: int,
                        calib_height: int, calib_width: int) -> torch.Tensor:
    """(fx, fy, cx, cy) rows [..., 4] rescaled from calib_height x calib_width to height x width, float32 (v2).

    float32 values times the Python-float ratios, as v2's get_Ks_transformed does (torch rounds the ratio to float32
    first, so this differs from the float64 product rounded once, by an ulp at times). Its crop offset is 0 here (the
    resized size is the final size), and x - 0.0 == x.
    """
    k = torch.as_tensor(intrinsics).to(torch.float32)
    sx, sy = width / calib_width, height / calib_height
    return torch.stack([k[..., 0] * sx, k[..., 1] * sy, k[..., 2] * sx, k[..., 3] * sy], dim=-1)


def directions_v2(intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Unit ray directions [height, width, 3] in camera axes, in v2's float32 arithmetic and operation order."""
    k = torch.as_tensor(intrinsics).to(torch.float32).reshape(4)
    fx, fy, cx, cy = k[0], k[1], k[2], k[3]  # 0-dim float32 tensors, as v2 indexes them out of Ks
    gy, gx = torch.meshgrid(torch.arange(height, dtype=torch.float32) + 0.5,
                            torch.arange(width, dtype=torch.float32) + 0.5, indexing="ij")
    d = torch.stack([(gx - cx) / fx, (gy - cy) / fy, torch.ones_like(gx)], dim=-1)
    return d / d.norm(dim=-1, keepdim=True)

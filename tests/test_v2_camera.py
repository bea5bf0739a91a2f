"""The camera form argument ('v1' | 'v2'): what each rounds how, and that it travels with a CameraTrack.

Bit parity of form="v2" with upstream v2's cam_utils on the release's example 03 is in test_v2_parity.py; here the
form's own rules: "v1" is the default and the old arithmetic, "v2" scales the intrinsics and builds the directions
in float32, the rotation is the same R @ d for both packings, and the form is kept in a track's saved state.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_world.loaders.camera_files import load_camera_folder
from lingbot_world.wan.control.actions import KeyTimeline
from lingbot_world.wan.control.camera import (CameraInputError, camera_condition, camera_directions, camera_geometry,
                                              pack_plucker, packed_plucker, plucker_rays, scale_intrinsics)
from lingbot_world.wan.control.camera_track import CameraTrack


@pytest.fixture(scope="module")
def ex03(examples_dir):
    return load_camera_folder(examples_dir / "03")


def test_v1_is_the_default_and_v2_differs_only_in_rounding(ex03):
    base = camera_condition(ex03.poses, ex03.intrinsics, 48, 80, 33)
    v1 = camera_condition(ex03.poses, ex03.intrinsics, 48, 80, 33, form="v1")
    v2 = camera_condition(ex03.poses, ex03.intrinsics, 48, 80, 33, form="v2")
    assert (base.form, v1.form, v2.form) == ("v1", "v1", "v2")
    assert torch.equal(base.plucker, v1.plucker)
    assert torch.equal(v1.relative_poses, v2.relative_poses)  # the pose processing is the same
    assert not torch.equal(v1.plucker, v2.plucker)
    assert (v1.plucker - v2.plucker).abs().max() < 1e-6  # float32 vs float64-then-rounded: an ulp or so


def test_unknown_form_is_refused(ex03):
    with pytest.raises(CameraInputError, match="camera form 'v3'.*v1, v2"):
        camera_condition(ex03.poses, ex03.intrinsics, 48, 80, 17, form="v3")
    with pytest.raises(CameraInputError, match="camera form"):
        CameraTrack(48, 80, form="V2")


def test_v2_intrinsics_are_float32_products_with_the_ratio_rounded_first():
    k = np.array([[415.5298, 415.6922, 415.77786, 239.77779], [502.9116, 503.10812, 415.77786, 239.77779]],
                 dtype=np.float32)
    got = scale_intrinsics(k, 464, 832, form="v2")
    assert got.dtype == torch.float32
    sx, sy = np.float32(832 / 832), np.float32(464 / 480)
    want = np.stack([k[:, 0] * sx, k[:, 1] * sy, k[:, 2] * sx, k[:, 3] * sy], axis=-1)  # numpy float32 arithmetic
    assert np.array_equal(got.numpy(), want)
    v1 = scale_intrinsics(k, 464, 832)  # float64 products
    assert v1.dtype == torch.float64 and torch.allclose(v1.float(), got, rtol=1e-7, atol=0)


def test_v2_directions_are_unit_rays_through_pixel_centres():
    k = torch.tensor([40.0, 41.5, 39.9, 23.9])
    d = camera_directions(k, 48, 80, form="v2")
    assert d.dtype == torch.float32 and d.shape == (48, 80, 3)
    x = (torch.arange(80, dtype=torch.float64) + 0.5 - 39.9) / 40.0
    y = (torch.arange(48, dtype=torch.float64) + 0.5 - 23.9) / 41.5
    exact = torch.stack([x.expand(48, 80), y[:, None].expand(48, 80), torch.ones(48, 80, dtype=torch.float64)], -1)
    exact = exact / exact.norm(dim=-1, keepdim=True)
    assert (d.double() - exact).abs().max() < 2e-7
    assert (d.double() - camera_directions(k, 48, 80).double()).abs().max() < 2e-7


@pytest.mark.parametrize("form", ["v1", "v2"])
def test_unpacked_and_packed_rays_agree(ex03, form):
    geo = camera_geometry(ex03.poses, ex03.intrinsics, 48, 64, 21, form=form)
    full = pack_plucker(plucker_rays(geo.relative_poses, geo.scaled_intrinsics, 48, 64, form=form))
    packed = packed_plucker(geo.relative_poses, geo.scaled_intrinsics, 48, 64, form=form)
    if form == "v2":  # both R @ d, v2's order: the same bits
        assert torch.equal(full, packed)
    else:  # plucker_rays keeps the v1 reference's d @ R^T
        assert (full - packed).abs().max() < 2e-7


def test_track_form_rounds_its_parts_and_is_saved(ex03):
    keys = KeyTimeline.from_string("w-4,l-4,d-4")
    tracks = {f: CameraTrack(48, 80, form=f) for f in ("v1", "v2")}
    parts = {f: t.keys(keys, 4) for f, t in tracks.items()}
    assert torch.equal(parts["v1"].steps, parts["v2"].steps)
    assert not torch.equal(parts["v1"].plucker, parts["v2"].plucker)
    ks = scale_intrinsics(tracks["v2"].intrinsics[None], 48, 80, form="v2")
    want = packed_plucker(parts["v2"].steps, ks.expand(4, 4).contiguous(), 48, 80, form="v2")
    assert torch.equal(parts["v2"].plucker, want)

    tensors, values = tracks["v2"].to_state()
    assert values["form"] == "v2"
    again = CameraTrack.from_state(tensors, values)
    assert again.form == "v2"
    assert torch.equal(again.still(2).plucker, tracks["v2"].copy().still(2).plucker)
    old = {k: v for k, v in values.items() if k != "form"}  # a state saved before forms existed
    assert CameraTrack.from_state(tensors, old).form == "v1"


def test_track_record_takes_the_geometrys_form(ex03):
    geo = camera_geometry(ex03.poses, ex03.intrinsics, 48, 80, 17, form="v2")
    track = CameraTrack(48, 80)
    track.record(geo)
    assert track.form == "v2"

"""Output size and frame-count rules (spec §5.2)."""
import math

import numpy as np
import pytest

from lingbot_world.wan.sizes import (
    check_frames,
    frames_ok,
    latent_frames,
    latent_size,
    max_area_for,
    target_size,
    token_count,
)


@pytest.mark.parametrize(
    "img, area, expected",
    [
        ((720, 1280), 480 * 832, (464, 832)),  # shipped examples at 480p (spec §5.2)
        ((720, 1280), 720 * 1280, (720, 1280)),  # ... and at 720p
        # sqrt(399360 * 480/832) = 479.99999999999994 in float64, so the reference floors to 464 even for a
        # 480x832 image; we mirror its arithmetic for parity.
        ((480, 832), 480 * 832, (464, 832)),
        ((1280, 720), 480 * 832, (832, 464)),  # portrait mirrors landscape
        ((1024, 1024), 480 * 832, (624, 624)),
    ],
)
def test_target_size_known_cases(img, area, expected):
    assert target_size(*img, area) == expected


def test_target_size_properties_over_many_aspect_ratios():
    rng = np.random.default_rng(0)
    for _ in range(300):
        ih, iw = (int(v) for v in rng.integers(64, 4096, size=2))
        if max(ih / iw, iw / ih) > 6:
            continue
        for area in (480 * 832, 720 * 1280):
            h, w = target_size(ih, iw, area)
            assert h % 16 == 0 and w % 16 == 0
            assert h * w <= area
            # the floors lose at most one 16-px step per side
            assert h + 16 > math.sqrt(area * ih / iw) - 1e-9 and w + 16 > math.sqrt(area * iw / ih) - 1e-9


def test_target_size_rejects_bad_input():
    with pytest.raises(ValueError, match="positive"):
        target_size(0, 100, 480 * 832)
    with pytest.raises(ValueError, match="max_area"):
        target_size(720, 1280, 0)
    with pytest.raises(ValueError, match="too extreme"):
        target_size(10, 100000, 480 * 832)


def test_frames_rule():
    for f in (1, 5, 9, 81, 161, 961, np.int64(81)):
        assert frames_ok(f)
    for f in (0, -3, 2, 80, 82, 81.0, True, "81"):
        assert not frames_ok(f)
    assert check_frames(81) == 81
    with pytest.raises(ValueError, match="77 or 81"):
        check_frames(80)
    with pytest.raises(ValueError, match="positive integer"):
        check_frames(0)
    assert latent_frames(81) == 21 and latent_frames(161) == 41 and latent_frames(1) == 1


def test_token_counts_match_spec():
    assert token_count(81, 480, 832) == 32_760
    assert token_count(81, 464, 832) == 31_668
    assert token_count(161, 464, 832) == 61_828
    assert token_count(81, 720, 1280) == 75_600
    assert token_count(161, 720, 1280) == 147_600
    assert token_count(961, 720, 1280) == 867_600


def test_latent_size_and_size_names():
    assert latent_size(464, 832) == (58, 104)
    with pytest.raises(ValueError, match="multiples of 16"):
        latent_size(460, 832)
    assert max_area_for("480p") == 399_360 and max_area_for("720P") == 921_600
    assert max_area_for("480*832") == 399_360 and max_area_for("720x1280") == 921_600
    with pytest.raises(ValueError, match="unknown size"):
        max_area_for("huge")


def test_height_width_of_a_size_string():
    from lingbot_world.wan.sizes import height_width

    assert height_width("480*832") == (480, 832) and height_width(" 304X528 ") == (304, 528)
    assert height_width("480p") is None and height_width("0*16") is None and height_width("a*b") is None

"""The action-string grammar, key arrays and fitting keys to a video (fast-act spec §7)."""
import numpy as np
import pytest

from lingbot_world.wan.control.actions import (
    KEYS,
    ActionStringError,
    KeyInputError,
    KeyTimeline,
    Segment,
    keys_for_video,
    normalize_action_string,
    pad_to_4n1,
    parse_action_string,
)

README_EXAMPLE = "w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15"


def test_readme_example_is_90_frames_padded_to_93():
    segments = parse_action_string(README_EXAMPLE)
    assert [str(s) for s in segments] == ["w-10", "a-10", "d-10", "wi-15", "none-10", "j-10", "l-10", "s-15"]
    keys = KeyTimeline.from_string(README_EXAMPLE)
    assert keys.frames == 90
    fitted, frames, note = keys_for_video(keys)
    assert frames == 93 and fitted.frames == 93
    assert note == ("action string: 90 frames of keys, padded with 3 frame(s) without keys to 93 (a video has "
                    "4n+1 frames).")
    assert fitted.keys_at(92) == "" and fitted.keys_at(89) == "s"
    # frame 30..44 walk forward while looking up
    assert [fitted.keys_at(f) for f in (29, 30, 44, 45)] == ["d", "wi", "wi", ""]


def test_keys_per_frame_and_arrays():
    keys = KeyTimeline.from_string("w-2,none-1,IJ-1,wasdijkl-1")
    assert [keys.keys_at(f) for f in range(5)] == ["w", "w", "", "ij", KEYS]
    assert keys.wasd.dtype == np.float32 and keys.wasd.tolist() == [
        [1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert keys.ijkl.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_full_width_commas_whitespace_and_case():
    assert normalize_action_string(" W - 3 ，\tiW-2\n") == "W-3,iW-2"
    a = KeyTimeline.from_string(" W - 3 ，\tiW-2\n")
    b = KeyTimeline.from_string("w-3,iw-2")
    assert np.array_equal(a.pressed, b.pressed)
    assert parse_action_string("ww-2")[0] == Segment("w", 2)  # repeated letters are one key


def test_to_string_round_trip_cut_and_join():
    keys = KeyTimeline.from_string(README_EXAMPLE)
    assert np.array_equal(KeyTimeline.from_string(keys.to_string()).pressed, keys.pressed)
    head, tail = keys[:37], keys[37:]
    assert head.frames == 37 and tail.frames == 53
    assert np.array_equal((head + tail).pressed, keys.pressed)
    assert keys.padded(93).frames == 93
    with pytest.raises(KeyInputError):
        keys.padded(80)


@pytest.mark.parametrize(
    "text, segment, fragment",
    [
        ("", None, "empty"),
        ("  ，  ", None, "segment 1 is empty"),
        ("w-3,,a-2", "segment 2 is empty", "extra comma"),
        ("w-3,", "segment 2 is empty", "extra comma"),
        ("w-3,a", "segment 2 'a'", "no '-FRAMES' count"),
        ("w-3,a-x", "segment 2 'a-x'", "'x', which is not a positive whole number"),
        ("w-1.5", "segment 1 'w-1.5'", "'1.5', which is not"),
        ("a-2,w-0", "segment 2 'w-0'", "0 frames"),
        ("w-2,a--3", "segment 2 'a--3'", "key(s) '-'"),
        ("w-2,x-3", "segment 2 'x-3'", "key(s) 'x'; keys are w a s d i j k l"),
        ("w-2,wqz-3", "segment 2 'wqz-3'", "'q', 'z'"),
        ("nonew-3", "segment 1 'nonew-3'", "key(s)"),
        ("w-2,-3", "segment 2 '-3'", "'none-3'"),
    ],
)
def test_every_error_class_points_at_the_bad_segment(text, segment, fragment):
    with pytest.raises(ActionStringError) as err:
        parse_action_string(text)
    msg = str(err.value)
    assert "\n" not in msg
    if segment:
        assert segment in msg, msg
    assert fragment in msg, msg


def test_non_strings_are_refused():
    with pytest.raises(ActionStringError, match="text"):
        parse_action_string(None)


def test_pad_to_4n1():
    assert [pad_to_4n1(n) for n in (1, 2, 4, 5, 6, 90, 93)] == [1, 5, 5, 5, 9, 93, 93]
    with pytest.raises(KeyInputError):
        pad_to_4n1(0)


def test_fitting_keys_to_a_requested_frame_count():
    keys = KeyTimeline.from_string("w-10")
    same, frames, note = keys_for_video(KeyTimeline.from_string("w-9"), 9)
    assert frames == 9 and note is None
    padded, frames, note = keys_for_video(keys, 17)  # a string shorter than the video: no-key frames after it
    assert frames == 17 and padded.keys_at(9) == "w" and padded.keys_at(10) == "" and "padded" in note
    with pytest.raises(KeyInputError, match="10 frames of keys but the video has 9.*13 frames"):
        keys_for_video(keys, 9)  # a string longer than the video is refused, as in the release
    cut, frames, note = keys_for_video(keys, 9, source="wasd_action.npy", from_file=True)  # files are cut
    assert frames == 9 and cut.frames == 9 and "first 9" in note
    short, frames, note = keys_for_video(keys, 81, source="wasd_action.npy", from_file=True)
    assert frames == 9 and short.frames == 9 and "instead of the requested 81" in note
    with pytest.raises(ValueError, match="4n\\+1"):
        keys_for_video(keys, 10)


def test_key_arrays_threshold_and_shapes():
    wasd = np.array([[0.5, 0.51, 0, 1], [1, 0, 0, 0]], dtype=np.float32)
    ijkl = np.array([[0, 0, 0, 0], [0, 0.9, 0, 0]])
    keys = KeyTimeline.from_arrays(wasd, ijkl)
    assert [keys.keys_at(0), keys.keys_at(1)] == ["ad", "wj"]
    assert KeyTimeline.from_arrays(ijkl=(ijkl > 0).astype(np.int32)).keys_at(1) == "j"
    with pytest.raises(KeyInputError, match=r"wasd keys: shape \(2, 3\)"):
        KeyTimeline.from_arrays(np.zeros((2, 3)))
    with pytest.raises(KeyInputError, match="2 rows but ijkl keys has 3"):
        KeyTimeline.from_arrays(wasd, np.zeros((3, 4)))
    with pytest.raises(KeyInputError, match="NaN"):
        KeyTimeline.from_arrays(np.full((2, 4), np.nan))
    with pytest.raises(KeyInputError, match="no key arrays"):
        KeyTimeline.from_arrays()


@pytest.mark.parametrize("text, expect", [
    ("w-\u0661\u0662", "frame count '\u0661\u0662', which is not a positive whole number written with the digits 0-9"),
    ("w-\u00b2", "not a positive whole number written with the digits 0-9"),  # '²'.isdigit() is True
    ("w-100002", "segment 1 'w-100002' asks for more frames than the longest video a run makes (100001 frames"),
    ("w-" + "9" * 5000, "asks for more frames than the longest video"),  # no 4300-digit int() error
    ("w-50000,a-50000,d-2", "holds 100002 frames in all, more than the longest video a run makes"),
])
def test_counts_are_ascii_and_bounded(text, expect):
    from lingbot_world.wan.control.actions import ActionStringError, parse_action_string

    with pytest.raises(ActionStringError) as e:
        parse_action_string(text)
    assert expect in str(e.value) and len(str(e.value)) < 300


def test_the_longest_action_string_is_taken():
    from lingbot_world.wan.control.actions import parse_action_string
    from lingbot_world.wan.sizes import MAX_FRAMES

    assert sum(s.frames for s in parse_action_string(f"w-{MAX_FRAMES - 1},none-1")) == MAX_FRAMES

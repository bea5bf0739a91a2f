"""Keys per frame: the release's action-string grammar and key arrays -> a `KeyTimeline` (fast-act spec §7).

Keys: w/s forward/back, a/d left/right (move), i/k pitch up/down, j/l yaw left/right (turn).

Action string: full-width commas become commas, all whitespace is removed, then comma-separated segments
`KEYS-COUNT` split at the last '-': KEYS are letters from `wasdijkl` (any case, combined freely: `iw-15` walks
forward while looking up) or the word `none`; COUNT is a positive number of frames. Example:
`w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15` = 90 frames, padded with no-key frames to 93 (4n+1).
Every error names the segment (its number and text) and what to write instead.

Key arrays (`wasd_action.npy`, `ijkl_action.npy`): [N, 4] in the order w,a,s,d / i,j,k,l; a key is pressed
when its value is > 0.5.

A timeline can be cut and joined (`timeline[a:b]`, `a + b`), so a later continuation can feed keys segment by
segment; `act_to_camera.walk` carries the camera state across such segments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..sizes import MAX_FRAMES, VAE_TEMPORAL_STRIDE

KEYS = "wasdijkl"
MOVE_KEYS = KEYS[:4]  # columns of wasd_action.npy
TURN_KEYS = KEYS[4:]  # columns of ijkl_action.npy
NO_KEYS = "none"
PRESS_THRESHOLD = 0.5  # a key-file value above this is a pressed key (the reference's rule)
GRAMMAR = (
    "comma-separated KEYS-FRAMES segments, e.g. 'w-10,a-10,iw-15,none-10': KEYS from w a s d (move), i k (look "
    "up/down), j l (turn left/right), combined freely, or 'none'; FRAMES a positive whole number"
)


class ActionStringError(ValueError):
    """An action string that does not follow the grammar; the message points at the bad segment."""


class KeyInputError(ValueError):
    """Key arrays or a frame request that cannot be used (shape, values, too many frames)."""


@dataclass(frozen=True)
class Segment:
    """A run of frames with the same keys: `keys` in KEYS order ('' = none)."""

    keys: str
    frames: int

    def __str__(self) -> str:
        return f"{self.keys or NO_KEYS}-{self.frames}"


def normalize_action_string(text: str) -> str:
    """Full-width commas -> ',' and every whitespace character removed (as the release does)."""
    return "".join(text.replace("，", ",").split())


def _shown(text: str, limit: int = 60) -> str:
    """repr of a string, cut short: a message stays one readable line whatever was pasted."""
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def _segment_error(text: str, index: int, part: str, why: str) -> ActionStringError:
    return ActionStringError(f"action string {_shown(text)}: segment {index} {_shown(part, 30)} {why}")


def parse_action_string(text: str) -> tuple[Segment, ...]:
    """The segments of an action string; raises ActionStringError naming the first bad segment."""
    if not isinstance(text, str):
        raise ActionStringError(f"action string must be text, got {type(text).__name__}")
    s = normalize_action_string(text)
    if not s:
        raise ActionStringError(f"action string is empty; write {GRAMMAR}")
    segments = []
    for index, part in enumerate(s.split(","), start=1):
        if not part:
            raise ActionStringError(
                f"action string {text!r}: segment {index} is empty (two commas in a row, or a comma at the "
                "start or end); remove the extra comma"
            )
        if "-" not in part:
            raise _segment_error(text, index, part, f"has no '-FRAMES' count; write it as KEYS-FRAMES, e.g. {part}-5")
        keys_part, count = part.rsplit("-", 1)
        if not (count.isascii() and count.isdigit()):  # str.isdigit alone takes '١٢' or '²'
            raise _segment_error(text, index, part, f"has frame count {_shown(count, 20)}, which is not a positive "
                                                    "whole number written with the digits 0-9")
        n = int(count) if len(count.lstrip("0")) <= len(str(MAX_FRAMES)) else MAX_FRAMES + 1  # no 4300-digit int
        if n <= 0:
            raise _segment_error(text, index, part, "has 0 frames; the count must be at least 1")
        if n > MAX_FRAMES:
            raise _segment_error(text, index, part, f"asks for more frames than the longest video a run makes "
                                                    f"({MAX_FRAMES} frames, 1 h 44 min at 16 fps)")
        keys_part = keys_part.lower()
        if keys_part == NO_KEYS:
            keys = ""
        elif not keys_part:
            raise _segment_error(text, index, part, f"has no keys before '-'; write '{NO_KEYS}-{n}' for frames without keys")
        else:
            bad = sorted({c for c in keys_part if c not in KEYS})
            if bad:
                raise _segment_error(
                    text, index, part,
                    f"has key(s) {', '.join(repr(c) for c in bad)}; keys are w a s d i j k l (or the word '{NO_KEYS}')",
                )
            keys = "".join(k for k in KEYS if k in keys_part)
        segments.append(Segment(keys, n))
    total = sum(seg.frames for seg in segments)
    if total > MAX_FRAMES:
        raise ActionStringError(f"action string of {len(segments)} segments holds {total} frames in all, more than the "
                                f"longest video a run makes ({MAX_FRAMES} frames, 1 h 44 min at 16 fps); shorten it")
    return tuple(segments)


def pad_to_4n1(frames: int) -> int:
    """The smallest 4n+1 frame count >= frames (a video has 4n+1 frames)."""
    if frames < 1:
        raise KeyInputError(f"frame count {frames} must be positive")
    return frames + (-(frames - 1)) % VAE_TEMPORAL_STRIDE


def _key_array(a, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] < 1:
        raise KeyInputError(f"{name}: shape {tuple(arr.shape)} is not [N, 4] (one row of 4 key values per frame)")
    if arr.dtype.kind not in "biuf":
        raise KeyInputError(f"{name}: dtype {arr.dtype} is not numeric; save 0/1 values as float32 or int")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        rows = np.flatnonzero(~np.isfinite(arr).all(axis=1))[:5].tolist()
        raise KeyInputError(f"{name}: NaN or inf in row(s) {rows}")
    return arr


@dataclass(frozen=True, eq=False)
class KeyTimeline:
    """Which of the 8 keys (KEYS order) are pressed in each frame: `pressed` bool [F, 8]."""

    pressed: np.ndarray

    def __post_init__(self):
        p = np.asarray(self.pressed, dtype=bool)
        if p.ndim != 2 or p.shape[1] != len(KEYS):
            raise KeyInputError(f"key timeline must be [F, {len(KEYS)}] booleans, got {tuple(p.shape)}")
        p.setflags(write=False)
        object.__setattr__(self, "pressed", p)

    # ---- construction ----
    @classmethod
    def none(cls, frames: int) -> "KeyTimeline":
        return cls(np.zeros((frames, len(KEYS)), dtype=bool))

    @classmethod
    def from_segments(cls, segments: Sequence[Segment]) -> "KeyTimeline":
        rows = [np.broadcast_to([k in seg.keys for k in KEYS], (seg.frames, len(KEYS))) for seg in segments]
        return cls(np.concatenate(rows) if rows else np.zeros((0, len(KEYS)), dtype=bool))

    @classmethod
    def from_string(cls, text: str) -> "KeyTimeline":
        return cls.from_segments(parse_action_string(text))

    @classmethod
    def from_arrays(cls, wasd=None, ijkl=None, wasd_name: str = "wasd keys",
                    ijkl_name: str = "ijkl keys") -> "KeyTimeline":
        """From [N, 4] w,a,s,d and/or i,j,k,l arrays (pressed when > 0.5); a missing one means no such keys."""
        if wasd is None and ijkl is None:
            raise KeyInputError("no key arrays given (need wasd and/or ijkl)")
        move = _key_array(wasd, wasd_name) if wasd is not None else None
        turn = _key_array(ijkl, ijkl_name) if ijkl is not None else None
        if move is not None and turn is not None and move.shape[0] != turn.shape[0]:
            raise KeyInputError(
                f"{wasd_name} has {move.shape[0]} rows but {ijkl_name} has {turn.shape[0]}; give one row per frame in both"
            )
        n = (move if move is not None else turn).shape[0]
        pressed = np.zeros((n, len(KEYS)), dtype=bool)
        if move is not None:
            pressed[:, :4] = move > PRESS_THRESHOLD
        if turn is not None:
            pressed[:, 4:] = turn > PRESS_THRESHOLD
        return cls(pressed)

    # ---- views ----
    @property
    def frames(self) -> int:
        return int(self.pressed.shape[0])

    def __len__(self) -> int:
        return self.frames

    @property
    def wasd(self) -> np.ndarray:
        """[F, 4] float32 0/1 in the order w, a, s, d (the layout of wasd_action.npy and of Act's action input)."""
        return self.pressed[:, :4].astype(np.float32)

    @property
    def ijkl(self) -> np.ndarray:
        """[F, 4] float32 0/1 in the order i, j, k, l (the layout of ijkl_action.npy)."""
        return self.pressed[:, 4:].astype(np.float32)

    def keys_at(self, frame: int) -> str:
        return "".join(k for k, on in zip(KEYS, self.pressed[frame]) if on)

    def segments(self) -> tuple[Segment, ...]:
        """Runs of identical keys (the timeline written as an action string's segments)."""
        out: list[Segment] = []
        for f in range(self.frames):
            keys = self.keys_at(f)
            if out and out[-1].keys == keys:
                out[-1] = Segment(keys, out[-1].frames + 1)
            else:
                out.append(Segment(keys, 1))
        return tuple(out)

    def to_string(self) -> str:
        """The timeline as an action string (parses back to the same timeline)."""
        return ",".join(str(s) for s in self.segments())

    # ---- cutting and joining (continuation feeds segments one after another) ----
    def __getitem__(self, item: slice) -> "KeyTimeline":
        if not isinstance(item, slice):
            raise TypeError("index a key timeline with a frame range, e.g. keys[0:17]")
        return KeyTimeline(self.pressed[item])

    def __add__(self, other: "KeyTimeline") -> "KeyTimeline":
        return KeyTimeline(np.concatenate([self.pressed, other.pressed]))

    def padded(self, frames: int) -> "KeyTimeline":
        """Extended with no-key frames to `frames` (never shortened)."""
        if frames < self.frames:
            raise KeyInputError(f"cannot pad {self.frames} frames of keys down to {frames}")
        return self + KeyTimeline.none(frames - self.frames)


def keys_for_video(keys: KeyTimeline, frames: Optional[int] = None, *, source: str = "action string",
                   from_file: bool = False) -> tuple[KeyTimeline, int, Optional[str]]:
    """Fit keys to a video: (keys of exactly `frames` frames, frames, note or None).

    frames=None: the keys' own length, padded with no-key frames to 4n+1 (the release's rule for strings).
    frames given (4n+1): an action string may not be longer (the release refuses it) and is padded with
    no-key frames when shorter; key files are cut to the video (the release reads `keys[:frame_num]`) and,
    when they cover fewer frames, the video is shortened to what they cover, like a short trajectory.
    """
    from ..sizes import check_frames

    if keys.frames < 1:
        raise KeyInputError(f"the {source} holds no frames")
    if frames is None:
        target = pad_to_4n1(keys.frames)
        note = (f"{source}: {keys.frames} frames of keys, padded with {target - keys.frames} frame(s) without keys "
                f"to {target} (a video has 4n+1 frames).") if target != keys.frames else None
        return keys.padded(target), target, note
    check_frames(frames)
    if keys.frames == frames:
        return keys, frames, None
    if keys.frames > frames:
        if not from_file:
            raise KeyInputError(
                f"{source}: {keys.frames} frames of keys but the video has {frames}; shorten the keys or ask for "
                f"{pad_to_4n1(keys.frames)} frames"
            )
        return keys[:frames], frames, f"{source}: {keys.frames} frames of keys; using the first {frames}."
    if from_file:
        covered = ((keys.frames - 1) // VAE_TEMPORAL_STRIDE) * VAE_TEMPORAL_STRIDE + 1
        return keys[:covered], covered, (
            f"{source}: {keys.frames} frames of keys; generating {covered} frames instead of the requested {frames}.")
    return keys.padded(frames), frames, (
        f"{source}: {keys.frames} frames of keys, padded with {frames - keys.frames} frame(s) without keys to {frames}.")


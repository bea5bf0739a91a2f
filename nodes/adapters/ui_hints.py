"""Hints for the pack's frontend extension (web/lingbot_world.js), declared in a node's INPUT_TYPES options.

ComfyUI passes unknown option keys through /object_info untouched; the extension reads them for every node
that declares them, so a new node gets the behaviour with one line, e.g.

    "width": ("INT", {"default": 832, **show_if(size=["custom"])}),
    "high_noise_expert": (names, {**short_labels()}),

- show_if: the widget is shown only while each named widget has one of the listed values (it stays visible when
  it, or a controlling widget, is driven by a link);
- hide_if: the other way round: hidden while a named widget has one of the listed values (e.g. a setting that
  only matters when another one is not 0);
- short_labels: a combo of paths shows the shortest distinct end of each path ("high_noise_model_bnb_nf4"
  instead of "lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4"); the value sent to the server is unchanged;
- upload: adds an upload button of the named kind next to a combo ("camera_npy": poses.npy + intrinsics.npy into
  a new folder under input/lingbot_trajectories, then selected).
Current ComfyUI (frontend 1.3x+, and its Vue node renderer, where hiding a widget from an extension may not work)
has a native way for secondary widgets: `"advanced": True` puts them behind the node's "show advanced" toggle. The
conditional widgets carry it too (`advanced()`), so they stay out of the way there; 0.3.64's frontend ignores the key
and the extension hides them as before.
No ComfyUI imports: plain dicts.
"""
from __future__ import annotations

ADVANCED = "advanced"  # ComfyUI's own option key (nodes_model_advanced.py uses it)
SHOW_IF = "lingbot_show_if"
HIDE_IF = "lingbot_hide_if"
SHORT_LABELS = "lingbot_short_labels"
UPLOAD = "lingbot_upload"
UPLOAD_KINDS = ("camera_npy",)


def show_if(**conditions: list) -> dict:
    """Options that show the widget only while every named widget holds one of its listed values."""
    if not conditions:
        raise ValueError("show_if needs at least one widget=[values] condition")
    return {SHOW_IF: {name: list(values) for name, values in conditions.items()}, ADVANCED: True}


def hide_if(**conditions: list) -> dict:
    """Options that hide the widget while any named widget holds one of its listed values."""
    if not conditions:
        raise ValueError("hide_if needs at least one widget=[values] condition")
    return {HIDE_IF: {name: list(values) for name, values in conditions.items()}, ADVANCED: True}


def advanced() -> dict:
    """A secondary widget: behind "show advanced" in current ComfyUI (shown as usual in 0.3.64)."""
    return {ADVANCED: True}


def short_labels() -> dict:
    return {SHORT_LABELS: True}


def upload(kind: str) -> dict:
    if kind not in UPLOAD_KINDS:
        raise ValueError(f"upload kind must be one of {UPLOAD_KINDS}, got {kind!r}")
    return {UPLOAD: kind}

"""Which control input a LingBot-World model takes, and the one-line refusal when it is given the other kind.

Base (Cam) and Fast take a 6-channel Plücker camera tensor; Base (Act) takes 7 channels (ray directions + WASD
keys, fast-act spec §6). The kind is read from the weights (`DiTConfig.control_kind`); feeding one kind to the
other model cannot work (the input layer has a different width), so it is refused before any sampling starts.
"""
from __future__ import annotations

from typing import Optional

CAMERA = "camera"
ACT = "act"

MODEL_NAMES = {
    CAMERA: "a Cam model with 6-channel camera control (Plücker rays)",
    ACT: "an Act model with 7-channel control (ray directions + WASD keys)",
}
INPUT_NAMES = {
    CAMERA: "a camera trajectory (6-channel Plücker)",
    ACT: "Act control (ray directions + WASD keys)",
}


class ControlMismatchError(ValueError):
    """The control input does not fit the model (camera for an Act model, Act control for a Cam model)."""


def check_control(model_kind: str, given: Optional[str], fix: str = "") -> None:
    """Refuse `given` ('camera', 'act' or None = no control) for a model of `model_kind`; `fix` says what to do."""
    if model_kind not in MODEL_NAMES:
        raise ValueError(f"unknown model control kind {model_kind!r}; expected one of {sorted(MODEL_NAMES)}")
    if given is None or given == model_kind:
        return
    if given not in INPUT_NAMES:
        raise ValueError(f"unknown control kind {given!r}; expected one of {sorted(INPUT_NAMES)}")
    raise ControlMismatchError(
        f"these experts are {MODEL_NAMES[model_kind]}, detected from their weights, but the input is "
        f"{INPUT_NAMES[given]}" + (f"; {fix}" if fix else "")
    )

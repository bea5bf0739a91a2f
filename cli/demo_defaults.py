"""`generate --demo`: the tiny demo's inputs for every flag the user did not give."""
from __future__ import annotations

from pathlib import Path


def apply_demo_defaults(args) -> None:
    """--demo: every input not given defaults to the demo's (image, prompt, camera or keys, size, frames, CPU)."""
    from ..loaders.demo_checkpoint import DEMO_IMAGE, DEMO_PROMPT

    from ..loaders.action_files import looks_like_path

    args.image = args.image or DEMO_IMAGE
    args.prompt = args.prompt or DEMO_PROMPT
    if args.demo == "act":  # the release's Act example input (action.npy + poses.npy)
        args.actions = args.actions or (None if args.camera else str(DEMO_IMAGE.parent / "examples" / "05"))
    elif not args.actions:
        args.camera = args.camera or "dolly_in+pan_right"
    if args.size == "480*832":
        args.size = "64*112"
    if args.frames is None and not (args.actions and not looks_like_path(args.actions)):
        args.frames = 17  # an action string sets its own length
    if args.device == "auto":
        args.device = "cpu"
    if args.out is None:
        args.out = Path("lingbot_demo.mp4")

"""The release's example inputs the example workflows use, put into ComfyUI's input folder at start-up.

ComfyUI's Load Image lists only files under input/, and LingBot Camera From Files / LingBot Actions list trajectory
and key-file folders there, so the pack copies the official examples its workflows use (Apache-2.0,
assets/examples: 00 the camera example, 03 the Fast model's, 05 the Act model's with its key files) and the demo
image to input/lingbot_examples/ when they are missing, and the first frames also to the top of input/ (Load
Image lists only that level): the example workflows then run without any setup beyond
the model files. A file whose size differs from the shipped one (an interrupted copy) is copied again;
nothing else in input/ is touched. No ComfyUI imports: the caller passes the input folder.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[2] / "assets"
FOLDER = "lingbot_examples"
CAMERA_FILES = ("image.jpg", "poses.npy", "intrinsics.npy", "prompt.txt")
EXAMPLES = {  # example id -> files it ships
    "00": CAMERA_FILES,  # the base (Cam) model's example
    "03": CAMERA_FILES,  # the Fast model's example (the release's run_fast.sh)
    "05": CAMERA_FILES + ("action.npy", "wasd_action.npy", "ijkl_action.npy"),  # the Act model's example, with keys
}
EXTRA = {"demo_image.jpg": ASSETS / "demo_image.jpg", "NOTICE.md": ASSETS / "examples" / "NOTICE.md"}
# Load Image lists only the top level of input/, so the first frames the templates load go there too
TOP_LEVEL = {"lingbot_demo_image.jpg": ASSETS / "demo_image.jpg",
             **{f"lingbot_example_{e}.jpg": ASSETS / "examples" / e / "image.jpg" for e in EXAMPLES}}
EXAMPLE_IMAGE = "lingbot_example_00.jpg"  # what the example workflows load
EXAMPLE_TRAJECTORY = f"{FOLDER}/00"
FAST_EXAMPLE = f"{FOLDER}/03"
ACT_EXAMPLE = f"{FOLDER}/05"
DEMO_IMAGE = "lingbot_demo_image.jpg"


def shipped_files() -> dict[str, Path]:
    """Destination (relative to input/) -> source in the pack."""
    files = {f"{FOLDER}/{k}": src for k, src in EXTRA.items()}
    files.update(TOP_LEVEL)
    for example, names in EXAMPLES.items():
        for name in names:
            files[f"{FOLDER}/{example}/{name}"] = ASSETS / "examples" / example / name
    return files


def install_example_inputs(input_dir: Path) -> list[str]:
    """Copy the shipped example inputs that are missing (or incomplete) under input_dir; returns what was copied."""
    copied = []
    for rel, src in shipped_files().items():
        dst = Path(input_dir) / rel
        try:
            if dst.is_file() and dst.stat().st_size == src.stat().st_size:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            copied.append(rel)
        except OSError as e:  # a read-only input folder must not stop ComfyUI; the workflows then say what is missing
            log.warning("LingBot-World: could not copy the example input %s to %s: %s", src.name, dst, e)
            return copied
    if copied:
        log.info("LingBot-World: example inputs (Apache-2.0, see %s/NOTICE.md) copied to %s/%s",
                 FOLDER, input_dir, FOLDER)
    return copied

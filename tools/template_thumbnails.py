"""Thumbnails for the template browser: example_workflows/<name>.jpg beside each <name>.json.

    python -m lingbot_world.tools.template_thumbnails            # every workflow without a thumbnail
    python -m lingbot_world.tools.template_thumbnails --all      # redo all of them

ComfyUI's frontend shows example_workflows/<name>.jpg on the workflow's card. Each thumbnail is drawn from what
the workflow itself uses: its first frame (Load Image, resolved to the pack's example inputs) on top and, below,
the picture of its camera path (a preset, a trajectory folder, or LingBot Actions' keys: an action string, the
strings of a Fast Continue chain joined into one walk, or an Act example folder's poses.npy with its action.npy
keys). A workflow whose experts are the random-weight
demo shows a strip of frames the demo really generates (coloured noise) instead, rendered once with the CLI.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from PIL import Image, ImageDraw, ImageOps

from ..loaders.action_files import read_act_folder
from ..loaders.camera_files import load_camera
from ..nodes.adapters.example_inputs import shipped_files
from ..wan.control.act_to_camera import keys_to_camera
from ..wan.control.actions import KeyTimeline
from ..wan.control.camera_presets import preset_camera
from ..wan.control.trajectory_plot import plot_trajectory

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "example_workflows"
SIZE = 512
PHOTO_H = 288  # 16:9 on top
BACKGROUND = (24, 26, 30)
DEMO_EXPERT = "lingbot-demo/"


def _node(ui: dict, kind: str) -> Optional[dict]:
    return next((n for n in ui["nodes"] if n["type"] == kind), None)


def first_frame(ui: dict) -> Image.Image:
    node = _node(ui, "LoadImage")
    src = shipped_files().get(node["widgets_values"][0]) if node else None
    if src is None:
        raise ValueError("the workflow's Load Image does not use one of the pack's example inputs")
    return Image.open(src).convert("RGB")


def camera_picture(ui: dict) -> Optional[Image.Image]:
    if (node := _node(ui, "LingBotCameraPreset")) is not None:
        preset, combine, speed, frames = node["widgets_values"][:4]
        names = [preset] if combine in ("none", "", None) else [preset, combine]
        path = preset_camera(names, frames=int(frames), speed=float(speed))
        return plot_trajectory(path.poses, path.intrinsics, title="+".join(names))
    if (node := _node(ui, "LingBotCameraFromFiles")) is not None:
        folder = shipped_files()[f"{node['widgets_values'][0]}/poses.npy"].parent
        path = load_camera(folder)
        return plot_trajectory(path.poses, path.intrinsics, title=f"example {folder.name}")
    if (node := _node(ui, "LingBotActions")) is not None:
        key_files, actions, frames = node["widgets_values"][:3]
        if f"{key_files}/action.npy" in shipped_files():  # what the Act model gets: poses.npy + action.npy keys
            act = read_act_folder(shipped_files()[f"{key_files}/action.npy"].parent)
            n = int(frames) or act.actions.shape[0]
            keys = KeyTimeline.from_arrays(wasd=act.actions[:n])
            return plot_trajectory(act.path.poses[:n], act.path.intrinsics, title=f"keys of example {act.label}",
                                   keys=keys)
        actions = ",".join(chained_actions(ui)) or actions
        keys = KeyTimeline.from_string(actions)
        walk, _ = keys_to_camera(keys)
        return plot_trajectory(walk.poses, walk.intrinsics, title=actions, keys=keys)
    return None


def chained_actions(ui: dict) -> list[str]:
    """The action strings of a Fast Sampler -> Fast Continue -> ... chain, part by part (empty without one): with
    the continuable rule the parts are one walk of the concatenated keys, so the thumbnail draws the whole walk."""
    by_id = {n["id"]: n for n in ui["nodes"]}
    links = {link[0]: link for link in ui["links"]}  # [id, from node, from slot, to node, to slot, type]

    def source(node: dict, name: str) -> Optional[dict]:
        link = next((i["link"] for i in node.get("inputs", []) if i["name"] == name), None)
        return by_id[links[link][1]] if link is not None else None

    def next_step(node: dict) -> Optional[dict]:
        return next((n for n in ui["nodes"] if n["type"] == "LingBotFastContinue" and source(n, "state") is node), None)

    step, strings = _node(ui, "LingBotFastSampler"), []
    while step is not None:
        keys = source(step, "camera")
        if keys is not None and keys["type"] == "LingBotActions" and keys["widgets_values"][0] == "(action string)":
            strings.append(keys["widgets_values"][1])
        step = next_step(step)
    return strings if len(strings) > 1 else []


def demo_frames(count: int = 4) -> list[Image.Image]:
    """Frames the tiny random-weight demo generates (CLI, CPU, about a minute)."""
    with tempfile.TemporaryDirectory(prefix="lingbot-thumb-") as tmp:
        out = Path(tmp) / "frames"
        subprocess.run([sys.executable, "-m", "lingbot_world", "generate", "--demo", "--quiet", "--out", str(out)],
                       check=True, cwd=tmp)
        files = sorted(out.glob("*.png"))
        picks = [files[round(i * (len(files) - 1) / (count - 1))] for i in range(count)]
        return [Image.open(p).convert("RGB") for p in picks]


def compose(photo: Image.Image, below: Image.Image) -> Image.Image:
    canvas = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
    canvas.paste(ImageOps.fit(photo, (SIZE, PHOTO_H), Image.LANCZOS), (0, 0))
    room = (SIZE - 16, SIZE - PHOTO_H - 16)
    below = ImageOps.contain(below, room, Image.LANCZOS)
    canvas.paste(below, ((SIZE - below.width) // 2, PHOTO_H + 8 + (room[1] - below.height) // 2))
    return canvas


def frame_strip(frames: list[Image.Image]) -> Image.Image:
    gap = 6
    w = (SIZE - 16 - gap * (len(frames) - 1)) // len(frames)
    tiles = [ImageOps.fit(f, (w, round(w * f.height / f.width)), Image.NEAREST) for f in frames]
    strip = Image.new("RGB", (len(tiles) * w + gap * (len(tiles) - 1), tiles[0].height + 28), BACKGROUND)
    for i, t in enumerate(tiles):
        strip.paste(t, (i * (w + gap), 0))
    ImageDraw.Draw(strip).text((0, tiles[0].height + 8), "generated frames (random weights: noise)",
                               fill=(200, 200, 200))
    return strip


def thumbnail(ui: dict, demo: Optional[list[Image.Image]] = None) -> Image.Image:
    loader = _node(ui, "LingBotExpertLoader")
    is_demo = loader is not None and str(loader["widgets_values"][0]).startswith(DEMO_EXPERT)
    if is_demo:
        return compose(first_frame(ui), frame_strip(demo if demo is not None else demo_frames()))
    picture = camera_picture(ui)
    if picture is None:
        raise ValueError("no camera node to draw")
    return compose(first_frame(ui), picture)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="redo thumbnails that exist already")
    args = parser.parse_args(argv)
    for path in sorted(WORKFLOWS.glob("*.json")):
        out = path.with_suffix(".jpg")
        if out.exists() and not args.all:
            continue
        thumbnail(json.loads(path.read_text())).save(out, quality=88, optimize=True)
        print(f"wrote {out.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Bring example_workflows/*.json up to what the template browser and a first run need (issue 27); idempotent.

    python -m lingbot_world.tools.update_templates          # rewrite the templates in place
    python -m lingbot_world.tools.update_templates --check  # exit 1 when a template is out of date

What it does to every template:
- link table: each link's target slot is the slot that lists it (the frontend repairs a wrong one on every load);
- widgets added since a template was saved get their defaults (LingBot Sampler's `previews`);
- Load Image points at an example the pack copies to the TOP of ComfyUI/input (Load Image lists only that level);
- every LingBot loader names the release's own layout (its loader downloads it, world/hub.py), and the Missing
  Models dialog lists only the core loaders' repackaged .safetensors (`properties.models`), which it can download;
- LoRA loaders that point at a file no one has are bypassed (Ctrl+B turns them on);
- the native tiny demo reads the tiny demo's own VAE through LingBot VAE Loader / Decode (no 254 MB download);
- the LingBot-Sampler templates are laid out in the native templates' four groups;
- the derived templates (tools/template_demos.py): the Fast, Act, Play and v2 1.3B demos on the tiny demo's files,
  the Play template and the v2 1.3B template, from the Fast graph, and the v2 1.3B Play template from the Play one.
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Optional

from . import template_demos as td
from .template_demos import NATIVE_DEMO, demo_notes, fast_layout
from .template_models import NOTES, use_release_files

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "example_workflows"
HF = "https://huggingface.co"
COMFY_WAN21 = f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files"
COMFY_WAN22 = f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files"
FILE_MODELS = {  # widget value -> (directory, url)
    "umt5_xxl_fp16.safetensors": ("text_encoders", f"{COMFY_WAN21}/text_encoders/umt5_xxl_fp16.safetensors"),
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors": (
        "text_encoders", f"{COMFY_WAN21}/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
    "wan_2.1_vae.safetensors": ("vae", f"{COMFY_WAN22}/vae/wan_2.1_vae.safetensors"),
}
FILE_WIDGETS = {"LingBotTextEncode": "text_encoder", "LingBotVAELoader": "vae_name", "CLIPLoader": "clip_name",
                "VAELoader": "vae_name"}
IMAGES = {"lingbot_examples/00/image.jpg": "lingbot_example_00.jpg",
          "lingbot_examples/03/image.jpg": "lingbot_example_03.jpg",
          "lingbot_examples/05/image.jpg": "lingbot_example_05.jpg",
          "lingbot_examples/demo_image.jpg": "lingbot_demo_image.jpg",
          "example.png": "lingbot_example_00.jpg"}
GROUP_TITLES = ("Step 1 – Load models", "Step 2 – Image + camera", "Step 3 – Prompt", "Step 4 – Sample + save")
GROUP_COLOUR = "#3f789e"


# ---- widgets by name ---------------------------------------------------------------------------------------
def node_defs() -> dict:
    """/object_info-like entries for the pack's nodes (core nodes are not needed here)."""
    import logging

    from ..nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
    from ..nodes.adapters.workflow_convert import v1_node_info

    logging.disable(logging.ERROR)  # outside ComfyUI the model lists are empty (and say so): only widgets matter here
    try:
        return {n: v1_node_info(n, c, NODE_DISPLAY_NAME_MAPPINGS[n]) for n, c in NODE_CLASS_MAPPINGS.items()}
    finally:
        logging.disable(logging.NOTSET)


def widget_index(node_def: dict, name: str) -> int:
    from ..nodes.adapters.workflow_convert import extra_values, widget_inputs

    pos = 0
    for widget, spec in widget_inputs(node_def):
        if widget == name:
            return pos
        pos += 1 + extra_values(widget, spec)
    raise KeyError(f"{node_def['name']} has no widget {name!r}")


def set_widget(node: dict, name: str, value, defs: dict) -> None:
    node["widgets_values"][widget_index(defs[node["type"]], name)] = value


def get_widget(node: dict, name: str, defs: dict):
    return node["widgets_values"][widget_index(defs[node["type"]], name)]


def fill_defaults(ui: dict, defs: dict) -> None:
    """Widgets the node declares after the saved values (added later) get their defaults."""
    from ..nodes.adapters.workflow_convert import extra_values, widget_inputs

    for node in ui["nodes"]:
        if node["type"] not in defs:
            continue
        values = node.setdefault("widgets_values", [])
        pos = 0
        for name, spec in widget_inputs(defs[node["type"]]):
            if pos >= len(values):
                values.append(spec[1].get("default"))
            pos += 1 + extra_values(name, spec)


# ---- the fixes ---------------------------------------------------------------------------------------------
def fix_links(ui: dict) -> None:
    """Each link's target slot is the index of the input that lists it."""
    nodes = {n["id"]: n for n in ui["nodes"]}
    for link in ui["links"]:
        target = nodes[link[3]]
        slots = [i for i, e in enumerate(target.get("inputs", [])) if e.get("link") == link[0]]
        if slots:
            link[4] = slots[0]


def fix_images(ui: dict) -> None:
    for node in ui["nodes"]:
        if node["type"] == "LoadImage" and node["widgets_values"][0] in IMAGES:
            node["widgets_values"][0] = IMAGES[node["widgets_values"][0]]


def set_models(ui: dict, defs: dict) -> None:
    """The Missing Models list: only files it can download, i.e. ComfyUI's repackaged .safetensors on the nodes that
    read them. The LingBot loaders' release folders and files are fetched by the loaders themselves (their download
    switch), so they get no entry (the dialog cannot put a folder in place, nor download a .json or .pth)."""
    for node in ui["nodes"]:
        props = node.setdefault("properties", {})
        props.pop("models", None)
        widget = FILE_WIDGETS.get(node["type"])
        if widget is None:
            continue
        value = node["widgets_values"][0] if node["type"] in ("CLIPLoader", "VAELoader") else \
            get_widget(node, widget, defs)
        if value in FILE_MODELS:
            directory, url = FILE_MODELS[value]
            props["models"] = [{"name": value, "url": url, "directory": directory}]
    ui.pop("models", None)


def bypass_placeholder_loras(ui: dict) -> None:
    for node in ui["nodes"]:
        if node["type"] == "LingBotLoraLoader" and str(node["widgets_values"][0]).startswith("your_"):
            node["mode"] = 4  # bypassed: the graph runs without a LoRA until one is picked and the node enabled


def native_demo_vae(ui: dict) -> None:
    """VAELoader (real 254 MB Wan 2.1 VAE) -> LingBot VAE Loader with the demo's tiny VAE; VAEDecode -> LingBot VAE
    Decode."""
    nodes = {n["id"]: n for n in ui["nodes"]}
    links = {l[0]: l for l in ui["links"]}
    for node in ui["nodes"]:
        if node["type"] == "VAELoader":
            node.update(type="LingBotVAELoader", widgets_values=["lingbot-demo/Wan2.1_VAE.pth"])
            node["properties"] = {"cnr_id": "comfyui-lingbot-world", "Node name for S&R": "LingBotVAELoader"}
            node["outputs"][0].update(name="vae", type="LINGBOT_VAE")
            for lid in node["outputs"][0]["links"]:
                links[lid][5] = "LINGBOT_VAE"
                target = nodes[links[lid][3]]
                for e in target["inputs"]:
                    if e.get("link") == lid:
                        e["type"] = "LINGBOT_VAE" if target["type"] != "LingBotImageToVideoNative" else "VAE,LINGBOT_VAE"
        elif node["type"] == "VAEDecode":
            by_name = {e["name"]: e for e in node["inputs"]}
            node.update(type="LingBotVAEDecode", widgets_values=[False, 32])
            node["properties"] = {"cnr_id": "comfyui-lingbot-world", "Node name for S&R": "LingBotVAEDecode"}
            node["inputs"] = [{"name": "vae", "type": "LINGBOT_VAE", "link": by_name["vae"]["link"]},
                              {"name": "samples", "type": "LATENT", "link": by_name["samples"]["link"]}]
            node["outputs"][0]["name"] = "images"
            node["size"] = [300, 110]
    fix_links(ui)


# ---- groups ------------------------------------------------------------------------------------------------
STEP_OF = {"LingBotExpertLoader": 0, "LingBotVAELoader": 0, "LingBotTextEncode": 2, "LoadImage": 1,
           "LingBotCameraPreset": 1, "LingBotCameraFromFiles": 1, "LingBotActions": 1, "PreviewImage": 1,
           "LingBotImageToVideo": 1, "LingBotSampler": 3, "LingBotVAEDecode": 3, "CreateVideo": 3, "SaveVideo": 3}
GAP = 90  # room for a node's title bar and a little air
COLUMN_GAP = 60  # two group margins and a little air


PATH_WIDTH = 560  # loaders whose combos may show a whole path (a model that is not installed yet)
PATH_WIDTH_NATIVE = 470  # the native model loader's only path widget has a short label
PATH_NODES = ("LingBotExpertLoader", "LingBotTextEncode", "LingBotVAELoader", "LingBotFastLoader")


def widen_path_nodes(ui: dict) -> None:
    for node in ui["nodes"]:
        if node["type"] in PATH_NODES:
            node["size"][0] = max(node["size"][0], PATH_WIDTH)


def widen_first_column(ui: dict, types, width: int) -> None:
    """Loaders in the first column made `width` wide; every node to their right moves right by as much."""
    column = [n for n in ui["nodes"] if n["type"] in types]
    grow = max((width - n["size"][0] for n in column), default=0)
    if grow <= 0:
        return
    right_of = max(n["pos"][0] + n["size"][0] for n in column)
    for node in ui["nodes"]:
        if node["pos"][0] >= right_of:
            node["pos"][0] += grow
    for node in column:
        node["size"][0] = width


def lay_out_in_groups(ui: dict) -> None:
    """Loaders, then the prompt below them; image + camera; sampler, with decode and save to its right (nothing below
    the sampler, so its preview grid has room). Each step gets a group around its nodes."""
    steps: dict[int, list] = {0: [], 1: [], 2: [], 3: []}
    for node in ui["nodes"]:
        if node["type"] in STEP_OF:
            steps[STEP_OF[node["type"]]].append(node)
    def width(nodes) -> int:
        return max((n["size"][0] for n in nodes), default=0)

    sampler = [n for n in steps[3] if n["type"] == "LingBotSampler"]
    rest = [n for n in steps[3] if n["type"] != "LingBotSampler"]
    for node in sampler:
        node["size"] = [max(node["size"][0], 380), max(node["size"][1], 640)]
    x1 = width(steps[0] + steps[2]) + COLUMN_GAP
    x2 = x1 + width(steps[1]) + COLUMN_GAP
    x3 = x2 + width(sampler) + COLUMN_GAP
    y = 0
    for node in steps[0]:
        node["pos"] = [0, y]
        y += node["size"][1] + GAP
    for node in steps[2]:
        node["pos"] = [0, y + 40]
    for column, x in ((steps[1], x1), (sampler, x2), (rest, x3)):
        y = 0
        for node in column:
            node["pos"] = [x, y]
            y += node["size"][1] + GAP
    ui["groups"] = _groups(steps)


NATIVE_STEP_OF = {"LingBotModelLoader": 0, "ModelSamplingSD3": 0, "CLIPLoader": 0, "VAELoader": 0,
                  "LingBotVAELoader": 0, "LingBotLoraLoader": 0, "LoadImage": 1, "LingBotCameraPreset": 1,
                  "PreviewImage": 1, "LingBotImageToVideoNative": 1, "CLIPTextEncode": 2, "LingBotTextEncode": 2,
                  "KSamplerAdvanced": 3, "VAEDecode": 3, "LingBotVAEDecode": 3, "CreateVideo": 3, "SaveVideo": 3}


def native_groups(ui: dict) -> None:
    """The native templates keep their layout, the model loaders wide enough for a whole path (what is not installed
    shows with its folder) and the rest moved right by as much; their groups are drawn around their members again
    (Load VAE made narrower so the first two groups do not overlap)."""
    widen_first_column(ui, ("LingBotModelLoader",), PATH_WIDTH_NATIVE)
    for node in ui["nodes"]:  # under the loaders, nothing to their right before the next column
        if node["type"] in ("LingBotTextEncode", "CLIPLoader") and node["pos"][0] < 100:
            node["size"][0] = max(node["size"][0], PATH_WIDTH_NATIVE + (30 if node["type"] == "LingBotTextEncode" else 0))
        if node["type"] == "LingBotVAEDecode":
            node["size"][0] = min(node["size"][0], 230)  # VAEDecode's width: Save Video starts right of it
    for node in ui["nodes"]:
        if node["type"] in ("VAELoader", "LingBotVAELoader") and node["pos"][0] > 100:
            node["size"][0] = min(node["size"][0], 300)
    decode = next((n for n in ui["nodes"] if n["type"] == "LingBotVAEDecode"), None)
    if decode is not None:  # the tiny demo's decoder is taller than VAEDecode: what sits under it moves down
        bottom = decode["pos"][1] + decode["size"][1] + GAP
        for node in ui["nodes"]:
            if node is not decode and node["pos"][0] == decode["pos"][0] and decode["pos"][1] < node["pos"][1] < bottom:
                node["pos"][1] = bottom
    steps = {i: [n for n in ui["nodes"] if NATIVE_STEP_OF.get(n["type"]) == i] for i in range(4)}
    ui["groups"] = _groups(steps)


def _groups(steps: dict) -> list:
    groups = []
    for i, title in enumerate(GROUP_TITLES):
        members = steps[i]
        if not members:
            continue
        x0 = min(n["pos"][0] for n in members) - 20
        y0 = min(n["pos"][1] for n in members) - 70
        x1 = max(n["pos"][0] + n["size"][0] for n in members) + 20
        y1 = max(n["pos"][1] + n["size"][1] for n in members) + 20
        groups.append({"id": len(groups) + 1, "title": title, "bounding": [x0, y0, x1 - x0, y1 - y0],
                       "color": GROUP_COLOUR, "font_size": 24, "flags": {}})
    return groups


# ---- all of it ---------------------------------------------------------------------------------------------
def updated(name: str, ui: dict, defs: dict) -> dict:
    ui = copy.deepcopy(ui)
    fix_links(ui)
    fill_defaults(ui, defs)
    fix_images(ui)
    bypass_placeholder_loras(ui)
    if name == NATIVE_DEMO:
        native_demo_vae(ui)
    use_release_files(ui, lambda n, w, v: set_widget(n, w, v, defs), lambda n, w: get_widget(n, w, defs))
    demo_notes(name, ui)
    if name in NOTES:
        _node_of(ui, "MarkdownNote")["widgets_values"] = [NOTES[name]]
    if any(n["type"] == "LingBotSampler" for n in ui["nodes"]):
        widen_path_nodes(ui)
        lay_out_in_groups(ui)
    elif any(n["type"] == "KSamplerAdvanced" for n in ui["nodes"]):
        native_groups(ui)
    else:  # the Fast templates keep their layout, the loaders wide enough for a whole path
        widen_first_column(ui, PATH_NODES, PATH_WIDTH)
        if any(n["type"] == "LingBotFastSampler" for n in ui["nodes"]):
            fast_layout(ui)
    set_models(ui, defs)
    ui["last_node_id"] = max(n["id"] for n in ui["nodes"])
    ui["last_link_id"] = max((l[0] for l in ui["links"]), default=0)
    return ui


def _node_of(ui: dict, kind: str) -> dict:
    return next(n for n in ui["nodes"] if n["type"] == kind)


def all_templates(defs: Optional[dict] = None) -> dict[str, dict]:
    defs = defs or node_defs()

    def setter(node, name, value):
        set_widget(node, name, value, defs)

    current = {p.stem: json.loads(p.read_text()) for p in sorted(WORKFLOWS.glob("*.json"))}
    out = {name: updated(name, ui, defs) for name, ui in current.items() if name not in td.DERIVED}
    fast = out[td.FAST]
    derived = {td.FAST_DEMO: td.fast_demo(fast, setter), td.ACT_DEMO: td.act_demo(out["Act model steered with keys"],
                                                                                  setter)}
    derived[td.PLAY] = td.play(fast)
    derived[td.PLAY_DEMO] = td.play_demo(derived[td.PLAY], setter)
    derived[td.V2] = td.v2(fast, setter)
    derived[td.V2_DEMO] = td.v2_demo(derived[td.V2], setter)
    derived[td.PLAY_V2] = td.play_v2(derived[td.PLAY], setter)
    for name, ui in derived.items():
        out[name] = updated(name, ui, defs)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report templates that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, ui in all_templates().items():
        path = WORKFLOWS / f"{name}.json"
        text = json.dumps(ui, indent=1, ensure_ascii=False) + "\n"
        if not path.exists() or path.read_text() != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(text)
    for name in stale:
        print(("out of date: " if args.check else "wrote ") + name)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())

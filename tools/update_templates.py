"""Bring example_workflows/*.json up to what the template browser and a first run need (issue 27); idempotent.

    python -m lingbot_world.tools.update_templates          # rewrite the templates in place
    python -m lingbot_world.tools.update_templates --check  # exit 1 when a template is out of date

What it does to every template:
- link table: each link's target slot is the slot that lists it (the frontend repairs a wrong one on every load);
- widgets added since a template was saved get their defaults (LingBot Sampler's `previews`);
- Load Image points at an example the pack copies to the TOP of ComfyUI/input (Load Image lists only that level);
- the Missing Models dialog gets every model file with where it goes and a download link: file widgets on their
  node (`properties.models`), expert folders at the workflow level, one entry per file inside the folder;
- LoRA loaders that point at a file no one has are bypassed (Ctrl+B turns them on);
- the native tiny demo reads the tiny demo's own VAE through LingBot VAE Loader / Decode (no 254 MB download);
- the LingBot-Sampler templates are laid out in the native templates' four groups;
- two more demo templates (Fast, Act) are derived from the Fast and Act ones, on the tiny demo's files.
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "example_workflows"
HF = "https://huggingface.co"
NF4_REPO = f"{HF}/cahlen/lingbot-world-base-cam-nf4/resolve/main"
COMFY_WAN21 = f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files"
COMFY_WAN22 = f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files"
NF4_EXPERT_FILES = ("model.safetensors", "config.json", "quantization_meta.json")
RELEASE_EXPERT_FILES = ("diffusion_pytorch_model.safetensors.index.json", "config.json")  # plus its shards
RELEASES = {"lingbot-world-base-act": f"{HF}/robbyant/lingbot-world-base-act/resolve/main",
            "lingbot-world-base-cam": f"{HF}/robbyant/lingbot-world-fast/resolve/main"}
FILE_MODELS = {  # widget value -> (directory, url)
    "umt5_xxl_fp16.safetensors": ("text_encoders", f"{COMFY_WAN21}/text_encoders/umt5_xxl_fp16.safetensors"),
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors": (
        "text_encoders", f"{COMFY_WAN21}/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
    "wan_2.1_vae.safetensors": ("vae", f"{COMFY_WAN22}/vae/wan_2.1_vae.safetensors"),
}
FILE_WIDGETS = {"LingBotTextEncode": "text_encoder", "LingBotVAELoader": "vae_name", "CLIPLoader": "clip_name",
                "VAELoader": "vae_name"}
EXPERT_WIDGETS = {"LingBotExpertLoader": ("high_noise_expert", "low_noise_expert"), "LingBotModelLoader": ("expert",),
                  "LingBotFastLoader": ("fast_model",)}
IMAGES = {"lingbot_examples/00/image.jpg": "lingbot_example_00.jpg",
          "lingbot_examples/03/image.jpg": "lingbot_example_03.jpg",
          "lingbot_examples/05/image.jpg": "lingbot_example_05.jpg",
          "lingbot_examples/demo_image.jpg": "lingbot_demo_image.jpg",
          "example.png": "lingbot_example_00.jpg"}
DEMO = "Tiny CPU demo (random weights)"
NATIVE_DEMO = "Tiny CPU demo with native KSamplers (random weights)"
FAST_DEMO = "Tiny CPU demo, Fast model (random weights)"
ACT_DEMO = "Tiny CPU demo, Act model (random weights)"
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


def expert_models(value: str) -> list[dict]:
    """Missing Models entries for an expert folder: one per file inside it."""
    parts = value.split("/")
    if parts[0] == "lingbot-world-base-cam-nf4":
        return [{"name": f"{value}/{f}", "url": f"{NF4_REPO}/{'/'.join(parts[1:])}/{f}", "directory": "lingbot_world"}
                for f in NF4_EXPERT_FILES]
    if parts[0] in RELEASES:
        return [{"name": f"{value}/{f}", "url": f"{RELEASES[parts[0]]}/{'/'.join(parts[1:])}/{f}",
                 "directory": "lingbot_world"} for f in RELEASE_EXPERT_FILES]
    return []


def set_models(ui: dict, defs: dict) -> None:
    workflow_models = []
    for node in ui["nodes"]:
        props = node.setdefault("properties", {})
        props.pop("models", None)
        widget = FILE_WIDGETS.get(node["type"])
        if widget is not None:
            value = node["widgets_values"][0] if node["type"] in ("CLIPLoader", "VAELoader") else \
                get_widget(node, widget, defs)
            if value in FILE_MODELS:
                directory, url = FILE_MODELS[value]
                props["models"] = [{"name": value, "url": url, "directory": directory}]
        experts = []
        for widget in EXPERT_WIDGETS.get(node["type"], ()):
            if node.get("mode", 0) != 4:
                experts += expert_models(get_widget(node, widget, defs))
        if experts:  # on the node too: newer frontends read only the nodes' lists
            props["models"] = experts
        workflow_models += experts
    seen = set()
    ui["models"] = [m for m in workflow_models if not (m["name"] in seen or seen.add(m["name"]))]
    if not ui["models"]:
        del ui["models"]


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


# ---- the two derived demo templates ------------------------------------------------------------------------
def _node(ui: dict, kind: str) -> dict:
    return next(n for n in ui["nodes"] if n["type"] == kind)


def _note(ui: dict, text: str) -> None:
    _node(ui, "MarkdownNote")["widgets_values"] = [text]


DEMO_SETUP = ("Nothing to install: the tiny demo checkpoint (random weights, a few MB) is built into "
              "**ComfyUI/models/lingbot_world/{folder}/** the first time this graph runs (a few seconds). The first "
              "frame, lingbot_demo_image.jpg, is copied into ComfyUI/input by the pack when ComfyUI starts. Press Run.")


def fast_demo(fast: dict, defs: dict) -> dict:
    ui = copy.deepcopy(fast)
    set_widget(_node(ui, "LingBotFastLoader"), "fast_model", "lingbot-demo/lingbot_world_fast_bnb_nf4", defs)
    _demo_files(ui, "lingbot-demo", defs)
    set_widget(_node(ui, "LingBotCameraPreset"), "frames", 33, defs)
    i2v = _node(ui, "LingBotImageToVideo")
    for name, value in (("size", "custom"), ("width", 112), ("height", 64), ("frames", 33)):
        set_widget(i2v, name, value, defs)
    _grow(ui, i2v, 260)  # custom size: the width and height rows show
    _node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_demo_fast"
    _note(ui, "## Tiny CPU demo: the Fast model (random weights)\n\nThe *Fast image to video, camera preset* graph on "
              "a tiny random Fast model: it shows the pack works on any machine, in seconds on a CPU. The video is "
              "noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo") +
              "\n\nFor real videos open *Fast image to video, camera preset*.")
    return ui


def act_demo(act: dict, defs: dict) -> dict:
    ui = copy.deepcopy(act)
    loader = _node(ui, "LingBotExpertLoader")
    set_widget(loader, "high_noise_expert", "lingbot-demo-act/high_noise_model_bnb_nf4", defs)
    set_widget(loader, "low_noise_expert", "lingbot-demo-act/low_noise_model_bnb_nf4", defs)
    set_widget(loader, "memory_mode", "swap", defs)
    _demo_files(ui, "lingbot-demo-act", defs)
    set_widget(_node(ui, "LingBotActions"), "frames", 9, defs)
    i2v = _node(ui, "LingBotImageToVideo")
    for name, value in (("size", "custom"), ("width", 64), ("height", 32)):
        set_widget(i2v, name, value, defs)
    _grow(ui, i2v, 260)
    set_widget(_node(ui, "LingBotSampler"), "steps", 2, defs)
    _node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_demo_act"
    _note(ui, "## Tiny CPU demo: the Act model (random weights)\n\nThe *Act model steered with keys* graph on tiny "
              "random Act experts (example 05's keys steer it): it shows the pack works on any machine, in seconds "
              "on a CPU. The video is noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo-act") +
              "\n\nFor real videos open *Act model steered with keys*.")
    return ui


def _grow(ui: dict, node: dict, height: int) -> None:
    """Make `node` `height` tall; the nodes below it in its column move down by as much."""
    grow = height - node["size"][1]
    if grow <= 0:
        return
    for other in ui["nodes"]:
        if other is not node and other["pos"][0] == node["pos"][0] and other["pos"][1] > node["pos"][1]:
            other["pos"][1] += grow
    node["size"][1] = height


def _demo_files(ui: dict, folder: str, defs: dict) -> None:
    text = _node(ui, "LingBotTextEncode")
    set_widget(text, "text_encoder", f"{folder}/models_t5_umt5-xxl-enc-bf16.pth", defs)
    set_widget(text, "tokenizer", "auto", defs)
    set_widget(_node(ui, "LingBotVAELoader"), "vae_name", f"{folder}/Wan2.1_VAE.pth", defs)
    image = _node(ui, "LoadImage")
    if image["widgets_values"][0] != "lingbot_example_05.jpg":  # the Act demo keeps example 05's frame for its keys
        image["widgets_values"][0] = "lingbot_demo_image.jpg"


def demo_notes(name: str, ui: dict) -> None:
    if name == DEMO:
        _note(ui, "## Tiny CPU demo (random weights)\n\nLingBot-World's whole pipeline (two NF4 experts, umT5 text "
                  "encoder, Wan VAE, camera control) on **random tiny weights**: it runs in seconds on any machine "
                  "and shows the pack works; the video is noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo") +
                  "\n\nFor real videos open *Image to video, camera preset* (models/lingbot_world, about 20 GB of "
                  "lingbot-world NF4 experts).")
    elif name == NATIVE_DEMO:
        _note(ui, "## Native nodes on the tiny demo checkpoint (CPU)\n\nThe graph of *Image to video with native "
                  "KSamplers, camera preset* on **random tiny weights** (the video is noise): it checks that the "
                  "native door (KSamplerAdvanced on LingBot MODELs) works without downloads.\n\n" +
                  DEMO_SETUP.format(folder="lingbot-demo") + "\n\nThe tiny experts take the tiny encoder's 32-wide "
                  "text and the tiny VAE's latents, so the prompt comes from LingBot Text Encode and the VAE from "
                  "LingBot VAE Loader here; with the real experts use CLIPLoader + CLIPTextEncode (umT5-XXL) and Load "
                  "VAE (wan_2.1_vae.safetensors).")


# ---- all of it ---------------------------------------------------------------------------------------------
def updated(name: str, ui: dict, defs: dict) -> dict:
    ui = copy.deepcopy(ui)
    fix_links(ui)
    fill_defaults(ui, defs)
    fix_images(ui)
    bypass_placeholder_loras(ui)
    if name == NATIVE_DEMO:
        native_demo_vae(ui)
    demo_notes(name, ui)
    if any(n["type"] == "LingBotSampler" for n in ui["nodes"]):
        widen_path_nodes(ui)
        lay_out_in_groups(ui)
    elif any(n["type"] == "KSamplerAdvanced" for n in ui["nodes"]):
        native_groups(ui)
    else:  # the Fast templates keep their layout, the loaders wide enough for a whole path
        widen_first_column(ui, PATH_NODES, PATH_WIDTH)
    set_models(ui, defs)
    ui["last_node_id"] = max(n["id"] for n in ui["nodes"])
    ui["last_link_id"] = max((l[0] for l in ui["links"]), default=0)
    return ui


def all_templates(defs: Optional[dict] = None) -> dict[str, dict]:
    defs = defs or node_defs()
    current = {p.stem: json.loads(p.read_text()) for p in sorted(WORKFLOWS.glob("*.json"))}
    out = {name: updated(name, ui, defs) for name, ui in current.items() if name not in (FAST_DEMO, ACT_DEMO)}
    out[FAST_DEMO] = updated(FAST_DEMO, fast_demo(out["Fast image to video, camera preset"], defs), defs)
    out[ACT_DEMO] = updated(ACT_DEMO, act_demo(out["Act model steered with keys"], defs), defs)
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

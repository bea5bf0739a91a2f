"""Templates derived from others (tools/update_templates.py runs them): the tiny CPU demos of the Fast, Act, Play
and v2 1.3B graphs, the Play template, the v2 1.3B template and the v2 1.3B Play template, each from the graph it
shows."""
from __future__ import annotations

import copy

FAST = "Fast image to video, camera preset"
FAST_DEMO = "Tiny CPU demo, Fast model (random weights)"
ACT_DEMO = "Tiny CPU demo, Act model (random weights)"
PLAY = "Play the Fast model live with keys"
PLAY_DEMO = "Tiny CPU demo, Play (random weights)"
V2 = "V2 1.3B causal model, camera preset"
V2_DEMO = "Tiny CPU demo, v2 1.3B model (random weights)"
V2_MODEL = "lingbot-world-v2-1.3b-causal-fast"
V2_DEMO_MODEL = "lingbot-demo-v2-1.3b/transformers"
PLAY_V2 = "Play the v2 1.3B model live in real time"
DERIVED = (FAST_DEMO, ACT_DEMO, PLAY, PLAY_DEMO, V2, V2_DEMO, PLAY_V2)

DEMO_SETUP = ("Nothing to install: the tiny demo checkpoint (random weights, a few MB) is built into "
              "**ComfyUI/models/lingbot_world/{folder}/** the first time this graph runs (a few seconds). The first "
              "frame, lingbot_demo_image.jpg, is copied into ComfyUI/input by the pack when ComfyUI starts. Press Run.")


def node(ui: dict, kind: str) -> dict:
    return next(n for n in ui["nodes"] if n["type"] == kind)


def note(ui: dict, text: str) -> None:
    node(ui, "MarkdownNote")["widgets_values"] = [text]


def grow(ui: dict, target: dict, height: int) -> None:
    """Make `target` `height` tall; the nodes below it in its column move down by as much."""
    more = height - target["size"][1]
    if more <= 0:
        return
    for other in ui["nodes"]:
        if other is not target and other["pos"][0] == target["pos"][0] and other["pos"][1] > target["pos"][1]:
            other["pos"][1] += more
    target["size"][1] = height


def demo_files(ui: dict, folder: str, set_widget) -> None:
    text = node(ui, "LingBotTextEncode")
    set_widget(text, "text_encoder", f"{folder}/models_t5_umt5-xxl-enc-bf16.pth")
    set_widget(text, "tokenizer", "auto")
    set_widget(node(ui, "LingBotVAELoader"), "vae_name", f"{folder}/Wan2.1_VAE.pth")
    image = node(ui, "LoadImage")
    if image["widgets_values"][0] != "lingbot_example_05.jpg":  # the Act demo keeps example 05's frame for its keys
        image["widgets_values"][0] = "lingbot_demo_image.jpg"


def fast_layout(ui: dict) -> None:
    """The Fast graphs: nothing under the sampler, so its previews (they grow the node) cover no other node; decode
    and save in the column to its right."""
    sampler = node(ui, "LingBotFastSampler")
    sampler["size"] = [sampler["size"][0], max(sampler["size"][1], 640)]
    right = sampler["pos"][0] + sampler["size"][0] + 60
    moved = [node(ui, kind) for kind in ("LingBotVAEDecode", "CreateVideo", "SaveVideo")]
    # columns already there (the continued template's Continue chains) move one column on to make room
    shift = max(n["size"][0] for n in moved) + 60
    beyond = [n for n in ui["nodes"] if n["pos"][0] >= right and all(n is not m for m in moved)]
    if all(n["pos"][0] >= right + shift for n in beyond):
        beyond = []  # the column is free already (laid out before): nothing moves
    for n in beyond:
        n["pos"] = [n["pos"][0] + shift, n["pos"][1]]
    ds = ui.get("extra", {}).get("ds")
    if beyond and ds:  # the opening view still shows every column on a 1600-pixel wide window
        left = min(n["pos"][0] for n in ui["nodes"])
        width = max(n["pos"][0] + n["size"][0] for n in ui["nodes"]) - left
        ds["scale"] = min(ds["scale"], round(1500 / width, 2))
        ds["offset"] = [round(40 / ds["scale"] - left), ds["offset"][1]]
    y = 0
    for n in moved:
        n["pos"] = [right, y]
        y += n["size"][1] + 90


def small(ui: dict, set_widget, frames: int, width: int = 112, height: int = 64) -> None:
    i2v = node(ui, "LingBotImageToVideo")
    for name, value in (("size", "custom"), ("width", width), ("height", height), ("frames", frames)):
        set_widget(i2v, name, value)
    grow(ui, i2v, 260)  # custom size: the width and height rows show


def fast_demo(fast: dict, set_widget) -> dict:
    ui = copy.deepcopy(fast)
    set_widget(node(ui, "LingBotFastLoader"), "fast_model", "lingbot-demo/lingbot_world_fast_bnb_nf4")
    demo_files(ui, "lingbot-demo", set_widget)
    set_widget(node(ui, "LingBotCameraPreset"), "frames", 33)
    small(ui, set_widget, 33)
    node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_demo_fast"
    note(ui, "## Tiny CPU demo: the Fast model (random weights)\n\nThe *Fast image to video, camera preset* graph on "
             "a tiny random Fast model: it shows the pack works on any machine, in seconds on a CPU. The video is "
             "noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo") +
             f"\n\nFor real videos open *{FAST}*.")
    fast_layout(ui)
    return ui


def act_demo(act: dict, set_widget) -> dict:
    ui = copy.deepcopy(act)
    loader = node(ui, "LingBotExpertLoader")
    set_widget(loader, "high_noise_expert", "lingbot-demo-act/high_noise_model_bnb_nf4")
    set_widget(loader, "low_noise_expert", "lingbot-demo-act/low_noise_model_bnb_nf4")
    set_widget(loader, "memory_mode", "swap")
    demo_files(ui, "lingbot-demo-act", set_widget)
    set_widget(node(ui, "LingBotActions"), "frames", 9)
    i2v = node(ui, "LingBotImageToVideo")
    for name, value in (("size", "custom"), ("width", 64), ("height", 32)):
        set_widget(i2v, name, value)
    grow(ui, i2v, 260)
    set_widget(node(ui, "LingBotSampler"), "steps", 2)
    node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_demo_act"
    note(ui, "## Tiny CPU demo: the Act model (random weights)\n\nThe *Act model steered with keys* graph on tiny "
             "random Act experts (example 05's keys steer it): it shows the pack works on any machine, in seconds "
             "on a CPU. The video is noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo-act") +
             "\n\nFor real videos open *Act model steered with keys*.")
    return ui


# ---- Play ----------------------------------------------------------------------------------------------------
def _drop(ui: dict, kinds: tuple) -> None:
    gone = {n["id"] for n in ui["nodes"] if n["type"] in kinds}
    ui["nodes"] = [n for n in ui["nodes"] if n["id"] not in gone]
    dead = {l[0] for l in ui["links"] if l[1] in gone or l[3] in gone}
    ui["links"] = [l for l in ui["links"] if l[0] not in dead]
    for n in ui["nodes"]:
        for e in n.get("inputs", []):
            if e.get("link") in dead:
                e["link"] = None
        for o in n.get("outputs", []):
            if o.get("links"):
                o["links"] = [x for x in o["links"] if x not in dead] or None


def _link(ui: dict, src: dict, slot: int, dst: dict, name: str, kind: str) -> None:
    lid = max((l[0] for l in ui["links"]), default=0) + 1
    target = next(i for i, e in enumerate(dst["inputs"]) if e["name"] == name)
    ui["links"].append([lid, src["id"], slot, dst["id"], target, kind])
    dst["inputs"][target]["link"] = lid
    out = src["outputs"][slot]
    out["links"] = (out.get("links") or []) + [lid]


def _new(ui: dict, kind: str, pos, size, inputs, outputs, values) -> dict:
    n = {"id": max(n["id"] for n in ui["nodes"]) + 1, "type": kind, "pos": list(pos), "size": list(size),
         "flags": {}, "order": len(ui["nodes"]), "mode": 0, "inputs": inputs, "outputs": outputs,
         "properties": {"cnr_id": "comfyui-lingbot-world", "Node name for S&R": kind}, "widgets_values": values}
    if not kind.startswith("LingBot"):
        n["properties"] = {"cnr_id": "comfy-core", "Node name for S&R": kind}
    ui["nodes"].append(n)
    return n


def play(fast: dict) -> dict:
    """The Fast graph with LingBot Play in place of sampler, decode and save; the played keys on a Preview Any."""
    ui = copy.deepcopy(fast)
    _drop(ui, ("LingBotCameraPreset", "PreviewImage", "LingBotFastSampler", "LingBotVAEDecode", "CreateVideo",
               "SaveVideo"))
    i2v = node(ui, "LingBotImageToVideo")
    player = _new(ui, "LingBotPlay", (i2v["pos"][0], i2v["pos"][1] + i2v["size"][1] + 90), (340, 330),
                  [{"name": "fast_model", "type": "LINGBOT_FAST_MODEL", "link": None},
                   {"name": "text", "type": "LINGBOT_TEXT", "link": None},
                   {"name": "i2v", "type": "LINGBOT_I2V", "link": None}],
                  [{"name": "actions", "type": "STRING", "links": None, "slot_index": 0},
                   {"name": "state", "type": "LINGBOT_FAST_STATE", "links": None, "slot_index": 1}],
                  [42, "cpu", 0, 0, "none"])  # its seed has no control widget (control_after_generate False)
    _link(ui, node(ui, "LingBotFastLoader"), 0, player, "fast_model", "LINGBOT_FAST_MODEL")
    _link(ui, node(ui, "LingBotTextEncode"), 0, player, "text", "LINGBOT_TEXT")
    _link(ui, i2v, 0, player, "i2v", "LINGBOT_I2V")
    keys = _new(ui, "PreviewAny", (i2v["pos"][0] + 400, player["pos"][1]), (360, 200),
                [{"name": "source", "type": "*", "link": None}], [], [])
    _link(ui, player, 0, keys, "source", "STRING")
    note(ui, "## Play the Fast model live\n\nPress Run: LingBot Play loads the Fast model, encodes the first frame's "
             "conditioning once and opens the player in a panel over the graph (its button reopens it). Click the "
             "video, press Play (or Space) and hold **W A S D** to move, **I J K L** to look; the keys held while a "
             "chunk plays steer the next one. **Send keys to graph** queues the workflow again: the keys played so "
             "far come out as an action string (shown on Preview Any; LingBot Actions -> LingBot Fast Sampler with "
             "rule continuable re-renders them), and the played video's state goes on in LingBot Fast Continue.\n\n"
             "*Free model and node cache* (Edit -> Unload Models and Execution Cache in newer menus) closes the "
             "session; press Run to play again.\n\n" + _fast_files_line())
    return ui


def _fast_files_line() -> str:
    from .template_models import files_note

    return files_note("lingbot-world-base-cam/lingbot_world_fast", "lingbot_world_fast_bnb_nf4/")


def play_demo(played: dict, set_widget) -> dict:
    ui = copy.deepcopy(played)
    set_widget(node(ui, "LingBotFastLoader"), "fast_model", "lingbot-demo/lingbot_world_fast_bnb_nf4")
    demo_files(ui, "lingbot-demo", set_widget)
    small(ui, set_widget, 9)
    note(ui, "## Tiny CPU demo: Play (random weights)\n\nThe *Play the Fast model live with keys* graph on a tiny "
             "random Fast model: press Run and the player opens in a panel over the graph; press Play and hold "
             "W A S D / I J K L. The picture is noise; it shows the live player works on any machine.\n\n"
             + DEMO_SETUP.format(folder="lingbot-demo") + f"\n\nFor real play open *{PLAY}*.")
    return ui


# ---- v2 1.3B -------------------------------------------------------------------------------------------------
def v2(fast: dict, set_widget) -> dict:
    ui = copy.deepcopy(fast)
    set_widget(node(ui, "LingBotFastLoader"), "fast_model", V2_MODEL)
    node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_world_v2_1.3b"
    note(ui, "## LingBot-World v2 1.3B (causal-fast)\n\nThe v2 1.3B causal model: 4 steps per chunk of 16 frames "
             "with a K/V window of 18 latent frames and a sink of 6, 6.7x fewer FLOPs per frame than the 14B models. "
             "**Licence of its weights: CC BY-NC-SA 4.0 — non-commercial use only, with attribution; its NF4 copy "
             "keeps that licence.**\n\n"
             "**Files**: the DiT (six F32 shards, 6.84 GB) from huggingface.co/robbyant/lingbot-world-v2-1.3b-causal-"
             "fast into **ComfyUI/models/lingbot_world/lingbot-world-v2-1.3b-causal-fast/**: turn on the Fast Model "
             "Loader's **download** switch and press Run (a stopped download resumes). The first load writes its NF4 "
             "copy beside it once. Its download has the DiT only: the umT5 encoder, tokenizer and VAE come from "
             "robbyant/lingbot-world-base-cam (Apache-2.0), fetched the same way by LingBot Text Encode and LingBot "
             "VAE Loader.\n\nThe loader tells the model from its weights, so the v2 14B "
             "(lingbot-world-v2-14b-causal-fast/transformers) works in the same graph.")
    return ui


def v2_demo(v2_ui: dict, set_widget) -> dict:
    ui = copy.deepcopy(v2_ui)
    set_widget(node(ui, "LingBotFastLoader"), "fast_model", V2_DEMO_MODEL)
    demo_files(ui, "lingbot-demo", set_widget)
    set_widget(node(ui, "LingBotCameraPreset"), "frames", 33)
    small(ui, set_widget, 33)
    node(ui, "SaveVideo")["widgets_values"][0] = "video/lingbot_demo_v2_1.3b"
    note(ui, "## Tiny CPU demo: the v2 1.3B model (random weights)\n\nThe *" + V2 + "* graph on a tiny random model "
             "in the v2 1.3B release's layout (config-less F32 shards), built on first use into "
             "**ComfyUI/models/lingbot_world/lingbot-demo-v2-1.3b/**; the first run writes its NF4 copy beside it once, as "
             "with the real download; its umT5 encoder and VAE come from the tiny demo in lingbot-demo/, as the "
             "real 1.3B borrows them from another release. Seconds on a CPU; the video is noise. Press Run.")
    return ui


DEMO = "Tiny CPU demo (random weights)"
NATIVE_DEMO = "Tiny CPU demo with native KSamplers (random weights)"


def demo_notes(name: str, ui: dict) -> None:
    if name == DEMO:
        note(ui, "## Tiny CPU demo (random weights)\n\nLingBot-World's whole pipeline (two NF4 experts, umT5 text "
                  "encoder, Wan VAE, camera control) on **random tiny weights**: it runs in seconds on any machine "
                  "and shows the pack works; the video is noise.\n\n" + DEMO_SETUP.format(folder="lingbot-demo") +
                  "\n\nFor real videos open *Image to video, camera preset*: its loaders download the release "
                  "and make the NF4 experts once.")
    elif name == NATIVE_DEMO:
        note(ui, "## Native nodes on the tiny demo checkpoint (CPU)\n\nThe graph of *Image to video with native "
                  "KSamplers, camera preset* on **random tiny weights** (the video is noise): it checks that the "
                  "native door (KSamplerAdvanced on LingBot MODELs) works without downloads.\n\n" +
                  DEMO_SETUP.format(folder="lingbot-demo") + "\n\nThe tiny experts take the tiny encoder's 32-wide "
                  "text and the tiny VAE's latents, so the prompt comes from LingBot Text Encode and the VAE from "
                  "LingBot VAE Loader here; with the real experts use CLIPLoader + CLIPTextEncode (umT5-XXL) and Load "
                  "VAE (wan_2.1_vae.safetensors).")


# ---- the v2 1.3B played ----------------------------------------------------------------------------------------
def play_v2(played: dict, set_widget) -> dict:
    """The Play graph on the v2 1.3B with LingBot Speed Options on its loader: the real-time preset (draft in 2
    steps a chunk), the GPU-specific choices left to the user in the note."""
    ui = copy.deepcopy(played)
    loader = node(ui, "LingBotFastLoader")
    set_widget(loader, "fast_model", V2_MODEL)
    loader.setdefault("inputs", [])
    if not any(e["name"] == "speed" for e in loader["inputs"]):
        loader["inputs"].append({"name": "speed", "type": "LINGBOT_SPEED", "link": None})
    speed = _new(ui, "LingBotSpeedOptions", (loader["pos"][0], loader["pos"][1] - 330), (400, 250), [],
                 [{"name": "speed", "type": "LINGBOT_SPEED", "links": None, "slot_index": 0}],
                 ["from preset", "from preset", "from preset", "draft", "2"])
    _link(ui, speed, 0, loader, "speed", "LINGBOT_SPEED")
    set_widget(node(ui, "LingBotPlay"), "tiny_vae", "taew2_1.safetensors")
    note(ui, "## Play the v2 1.3B model live in real time\n\n"
             "Press Run: LingBot Play loads the v2 1.3B causal model and opens the player in a panel over the graph. "
             "Click the video, press Play (or Space) and hold **W A S D** to move, **I J K L** to look. "
             "**Licence of its weights: CC BY-NC-SA 4.0 — non-commercial use only, with attribution.**\n\n"
             "**Speed**: LingBot Speed Options asks for the real-time preset, `draft` in 2 denoising steps per "
             "16-frame chunk, and LingBot Play decodes the frames with the tiny decoder **taew2_1** (preview "
             "quality, a fraction of the VAE's time; *none* uses the VAE). If it is not in ComfyUI/models/vae_approx/ "
             "the first Run says so: turn on LingBot Play's **download** switch and press Run again (23 MB from "
             "huggingface.co/lightx2v/Autoencoders). For real time on a 24 GB card also:\n"
             "- on an RTX 40xx / 50xx / 30xx set **compute fp16acc** and, with `pip install sageattention`, **attention "
             "sage**. The RTX 4090 is projected at 0.92–0.95 s per 16-frame chunk, one second of video (a projection "
             "from an H200's profile, not a measurement). fp16's range is smaller than bf16's: a chunk that "
             "overflows stops the play with one line; then set compute to bf16.\n\n"
             "**Files**: the DiT from huggingface.co/robbyant/lingbot-world-v2-1.3b-causal-fast into "
             "**ComfyUI/models/lingbot_world/lingbot-world-v2-1.3b-causal-fast/**: turn on the Fast Model Loader's "
             "**download** switch and press Run (a stopped download resumes). The first load writes its NF4 copy "
             "beside it once. The umT5 encoder, tokenizer and VAE come from robbyant/lingbot-world-base-cam "
             "(Apache-2.0), fetched the same way by LingBot Text Encode and LingBot VAE Loader.")
    return ui

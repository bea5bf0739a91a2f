"""LingBot Play inside a real ComfyUI (opt-in: COMFYUI_PATH, see tests/comfyui_server.py): the node opens the
player's page on ComfyUI's own server (token-protected), the page's socket plays chunks on the tiny demo, queueing
again returns the played keys as the node's action string, and "Free model and node cache" closes the session."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.comfyui


comfy = load_sibling("comfyui_server")
if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)

FAST = "Fast image to video, camera preset"
WAIT_S = 300.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    base = tmp_path_factory.mktemp("comfy_play")
    comfy.prepare_base(base)
    approx = base / "models" / "vae_approx"
    approx.mkdir(parents=True, exist_ok=True)
    write_random_tiny_vae(approx / "taew2_1.safetensors")  # ComfyUI's preview-decoder folder
    (approx / "broken.safetensors").write_bytes(b"not a tiny decoder")
    with comfy.running_server(base) as srv:
        yield srv


def _play_prompt() -> dict:
    """Fast loader, text, VAE, image and I2V of the Fast example on the tiny demo, into LingBot Play."""
    from lingbot_world.nodes.adapters.example_inputs import DEMO_IMAGE

    prompt = json.loads((comfy.REPO / "tests" / "workflows" / f"{FAST}.api.json").read_text())
    kinds = {v["class_type"]: k for k, v in prompt.items()}
    keep = {kinds[t] for t in ("LingBotFastLoader", "LingBotTextEncode", "LingBotVAELoader", "LoadImage",
                               "LingBotImageToVideo")}
    prompt = {k: v for k, v in prompt.items() if k in keep}
    inputs = {v["class_type"]: v["inputs"] for v in prompt.values()}
    inputs["LingBotFastLoader"]["fast_model"] = "lingbot-demo/lingbot_world_fast_bnb_nf4"
    inputs["LingBotTextEncode"].update(text_encoder="lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", tokenizer="auto")
    inputs["LingBotVAELoader"]["vae_name"] = "lingbot-demo/Wan2.1_VAE.pth"
    inputs["LoadImage"]["image"] = DEMO_IMAGE
    inputs["LingBotImageToVideo"].update(size="custom", width=112, height=64, frames=9)
    inputs["LingBotImageToVideo"].pop("camera", None)
    prompt["50"] = {"class_type": "LingBotPlay", "inputs": {
        "fast_model": [kinds["LingBotFastLoader"], 0], "text": [kinds["LingBotTextEncode"], 0],
        "i2v": [kinds["LingBotImageToVideo"], 0], "seed": 42, "noise_source": "cpu", "window": 21, "sink": 3}}
    return prompt


def _played(server, prompt) -> dict:
    res = server.run(prompt, timeout=WAIT_S * 2)
    assert res["end"] == "done", res["error"]
    return res["history"]["outputs"]["50"]["lingbot_play"][0]


async def _play(server, url: str, keys: list[str]) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + url.replace("token=", "token=x")) as r:
            assert r.status == 403  # a wrong token
        async with http.get(server.url + url) as r:
            assert r.status == 200 and "static/player.js" in await r.text()
        async with http.ws_connect(server.url + url.replace("/?", "/ws?"), max_msg_size=0) as ws:
            state = None
            for k in [None] + keys:
                if k is not None:
                    await ws.send_str(json.dumps({"op": "step", "keys": k}))
                while True:
                    msg = await ws.receive(timeout=WAIT_S)
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        continue
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    m = json.loads(msg.data)
                    assert m["type"] != "error", m
                    if k is None and m["type"] == "hello":
                        state = m["state"]
                        break
                    if m["type"] == "chunk_end":
                        state = m["state"]
                        break
            return state


def test_play_node_plays_returns_the_keys_and_free_closes_it(server):
    prompt = _play_prompt()
    res = server.run(prompt, timeout=WAIT_S * 2)
    assert res["end"] == "done", res["error"]
    first = res["history"]["outputs"]["50"]["lingbot_play"][0]
    # while the session opens, the node says what it does, and its bar starts from 0 (issue 49)
    said = [text for node, text in res["texts"] if node == "50"]
    stages = ["loading the model (1/3)", "encoding the first frame's conditioning", "starting the player (3/3)",
              "session open"]
    at = [next((i for i, t in enumerate(said) if stage in t), None) for stage in stages]
    assert None not in at and at == sorted(at), said
    bar = [(v, m) for node, v, m in res["progress"] if node == "50"]
    assert bar and bar[0] == (0, 3) and bar[-1] == (3, 3), bar
    assert first["actions"] == "" and first["url"].startswith("/lingbot_world/play/50/?token=")
    state = asyncio.run(_play(server, first["url"], ["w-8", "jw-12"]))
    assert state["chunks"] == 2 and state["action_string"] == "w-8,wj-12"
    again = _played(server, prompt)  # queued again: the node re-runs with the keys played since
    assert again["url"] == first["url"] and again["actions"] == "w-8,wj-12"
    assert server.proc.poll() is None
    import urllib.error
    import urllib.request

    def closed() -> bool:  # the page's URL answers 404 once the session is gone
        try:
            with urllib.request.urlopen(server.url + first["url"], timeout=30):
                return False
        except urllib.error.HTTPError as e:
            assert e.code == 404, e
            return True

    assert server.free(until=closed, timeout=WAIT_S), "the session was not closed by Free model and node cache"
    assert "LingBot Play: session 50 closed" in server.log()


def _continue_prompt(played: str = "") -> dict:
    """LingBot Play's state -> LingBot Fast Continue with keys a-12, decoded to preview frames; with `played` (the
    keys played so far) also the batch run of `played` + a-12 in LingBot Fast Sampler (rule continuable, the same
    seed, window and sink), decoded likewise."""
    prompt = _play_prompt()
    kinds = {v["class_type"]: k for k, v in prompt.items()}
    vae = [kinds["LingBotVAELoader"], 0]

    def actions(text):
        return {"class_type": "LingBotActions",
                "inputs": {"key_files": "(action string)", "actions": text, "frames": 0, "path": ""}}

    def preview(node, samples):
        prompt[node] = {"class_type": "LingBotVAEDecode",
                        "inputs": {"tiled": False, "tile_size": 32, "vae": vae, "samples": samples}}
        prompt[node + "p"] = {"class_type": "PreviewImage", "inputs": {"images": [node, 0]}}

    prompt["60"] = actions("a-12")
    prompt["61"] = {"class_type": "LingBotFastContinue", "inputs": {"frames": 0, "state": ["50", 1],
                                                                    "camera": ["60", 0]}}
    preview("62", ["61", 0])
    if played:
        prompt["70"] = actions(played + ",a-12")
        i2v = dict(prompt[kinds["LingBotImageToVideo"]]["inputs"], frames=81, camera=["70", 0])
        prompt["71"] = {"class_type": "LingBotImageToVideo", "inputs": i2v}
        prompt["72"] = {"class_type": "LingBotFastSampler", "inputs": {
            "seed": 42, "noise_source": "cpu", "max_attention": 0, "window": 21, "sink": 3, "rule": "continuable",
            "fast_model": [kinds["LingBotFastLoader"], 0], "text": [kinds["LingBotTextEncode"], 0],
            "i2v": ["71", 0], "camera": ["70", 0], "previews": False}}
        preview("73", ["72", 0])
    return prompt


def _frames(server, images: list) -> list:
    import io
    import urllib.parse
    import urllib.request

    import numpy as np
    from PIL import Image

    out = []
    for im in images:
        query = urllib.parse.urlencode({k: im[k] for k in ("filename", "subfolder", "type")})
        with urllib.request.urlopen(f"{server.url}/view?{query}", timeout=60) as r:
            out.append(np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB")))
    return out


def test_play_state_continues_in_fast_continue_as_the_batch_run(server):
    """Play -> LingBot Fast Continue in the graph: refused in one line before the first chunk; after playing, the
    continued video's frames equal the Fast Sampler's batch run of the played keys and the new ones."""
    server.free()  # the first test's session, if any
    res = server.run(_continue_prompt(), timeout=WAIT_S * 2)
    assert res["end"] == "error", res
    assert "LingBot Play had played no chunk when it ran" in res["error"]["exception_message"]
    url = res["history"]["outputs"]["50"]["lingbot_play"][0]["url"]
    state = asyncio.run(_play(server, url, ["w-8", "jw-12"]))
    assert state["action_string"] == "w-8,wj-12"
    res = server.run(_continue_prompt(state["action_string"]), timeout=WAIT_S * 2)
    assert res["end"] == "done", res["error"]
    outputs = res["history"]["outputs"]
    continued, batch = (_frames(server, outputs[n]["images"]) for n in ("62p", "73p"))
    assert len(continued) == len(batch) == 33
    assert all((a == b).all() for a, b in zip(continued, batch))


@pytest.mark.parametrize("renderer", ["canvas", "vue"])
def test_play_panel_opens_in_comfyuis_page_plays_and_sends_the_keys(server, tmp_path, renderer):
    """The frontend: queueing opens the panel (web/lingbot_play.js) with the player's page in it; keys held in it
    steer the session; "Send keys to graph" re-runs the node with them; Free closes the session (the page says so).
    With the Vue node renderer ("Nodes 2.0") on as well as off, where the frontend has one: the newest
    (LINGBOT_COMFY_ARGS' --front-end-root), and 0.3.64's 1.27 as its hidden experimental setting (1.27.1 on)."""
    import os
    import shutil
    from urllib.parse import urlsplit

    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (see .ci/run)")
    exe = os.environ.get("LINGBOT_CHROMIUM") or shutil.which("chromium")
    if not exe:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)")
    server.free()  # the first test's session, if any

    def only_local(route):
        url = urlsplit(route.request.url)
        if (url.hostname, url.port) == ("127.0.0.1", server.port):
            route.continue_()
        else:
            route.abort()

    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=exe, headless=True, args=["--no-sandbox", "--disable-gpu"],
            viewport={"width": 1600, "height": 1000}, service_workers="block")
        try:
            context.route("**/*", only_local)
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(WAIT_S * 1000)

            def open_page():
                page.wait_for_function("() => window.app && window.app.graph && window.LiteGraph && "
                                       "window.LiteGraph.registered_node_types.LingBotPlay")
                for _ in range(10):  # a fresh profile opens the template browser over the graph: close it
                    if page.locator("[role=dialog][data-state=open], .p-dialog").count() == 0:
                        break
                    page.keyboard.press("Escape")
                    page.wait_for_timeout(300)

            page.goto(server.url, wait_until="domcontentloaded")
            open_page()
            if renderer == "vue":
                has_vue = page.evaluate("""() => { try { return window.app.extensionManager?.setting?.get(
                    'Comfy.VueNodes.Enabled') !== undefined } catch (e) { return false } }""")
                if not has_vue:
                    pytest.skip("this frontend has no Vue node renderer (Comfy.VueNodes.Enabled)")
                # As a user who turned it on earlier opens ComfyUI: the setting is kept on the server, the page
                # starts with it (1.27's renderer, switched on over an empty graph, draws no node of a later load).
                page.evaluate("() => window.app.extensionManager.setting.set('Comfy.VueNodes.Enabled', true)")
                page.reload(wait_until="domcontentloaded")
                open_page()
            page.evaluate("async (p) => { await window.app.loadApiJson(p, 'play'); await window.app.queuePrompt(0, 1); }",
                          _play_prompt())
            if renderer == "vue":  # the graph is drawn by Vue: LingBot Play is a DOM node
                page.wait_for_selector("[data-node-id='50']")
            frame = page.wait_for_selector("#lingbot-play-panel iframe").content_frame()
            frame.wait_for_url("**/lingbot_world/play/**")
            P = "window.lingbotPlayer"
            frame.wait_for_function(f"{P} && {P}.state && {P}.state.started")
            frame.focus("#screen")
            page.keyboard.down("w")
            frame.evaluate("document.getElementById('pause').click()")
            frame.wait_for_function(f"{P}.chunkEnds.length >= 2")
            page.keyboard.up("w")
            frame.evaluate("document.getElementById('pause').click()")
            frame.wait_for_function(f"{P}.paused && !{P}.inFlight")
            played = frame.evaluate(f"{P}.state.action_string")
            from lingbot_world.wan.control.actions import KeyTimeline

            assert KeyTimeline.from_string(played).pressed[:20, 0].all(), played  # W held through two chunks
            before = set(server.get("/history"))
            page.click("#lingbot-play-panel button:has-text('Send keys to graph')")
            t0 = time.monotonic()
            new: dict = {}
            while not any(h.get("status", {}).get("completed") for h in new.values()) and \
                    time.monotonic() - t0 < WAIT_S:
                time.sleep(1)
                new = {k: v for k, v in server.get("/history").items() if k not in before}
            outs = [o["lingbot_play"][0] for h in new.values() for o in h["outputs"].values() if "lingbot_play" in o]
            plays = [{k: v for k, v in n["inputs"].items() if not isinstance(v, list)} for h in new.values()
                     for n in h["prompt"][2].values() if n["class_type"] == "LingBotPlay"]
            assert outs and outs[0]["actions"] == played, (outs, plays)
            assert server.free(until=lambda: frame.evaluate(f"!{P}.connected"), timeout=WAIT_S), \
                "Free model and node cache did not close the session's page socket"
            # the panel says why, not "disconnected": the server is fine, the session and its models are gone
            cover = page.wait_for_selector("#lingbot-play-closed")
            assert cover.inner_text() == "Session closed, models freed: press Run to play again."
            assert frame.evaluate("document.getElementById('pause').disabled")
            assert page.locator("#lingbot-play-panel button:has-text('Send keys to graph')").is_disabled()
            assert server.proc.poll() is None and server.get("/system_stats")["system"]
            # Run again, as the panel says: a new session opens in a fresh panel, Play and Send usable again
            old_url = frame.url
            page.evaluate("() => window.app.queuePrompt(0, 1)")
            page.wait_for_function("() => !document.getElementById('lingbot-play-closed')")
            frame = page.wait_for_selector("#lingbot-play-panel iframe").content_frame()
            frame.wait_for_function(f"{P} && {P}.state && {P}.state.started")
            assert frame.url != old_url and not frame.evaluate("document.getElementById('pause').disabled")
            assert page.locator("#lingbot-play-panel button:has-text('Send keys to graph')").is_enabled()
        finally:
            context.close()
            if renderer == "vue":  # the server keeps the setting: the module's later pages draw on the canvas
                server.post("/settings/Comfy.VueNodes.Enabled", False)


def test_play_with_a_tiny_decoder_from_vae_approx(server):
    """tiny_vae lists ComfyUI's vae_approx files; a chosen one plays (its frames from the tiny decoder); a file that
    is not a tiny decoder stops the node in one line naming the input, and ComfyUI keeps running."""
    info = server.get("/object_info/LingBotPlay")["LingBotPlay"]["input"]["optional"]["tiny_vae"]
    assert info[0][0] == "none" and {"taew2_1.safetensors", "broken.safetensors"} <= set(info[0])
    server.free()
    prompt = _play_prompt()
    prompt["50"]["inputs"]["tiny_vae"] = "broken.safetensors"
    res = server.run(prompt, timeout=WAIT_S * 2)
    assert res["end"] == "error", res
    message = res["error"]["exception_message"]
    assert "tiny_vae broken.safetensors" in message and "\n" not in message.strip()
    prompt["50"]["inputs"]["tiny_vae"] = "taew2_1.safetensors"
    played = _played(server, prompt)
    state = asyncio.run(_play(server, played["url"], ["w-8", "jw-12"]))
    assert state["chunks"] == 2 and state["action_string"] == "w-8,wj-12"
    assert "frames decoded by the tiny decoder taew2_1.safetensors" in server.log()
    assert server.proc.poll() is None

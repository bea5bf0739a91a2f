"""From a fresh ComfyUI, without a terminal (issue 49): a template is refused with the pack's offer, its loaders'
download switches fetch the release from the model's hub repository (here a local fake hub: tests/fake_hub.py,
HF_ENDPOINT pointed at it), the first load writes the NF4 copy, the run makes a video, and the next run reads the
copy. Opt-in like the other real-server tests (COMFYUI_PATH)."""
from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.comfyui


comfy = load_sibling("comfyui_server")
if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)
fake_hub = load_sibling("fake_hub")

FAST = "Fast image to video, camera preset"
V2 = "V2 1.3B causal model, camera preset"
API = comfy.REPO / "tests" / "workflows"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return fake_hub.build_tiny_repos(tmp_path_factory.mktemp("repos"))


@contextmanager
def fresh_comfyui(repos: dict, base: Path):
    """A fresh ComfyUI (no models) whose huggingface_hub asks the local fake hub (HF_ENDPOINT)."""
    comfy.prepare_base(base, demo=False)
    with fake_hub.FakeHub(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(base / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_XET": "1"}
        with comfy.running_server(base, env=env) as srv:
            yield hub, srv


@pytest.fixture(scope="module")
def hub_and_server(repos, tmp_path_factory):
    with fresh_comfyui(repos, tmp_path_factory.mktemp("fresh_comfy")) as both:
        yield both


def _small(name: str, frames: int, download: bool) -> dict:
    """The template as a user runs it on a CPU: a small size, and the loaders' download switches set."""
    prompt = json.loads((API / f"{name}.api.json").read_text())
    for node in prompt.values():
        inputs = node["inputs"]
        if node["class_type"] in ("LingBotFastLoader", "LingBotTextEncode", "LingBotVAELoader"):
            inputs["download"] = download
        if node["class_type"] == "LingBotImageToVideo":
            inputs.update(size="custom", width=112, height=64, frames=frames)
        if node["class_type"] == "LingBotCameraPreset":
            inputs["frames"] = frames
    return prompt


def _node_texts(res: dict, prompt: dict, kind: str) -> str:
    node = next(k for k, v in prompt.items() if v["class_type"] == kind)
    return "\n".join(text for n, text in res["texts"] if n == node)


def test_a_template_downloads_converts_once_and_runs(hub_and_server):
    hub, srv = hub_and_server
    models = srv.base / "models" / "lingbot_world"
    import urllib.error
    import uuid

    with pytest.raises(urllib.error.HTTPError) as refused:  # download off: the pack's offer, nothing fetched
        srv.post("/prompt", {"prompt": _small(FAST, 33, False), "client_id": uuid.uuid4().hex})
    answer = json.loads(refused.value.read())
    text = json.dumps(answer)
    assert "fast_model: lingbot-world-base-cam/lingbot_world_fast is not installed" in text
    assert "download switch" in text and "Apache-2.0" in text
    assert hub.gets(".safetensors") == [] and not any(models.iterdir())

    prompt = _small(FAST, 33, True)
    res = srv.run(prompt, timeout=900)
    assert res["end"] == "done", res["error"]
    fast = models / "lingbot-world-base-cam" / "lingbot_world_fast"
    repo = hub.repos["robbyant/lingbot-world-fast"]
    assert sorted(p.name for p in fast.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in repo.iterdir() if p.name != "README.md")  # only the model's files
    assert (models / "lingbot-world-base-cam" / "lingbot_world_fast_bnb_nf4" / "config.json").is_file()
    cam = models / "lingbot-world-base-cam"
    assert (cam / "models_t5_umt5-xxl-enc-bf16.pth").is_file() and (cam / "google" / "umt5-xxl").is_dir()
    assert (cam / "Wan2.1_VAE.pth").is_file() and not (cam / "examples").exists() and not (cam / "README.md").exists()
    assert not (cam / "high_noise_model").exists()  # the Fast template needs no base expert
    loader = _node_texts(res, prompt, "LingBotFastLoader")
    assert "downloading the LingBot-World Fast's DiT" in loader and "Apache-2.0" in loader
    assert "made the NF4 copy lingbot_world_fast_bnb_nf4 of lingbot_world_fast (first load)" in loader, loader
    loader_id = next(k for k, v in prompt.items() if v["class_type"] == "LingBotFastLoader")
    assert any(node == loader_id for node, _, _ in res["progress"])  # the download's and the conversion's bar
    heads = [p for m, p, _ in hub.requests if m == "HEAD"]
    assert any(p.endswith("/config.json") for p in heads)
    save = next(k for k, v in prompt.items() if v["class_type"] == "SaveVideo")
    video = res["history"]["outputs"][save]["images"][0]
    assert (srv.base / "output" / video["subfolder"] / video["filename"]).stat().st_size > 1000

    fetched = len(hub.gets(".safetensors"))
    srv.free()  # ComfyUI drops its node cache: the loader reruns
    again = srv.run(_small(FAST, 33, True), timeout=900)  # the next load reads the copy; nothing is fetched
    assert again["end"] == "done", again["error"]
    assert "read the NF4 copy lingbot_world_fast_bnb_nf4" in _node_texts(again, prompt, "LingBotFastLoader")
    assert len(hub.gets(".safetensors")) == fetched


def test_the_v2_template_says_its_licence_and_runs_from_the_download(hub_and_server):
    hub, srv = hub_and_server
    prompt = _small(V2, 33, True)
    res = srv.run(prompt, timeout=900)
    assert res["end"] == "done", res["error"]
    loader = _node_texts(res, prompt, "LingBotFastLoader")
    first = loader.index("downloading the LingBot-World v2 1.3B (causal-fast)'s DiT")
    assert "CC BY-NC-SA 4.0" in loader[first:first + 600] and "non-commercial" in loader
    small = srv.base / "models" / "lingbot_world"
    assert sorted(p.name for p in (small / "lingbot-world-v2-1.3b-causal-fast").glob("model*")) == sorted(
        p.name for p in hub.repos["robbyant/lingbot-world-v2-1.3b-causal-fast"].glob("model*"))
    assert (small / "lingbot-world-v2-1.3b-causal-fast_bnb_nf4" / "config.json").is_file()
    assert "LingBot-World v2 1.3B (causal-fast)" in loader and "CC BY-NC-SA 4.0" in loader.splitlines()[-1]


# Runs in the page: what the user does in the template after opening it (a small size for a CPU, the loaders'
# download switches on), then Run; the nodes' texts and the end of the run are recorded.
SET_AND_RUN = """async ([small, frames]) => {
    const app = window.app, api = app.api;
    window.__lingbot = {done: false, error: null, texts: {}};
    api.addEventListener("executing", (e) => { if (e.detail === null) window.__lingbot.done = true; });
    api.addEventListener("execution_error", (e) => { window.__lingbot.error = e.detail; window.__lingbot.done = true; });
    api.addEventListener("progress_text", (e) => {
        const t = window.__lingbot.texts; (t[e.detail.nodeId] ??= []).push(e.detail.text); });
    const set = (node, name, value) => {
        const w = node.widgets.find((w) => w.name === name);
        w.value = value; w.callback?.(value);
    };
    for (const node of app.graph._nodes) {
        if (node.widgets?.some((w) => w.name === "download")) set(node, "download", true);
        if (node.type === "LingBotImageToVideo") {
            set(node, "size", "custom"); set(node, "width", small[0]); set(node, "height", small[1]);
            set(node, "frames", frames);
        }
        if (node.type === "LingBotCameraPreset") set(node, "frames", frames);
    }
    await app.queuePrompt(0, 1);
}"""


def test_a_user_downloads_converts_and_runs_a_template_from_the_browser(repos, tmp_path):
    """The whole of issue 49's first point as a user does it, in ComfyUI's own page (whichever frontend the server
    serves: 0.3.64's, or LINGBOT_COMFY_ARGS' --front-end-root): open the Fast template, turn on its loaders'
    download switches, press Run: the files come from the (fake) hub, the NF4 copy is made, the video is saved."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (see .ci/run)")
    exe = os.environ.get("LINGBOT_CHROMIUM") or shutil.which("chromium")
    if not exe:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)")
    ui = json.loads((comfy.REPO / "example_workflows" / f"{FAST}.json").read_text())
    with fresh_comfyui(repos, tmp_path / "base") as (hub, srv), sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=exe, headless=True, args=["--no-sandbox", "--disable-gpu"],
            viewport={"width": 1600, "height": 1000}, service_workers="block")
        try:
            context.route("**/*", lambda route: route.continue_() if (urlsplit(route.request.url).hostname,
                          urlsplit(route.request.url).port) == ("127.0.0.1", srv.port) else route.abort())
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(srv.url, wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_function("() => window.app && window.app.graph && window.LiteGraph && "
                                   "window.LiteGraph.registered_node_types.LingBotFastLoader", timeout=120_000)
            page.wait_for_timeout(1500)
            for _ in range(2):  # before: the template browser of a fresh profile; after: a Missing Models dialog
                for _ in range(10):
                    if page.locator("[role=dialog][data-state=open], .p-dialog").count() == 0:
                        break
                    page.keyboard.press("Escape")
                    page.wait_for_timeout(300)
                if page.evaluate("() => window.app.graph._nodes.length") != len(ui["nodes"]):
                    page.evaluate("(ui) => window.app.loadGraphData(ui)", ui)
                    page.wait_for_timeout(1000)
            assert page.evaluate("() => window.app.graph._nodes.length") == len(ui["nodes"])
            page.evaluate(SET_AND_RUN, [[112, 64], 33])
            t0 = time.monotonic()
            while not page.evaluate("() => window.__lingbot.done"):
                assert time.monotonic() - t0 < 600, f"no end after 600 s: {srv.log()[-3000:]}"
                queue = srv.get("/queue")
                if time.monotonic() - t0 > 15 and not (queue["queue_running"] or queue["queue_pending"] or
                                                        srv.get("/history")):
                    raise AssertionError(f"the prompt was refused: {srv.log()[-3000:]}")
                time.sleep(1)
            run = page.evaluate("() => window.__lingbot")
        finally:
            context.close()
        assert run["error"] is None, run["error"]
        loader = "\n".join(run["texts"].get(str(next(n["id"] for n in ui["nodes"] if n["type"] == "LingBotFastLoader")),
                                            []))
        assert "downloading the LingBot-World Fast's DiT" in loader and "Apache-2.0" in loader, run["texts"]
        assert "made the NF4 copy lingbot_world_fast_bnb_nf4 of lingbot_world_fast (first load)" in loader
        assert hub.gets(".safetensors")  # the weights came from the hub
        models = srv.base / "models" / "lingbot_world" / "lingbot-world-base-cam"
        assert (models / "lingbot_world_fast_bnb_nf4" / "config.json").is_file()
        videos = list((srv.base / "output" / "video").glob("lingbot_world_fast*"))
        assert videos and videos[0].stat().st_size > 1000, videos

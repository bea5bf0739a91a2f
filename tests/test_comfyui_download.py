"""From a fresh ComfyUI, without a terminal (issue 49): a template is refused with the pack's offer, its loaders'
download switches fetch the release from the model's hub repository (here a local fake hub: tests/fake_hub.py,
HF_ENDPOINT pointed at it), the first load writes the NF4 copy, the run makes a video, and the next run reads the
copy. Opt-in like the other real-server tests (COMFYUI_PATH)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.comfyui


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


comfy = _load("comfyui_server")
if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)
fake_hub = _load("fake_hub")

FAST = "Fast image to video, camera preset"
V2 = "V2 1.3B causal model, camera preset"
API = comfy.REPO / "tests" / "workflows"


@pytest.fixture(scope="module")
def hub_and_server(tmp_path_factory):
    repos = fake_hub.build_tiny_repos(tmp_path_factory.mktemp("repos"))
    base = tmp_path_factory.mktemp("fresh_comfy")
    comfy.prepare_base(base, demo=False)
    with fake_hub.FakeHub(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(base / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_XET": "1"}
        with comfy.running_server(base, env=env) as srv:
            yield hub, srv


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
    import time

    time.sleep(2)  # the worker waits for the next prompt again: it reads the flags then (tests/test_comfyui_server.py)
    srv.post("/free", {"unload_models": True, "free_memory": True})  # ComfyUI drops its node cache: the loader reruns
    time.sleep(3)
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

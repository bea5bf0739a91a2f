"""The pack inside a real ComfyUI: server start-up, /object_info, the demo workflow, interrupt, free memory.

Needs a ComfyUI checkout: COMFYUI_PATH=/path/to/ComfyUI (and COMFYUI_PYTHON=its interpreter, default this
one). The checkout is never modified: the server runs with `--base-directory` pointing at a temp folder
whose custom_nodes/ links to this repository and whose models/lingbot_world/ holds the tiny demo
checkpoint (`loaders.demo_checkpoint`) plus a larger random pair for the interrupt test.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from lingbot_world.nodes import NODE_CLASS_MAPPINGS
from lingbot_world.nodes.adapters.example_inputs import DEMO_IMAGE
from lingbot_world.nodes.adapters.workflow_convert import FRONTEND_ONLY, ui_to_api

from tests.conftest import load_sibling

pytestmark = pytest.mark.comfyui


comfy = load_sibling("comfyui_server")
REPO, PACK_DIR_NAME, COMFYUI, PYTHON = comfy.REPO, comfy.PACK_DIR_NAME, comfy.COMFYUI, comfy.PYTHON
WORKFLOWS = REPO / "example_workflows"
API_COPIES = REPO / "tests" / "workflows"
DEMO = "Tiny CPU demo (random weights)"
FILE_COMBOS = {"LingBotExpertLoader.high_noise_expert", "LingBotExpertLoader.low_noise_expert",
               "LingBotFastLoader.fast_model", "LingBotTextEncode.text_encoder", "LingBotTextEncode.tokenizer",
               "LingBotVAELoader.vae_name", "LoadImage.image", "LingBotModelLoader.expert", "LingBotLoraLoader.lora_name",
               "CLIPLoader.clip_name", "VAELoader.vae_name", "LoraLoaderModelOnly.lora_name",
               "LingBotCameraFromFiles.trajectory", "LingBotActions.key_files"}
FAST = "Fast image to video, camera preset"
FAST_CONTINUE = "Fast model steered with keys, continued"
ACT = "Act model steered with keys"
NATIVE_DEMO = "Tiny CPU demo with native KSamplers (random weights)"
MEDIUM = "lingbot-medium"  # bigger random experts: slow enough to interrupt, big enough to see in RSS

if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)


# ---- fixtures ----------------------------------------------------------------------------------------------
def _medium_experts(root: Path) -> int:
    """Two random NF4 experts of ~140 MB each sharing the demo's text width; returns one file's bytes."""
    from lingbot_world.loaders.demo_checkpoint import demo_configs
    from lingbot_world.loaders.nf4_writer import make_random_nf4_expert

    tiny, _, _ = demo_configs()
    cfg = tiny.tiny(dim=1024, ffn_dim=4096, num_heads=8, num_layers=12, freq_dim=256, text_dim=tiny.text_dim)
    for i, name in enumerate(("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4")):
        make_random_nf4_expert(cfg, root / name, device="cpu", seed=100 + i, reuse_per_shape=True)
    return (root / "high_noise_model_bnb_nf4" / "model.safetensors").stat().st_size


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy_base")
    comfy.prepare_base(base)
    medium_bytes = _medium_experts(base / "models" / "lingbot_world" / MEDIUM)
    from lingbot_world.loaders.demo_checkpoint import demo_configs

    comfy.write_random_wan21_vae(base / "models" / "vae" / "wan_2.1_vae.safetensors")  # for the native graph
    comfy.write_tiny_loras(base / "models" / "loras", demo_configs()[0])
    with comfy.running_server(base) as srv:
        srv.medium_bytes = medium_bytes
        yield srv


def _api(name: str) -> dict:
    return json.loads((API_COPIES / f"{name}.api.json").read_text())


def _by_type(prompt: dict, class_type: str) -> tuple[str, dict]:
    return next((k, v) for k, v in prompt.items() if v["class_type"] == class_type)


def _demo_prompt(**sampler) -> dict:
    prompt = _api(DEMO)
    _, s = _by_type(prompt, "LingBotSampler")
    s["inputs"].update(sampler)
    return prompt


# ---- tests -------------------------------------------------------------------------------------------------
def test_pack_loads_and_every_node_is_listed(server):
    log = server.log()
    assert "Cannot import" not in log or PACK_DIR_NAME not in log.split("Cannot import", 1)[1][:300], log[-3000:]
    # ComfyUI's own optional nodes may fail for missing extras (e.g. API nodes without pydantic); ours must not.
    assert not [ln for ln in log.splitlines() if "IMPORT FAILED" in ln and PACK_DIR_NAME in ln], log[-3000:]
    stats = server.get("/system_stats")
    info = server.get("/object_info")
    for name in NODE_CLASS_MAPPINGS:
        assert name in info, f"{name} missing from /object_info"
        d = info[name]
        assert d["category"] == "LingBot-World"
        assert d["python_module"] == f"custom_nodes.{PACK_DIR_NAME}"
        for section in ("required", "optional"):
            for inp, spec in d["input"].get(section, {}).items():
                assert len(spec) > 1 and spec[1].get("tooltip"), f"{name}.{inp} has no tooltip"
    experts = info["LingBotExpertLoader"]["input"]["required"]["high_noise_expert"][0]
    assert {"lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo/low_noise_model_bnb_nf4"} <= set(experts)
    assert "lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth" in info["LingBotTextEncode"]["input"]["required"]["text_encoder"][0]
    assert "lingbot-demo/google/umt5-xxl" in info["LingBotTextEncode"]["input"]["required"]["tokenizer"][0]
    assert "lingbot-demo/Wan2.1_VAE.pth" in info["LingBotVAELoader"]["input"]["required"]["vae_name"][0]
    print(f"\nComfyUI {stats['system'].get('comfyui_version')} started in {server.startup_s:.1f} s; "
          f"python {stats['system'].get('python_version', '').split()[0]}")


def test_missing_dependency_shows_as_import_failed(tmp_path):
    """With bitsandbytes unimportable, ComfyUI's own report says IMPORT FAILED for the pack and names the package;
    the server still starts and serves its other nodes."""
    base = tmp_path / "base"
    comfy.prepare_base(base, demo=False)
    shadow = tmp_path / "shadow" / "bitsandbytes"  # first on the path, fails like a missing package does
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'bitsandbytes'\", name='bitsandbytes')\n")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    with comfy.running_server(base, env={"PYTHONPATH": path}) as srv:
        info = srv.get("/object_info")
        log = srv.log()
    assert "KSampler" in info and not [n for n in NODE_CLASS_MAPPINGS if n in info]
    failed = [ln for ln in log.splitlines() if "IMPORT FAILED" in ln and PACK_DIR_NAME in ln]
    assert failed, log[-3000:]
    reason = [ln for ln in log.splitlines() if ln.startswith("Cannot import") and PACK_DIR_NAME in ln]
    assert reason and "needs the Python package 'bitsandbytes'" in reason[0] and "pip install -r" in reason[0], log[-3000:]
    print(f"\n{failed[0].strip()}\n{reason[0].strip()}")


def test_example_workflows_load_against_object_info(server):
    info = server.get("/object_info")
    templates = server.get("/api/workflow_templates")
    listed = set(templates.get(PACK_DIR_NAME, []))
    files = sorted(WORKFLOWS.glob("*.json"))
    assert len(files) >= 3
    for path in files:
        ui = json.loads(path.read_text())
        assert path.stem in listed, f"{path.name} is not served by /api/workflow_templates"
        types = {n["type"] for n in ui["nodes"]}
        assert types & {"Note", "MarkdownNote"}, f"{path.name} has no note listing the files"
        missing = sorted(t for t in types - FRONTEND_ONLY if t not in info)
        assert not missing, f"{path.name}: node types not installed: {missing}"
        api = ui_to_api(ui, info, unchecked=FILE_COMBOS)
        assert api == _api(path.stem), f"tests/workflows/{path.stem}.api.json is out of date with {path.name}"


def test_demo_workflow_runs_to_completion(server):
    prompt = _demo_prompt()
    _, loader = _by_type(prompt, "LingBotExpertLoader")
    loader["inputs"]["memory_mode"] = "swap"
    dec_id, _ = _by_type(prompt, "LingBotVAEDecode")
    prompt["900"] = {"class_type": "SaveImage", "inputs": {"images": [dec_id, 0], "filename_prefix": "lingbot_frames"}}
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    assert res["history"]["status"]["status_str"] == "success"
    samp_id, samp = _by_type(prompt, "LingBotSampler")
    steps = samp["inputs"]["steps"]
    sampler_progress = [(v, m) for node, v, m in res["progress"] if node == samp_id and m == steps]
    assert [v for v, _ in sampler_progress][-1] == steps and len(sampler_progress) >= steps - 1
    # The server runs with ComfyUI's default --preview-method (none): LingBot samplers preview anyway (issue 27)
    assert res["previews"] >= steps - 1, "a latent preview per step should reach the websocket"
    # Each preview is the whole clip: a grid of every latent frame (demo: 5 frames of 8x14 latent pixels -> 2 x 3
    # cells), which the server scales to --preview-size; a first-frame-only preview would have the 14:8 aspect.
    import io

    from PIL import Image as PILImage

    from lingbot_world.nodes.adapters.previews import GAP, grid_layout

    _, i2v_node = _by_type(prompt, "LingBotImageToVideo")
    h, w = i2v_node["inputs"]["height"] // 8, i2v_node["inputs"]["width"] // 8
    frames_lat = (i2v_node["inputs"]["frames"] - 1) // 4 + 1
    cols, rows = grid_layout(frames_lat, w, h)
    want = (cols * w + (cols - 1) * GAP) / (rows * h + (rows - 1) * GAP)
    got = PILImage.open(io.BytesIO(res["preview_images"][-1]))
    assert abs(got.width / got.height - want) < 0.05, (got.size, want)
    outputs = res["history"]["outputs"]
    frames = outputs["900"]["images"]
    _, i2v = _by_type(prompt, "LingBotImageToVideo")
    assert len(frames) == i2v["inputs"]["frames"]
    from PIL import Image
    import numpy as np

    first = np.asarray(Image.open(server.base / "output" / frames[0]["subfolder"] / frames[0]["filename"]))
    assert first.shape == (i2v["inputs"]["height"], i2v["inputs"]["width"], 3)
    assert first.std() > 0  # random weights: noise, but not a constant frame
    save_id, _ = _by_type(prompt, "SaveVideo")
    video = outputs[save_id]["images"][0]
    mp4 = server.base / "output" / video["subfolder"] / video["filename"]
    assert mp4.is_file() and mp4.stat().st_size > 1000
    plan = [ln for ln in server.log().splitlines() if "LingBot-World memory plan" in ln]
    if not comfy.GPU:  # --cpu: no invented VRAM figure in the plan
        assert plan and "CPU run" in plan[-1] and "free VRAM" not in plan[-1], plan[-1:]
    print(f"\ndemo workflow: {res['seconds']:.1f} s, {len(frames)} frames "
          f"{first.shape[1]}x{first.shape[0]}, {res['previews']} previews")


def test_act_workflow_runs_on_the_tiny_act_demo(server):
    """The Act example (action.npy of example 05) with the tiny Act experts, small size, 9 frames, 2 steps."""
    prompt = _api(ACT)
    _, loader = _by_type(prompt, "LingBotExpertLoader")
    loader["inputs"].update(high_noise_expert="lingbot-demo-act/high_noise_model_bnb_nf4",
                            low_noise_expert="lingbot-demo-act/low_noise_model_bnb_nf4", memory_mode="swap")
    _, text = _by_type(prompt, "LingBotTextEncode")
    text["inputs"].update(text_encoder="lingbot-demo-act/models_t5_umt5-xxl-enc-bf16.pth", tokenizer="auto")
    _, vae = _by_type(prompt, "LingBotVAELoader")
    vae["inputs"]["vae_name"] = "lingbot-demo-act/Wan2.1_VAE.pth"
    _, i2v = _by_type(prompt, "LingBotImageToVideo")
    i2v["inputs"].update(size="custom", width=64, height=32)
    act_id, actions = _by_type(prompt, "LingBotActions")
    actions["inputs"]["frames"] = 9
    _, samp = _by_type(prompt, "LingBotSampler")
    samp["inputs"]["steps"] = 2
    dec_id, _ = _by_type(prompt, "LingBotVAEDecode")
    prompt["900"] = {"class_type": "SaveImage", "inputs": {"images": [dec_id, 0], "filename_prefix": "lingbot_act"}}
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    outputs = res["history"]["outputs"]
    assert len(outputs["900"]["images"]) == 9
    preview_id, _ = _by_type(prompt, "PreviewImage")
    assert len(outputs[preview_id]["images"]) == 2  # the key path and the Act input's poses + action.npy keys
    print(f"\nAct workflow: {res['seconds']:.1f} s")


def test_actions_node_steers_the_cam_demo_and_a_mismatch_is_refused(server):
    """The tiny demo with its camera preset replaced by LingBot Actions (an action string); then the same
    actions' act output on the Cam experts, which the sampler refuses with the reason."""
    prompt = _demo_prompt(steps=2)
    cam_id, _ = _by_type(prompt, "LingBotCameraPreset")
    prompt[cam_id] = {"class_type": "LingBotActions", "inputs": {
        "key_files": "(action string)", "actions": "w-8,il-4,none-4", "frames": 0}}
    _, preview = _by_type(prompt, "PreviewImage")
    preview["inputs"]["images"] = [cam_id, 2]
    _, i2v = _by_type(prompt, "LingBotImageToVideo")
    i2v["inputs"]["frames"] = [cam_id, 3]
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    _, samp = _by_type(prompt, "LingBotSampler")
    samp["inputs"]["act"] = [cam_id, 1]
    del samp["inputs"]["camera"]
    res = server.run(prompt, timeout=300)
    assert res["end"] == "error"
    message = res["error"]["exception_message"]
    assert "a Cam model" in message and "'camera' output of LingBot Actions" in message, message
    assert server.proc.poll() is None  # ComfyUI keeps running


def _fast_demo_prompt(frames: int = 33) -> dict:
    """The Fast example workflow pointed at the tiny demo's files (its Fast model, T5, VAE, image), small size."""
    prompt = _api(FAST)
    inputs = {t: v["inputs"] for v in prompt.values() for t in [v["class_type"]]}
    inputs["LingBotFastLoader"]["fast_model"] = "lingbot-demo/lingbot_world_fast_bnb_nf4"
    inputs["LingBotTextEncode"].update(text_encoder="lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", tokenizer="auto")
    inputs["LingBotVAELoader"]["vae_name"] = "lingbot-demo/Wan2.1_VAE.pth"
    inputs["LoadImage"]["image"] = DEMO_IMAGE  # installed by the pack at start-up
    inputs["LingBotCameraPreset"]["frames"] = frames
    inputs["LingBotImageToVideo"].update(size="custom", width=112, height=64, frames=frames)
    return prompt


def test_fast_workflow_runs_on_the_tiny_demo(server):
    info = server.get("/object_info")
    fast_models = info["LingBotFastLoader"]["input"]["required"]["fast_model"][0]
    assert "lingbot-demo/lingbot_world_fast_bnb_nf4" in fast_models
    prompt = _fast_demo_prompt()
    dec_id, _ = _by_type(prompt, "LingBotVAEDecode")
    prompt["900"] = {"class_type": "SaveImage", "inputs": {"images": [dec_id, 0], "filename_prefix": "lingbot_fast"}}
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    samp_id, _ = _by_type(prompt, "LingBotFastSampler")
    values = [v for node, v, m in res["progress"] if node == samp_id and m == 12]  # 3 chunks x 4 steps
    assert values and values[-1] == 12 and len(values) >= 11
    assert res["previews"] >= 3, "no chunk preview reached the websocket"
    frames = res["history"]["outputs"]["900"]["images"]
    assert len(frames) == 33
    print(f"\nfast workflow: {res['seconds']:.1f} s, {len(frames)} frames, {res['previews']} previews")


def _native_prompt(compile_low: bool) -> tuple[dict, list[str]]:
    """The native tiny demo with ComfyUI's LoraLoaderModelOnly on the high-noise expert, LingBot LoRA Loader
    (diffusers keys) on the low-noise one, EasyCache on the first pass, optionally TorchCompileModel (inductor) on
    the second; returns the prompt and the two KSamplerAdvanced ids in order."""
    prompt = _api(NATIVE_DEMO)
    loaders = {v["inputs"]["expert"]: k for k, v in prompt.items() if v["class_type"] == "LingBotModelLoader"}
    hi, lo = loaders["lingbot-demo/high_noise_model_bnb_nf4"], loaders["lingbot-demo/low_noise_model_bnb_nf4"]
    shifts = {v["inputs"]["model"][0]: k for k, v in prompt.items() if v["class_type"] == "ModelSamplingSD3"}
    prompt["901"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
        "model": [hi, 0], "lora_name": "lingbot_tiny_comfy.safetensors", "strength_model": 0.8}}
    prompt["902"] = {"class_type": "LingBotLoraLoader", "inputs": {
        "model": [lo, 0], "lora_name": "lingbot_tiny_diffusers.safetensors", "strength": 0.5}}
    prompt[shifts[hi]]["inputs"]["model"] = ["901", 0]
    prompt[shifts[lo]]["inputs"]["model"] = ["902", 0]
    ks = sorted((k for k, v in prompt.items() if v["class_type"] == "KSamplerAdvanced"),
                key=lambda k: prompt[k]["inputs"]["start_at_step"])
    prompt["903"] = {"class_type": "EasyCache", "inputs": {"model": [shifts[hi], 0], "reuse_threshold": 0.2,
                                                           "start_percent": 0.0, "end_percent": 1.0, "verbose": False}}
    prompt[ks[0]]["inputs"]["model"] = ["903", 0]
    if compile_low:
        prompt["904"] = {"class_type": "TorchCompileModel", "inputs": {"model": [shifts[lo], 0], "backend": "inductor"}}
        prompt[ks[1]]["inputs"]["model"] = ["904", 0]
    return prompt, ks


def _run_native(server, compile_low: bool) -> None:
    prompt, ks = _native_prompt(compile_low)
    start = len(server.log())
    res = server.run(prompt, timeout=1200)
    assert res["end"] == "done", res["error"]
    log = server.log()[start:]
    a, b = prompt[ks[0]]["inputs"], prompt[ks[1]]["inputs"]
    done = {k: max((v for node, v, m in res["progress"] if node == k), default=0) for k in ks}
    assert done == {ks[0]: a["end_at_step"], ks[1]: b["steps"] - b["start_at_step"]}, res["progress"]
    assert log.count("LoRA on the") >= 2, log[-3000:]
    assert "EasyCache - skipped" in log and "lora key not loaded" not in log
    save = next(k for k, v in prompt.items() if v["class_type"] == "SaveVideo")
    video = res["history"]["outputs"][save]["images"][0]
    mp4 = server.base / "output" / video["subfolder"] / video["filename"]
    assert mp4.is_file() and mp4.stat().st_size > 1000
    print(f"\nnative two-pass workflow with LoRAs + EasyCache{' + TorchCompileModel' if compile_low else ''}: "
          f"{res['seconds']:.1f} s")


def _frames_of(server, res, node: str):
    from PIL import Image
    import numpy as np

    return np.stack([np.asarray(Image.open(server.base / "output" / f["subfolder"] / f["filename"]))
                     for f in res["history"]["outputs"][node]["images"]])


def test_fast_continue_chain_runs_on_the_tiny_demo(server):
    """The continuation template (keys w-10,l-10, then a-12,iw-12, then d-12) on the tiny Fast demo: each part's
    frames are exactly the whole video's; queueing again with other keys for the last step runs only that step."""
    import numpy as np

    prompt = _api(FAST_CONTINUE)
    inputs = {t: v["inputs"] for v in prompt.values() for t in [v["class_type"]]}
    inputs["LingBotFastLoader"]["fast_model"] = "lingbot-demo/lingbot_world_fast_bnb_nf4"
    inputs["LingBotTextEncode"].update(text_encoder="lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", tokenizer="auto")
    inputs["LingBotVAELoader"]["vae_name"] = "lingbot-demo/Wan2.1_VAE.pth"
    assert inputs["LoadImage"]["image"] == "lingbot_example_03.jpg"  # installed at the top of input/ at start-up: kept
    inputs["LingBotImageToVideo"].update(size="custom", width=112, height=64)
    saves = {}
    for k, v in list(prompt.items()):  # every decoded part also as frames
        if v["class_type"] == "LingBotVAEDecode":
            saves[k] = f"9{k}"
            prompt[f"9{k}"] = {"class_type": "SaveImage", "inputs": {"images": [k, 0], "filename_prefix": f"cont{k}"}}
    sampler = _by_type(prompt, "LingBotFastSampler")[0]
    steps = [k for k, v in prompt.items() if v["class_type"] == "LingBotFastContinue"]
    first_step = next(k for k in steps if prompt[k]["inputs"]["state"][0] == sampler)
    last_step = next(k for k in steps if k != first_step)
    decode_of = {prompt[k]["inputs"]["samples"][0]: k for k in saves}
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    part1 = _frames_of(server, res, saves[decode_of[sampler]])
    part2 = _frames_of(server, res, saves[decode_of[first_step]])
    whole = _frames_of(server, res, saves[decode_of[last_step]])
    assert (len(part1), len(part2), len(whole)) == (21, 24, 57)
    assert np.array_equal(part1, whole[:21]) and np.array_equal(part2, whole[21:45])
    for node, chunks in ((sampler, 2), (first_step, 2), (last_step, 1)):
        done = [v for n, v, m in res["progress"] if n == node and m == 4 * chunks]
        assert done and done[-1] == 4 * chunks, f"no progress from node {node}"
    keys = prompt[last_step]["inputs"]["camera"][0]
    prompt[keys]["inputs"]["actions"] = "a-12"
    again = server.run(prompt, timeout=600)
    assert again["end"] == "done", again["error"]
    ran = {n for n, _, _ in again["progress"]}
    assert last_step in ran and sampler not in ran and first_step not in ran  # only the changed step ran
    other = _frames_of(server, again, saves[decode_of[last_step]])
    assert np.array_equal(other[:45], whole[:45]) and not np.array_equal(other[45:], whole[45:])
    print(f"\nfast continue chain: {res['seconds']:.1f} s, again {again['seconds']:.1f} s")


def test_native_two_ksampler_workflow_with_loras_and_easycache(server):
    _run_native(server, compile_low=False)


def test_native_workflow_with_torch_compile_model(server):
    import os

    if os.environ.get("LINGBOT_TEST_INDUCTOR") != "1":
        pytest.skip("TorchCompileModel (inductor) compiles for minutes on a CPU: set LINGBOT_TEST_INDUCTOR=1 (its "
                    "wrapper runs with the eager backend in test_native_comfy.py)")
    _run_native(server, compile_low=True)


def test_text_encode_reports_its_stages_on_the_bar_and_on_the_node(server):
    prompt = _demo_prompt(steps=2, seed=31)
    te_id, te = _by_type(prompt, "LingBotTextEncode")
    te["inputs"]["prompt"] = f"A lighthouse on a cliff at dusk ({uuid.uuid4().hex})"  # never in the cache
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    texts = [t for node, t in res["texts"] if node == te_id]
    bar = [v for node, v, m in res["progress"] if node == te_id and m == 100]
    print(f"\ntext encode node: {texts}; bar {bar}")
    assert texts[0] == "umT5: starting the encoder process..."
    assert any(t.startswith("umT5: loading the encoder weights (") and t.endswith(" kB)...") for t in texts)
    assert any(t.startswith("umT5: encoding") for t in texts)
    assert texts[-1].startswith("umT5 on c") and " encoded in " in texts[-1]  # cpu, or cuda with LINGBOT_COMFY_GPU=1
    assert bar == sorted(bar) and bar[-1] == 100 and len(set(bar)) >= 4  # start, loading..., encoding, done
    # The same prompts again (device changed so ComfyUI runs the node): served by the pack's cache, said so.
    te["inputs"]["device"] = "cpu"
    again = server.run(prompt, timeout=600)
    assert again["end"] == "done", again["error"]
    assert [t for node, t in again["texts"] if node == te_id] == ["umT5: both prompts from the cache (no encoder run)"]


def _on_demo_files(prompt: dict) -> dict:
    """A full-size example workflow pointed at the tiny demo files, at the demo's size, with 2 steps."""
    demo = _api(DEMO)
    for kind in ("LingBotExpertLoader", "LingBotTextEncode", "LingBotVAELoader"):
        _, node = _by_type(prompt, kind)
        _, tiny = _by_type(demo, kind)
        for name, value in tiny["inputs"].items():
            if name in ("high_noise_expert", "low_noise_expert", "text_encoder", "tokenizer", "vae_name"):
                node["inputs"][name] = value
    _, i2v = _by_type(prompt, "LingBotImageToVideo")
    i2v["inputs"].update(size="custom", width=112, height=64, frames=17)
    _, sampler = _by_type(prompt, "LingBotSampler")
    sampler["inputs"].update(steps=2)
    return prompt


def test_trajectory_workflow_runs_out_of_the_box(server):
    """The recorded-trajectory example needs nothing but model files: its first frame and trajectory
    (lingbot_examples/00) are the example inputs the pack installed into input/ when the server started."""
    prompt = _on_demo_files(_api("Image to video, recorded trajectory"))
    _, camera = _by_type(prompt, "LingBotCameraFromFiles")
    _, image = _by_type(prompt, "LoadImage")
    assert camera["inputs"]["trajectory"] == "lingbot_examples/00" and image["inputs"]["image"] == "lingbot_example_00.jpg"
    listed = server.get("/object_info/LoadImage")["LoadImage"]["input"]["required"]["image"][0]
    assert "lingbot_example_00.jpg" in listed and "lingbot_demo_image.jpg" in listed  # selectable in Load Image
    assert not (server.base / "input" / "lingbot_examples" / "00" / "poses.npy").is_symlink()
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    cam_id, _ = _by_type(prompt, "LingBotCameraFromFiles")
    assert [t for node, t in res["texts"] if node == cam_id] == [
        "00: 961 poses, enough for 961 video frames (60.1 s at 16 fps)"]


def test_frame_adjustments_are_shown_on_the_node(server):
    prompt = _demo_prompt(steps=1, seed=41)
    _, cam = _by_type(prompt, "LingBotCameraPreset")
    cam["inputs"]["frames"] = 9  # a camera shorter than the video ...
    i2v_id, i2v = _by_type(prompt, "LingBotImageToVideo")
    i2v["inputs"]["frames"] = 18  # ... and a count that is not 4n+1
    res = server.run(prompt, timeout=600)
    assert res["end"] == "done", res["error"]
    texts = [t for node, t in res["texts"] if node == i2v_id]
    assert len(texts) == 1, res["texts"]
    lines = texts[0].split("\n")
    assert lines[0] == "112x64, 9 frames (0.6 s at 16 fps), 3 latent frames"
    assert lines[1] == "18 frames is not of the form 4n+1: using 17."
    assert "9 poses, enough for 9 frames; generating 9 frames instead of the requested 17" in lines[2]
    assert res["history"]["status"]["status_str"] == "success"


def _medium_prompt(steps: int, seed: int, memory_mode: str) -> dict:
    prompt = _demo_prompt(steps=steps, seed=seed)
    _, loader = _by_type(prompt, "LingBotExpertLoader")
    loader["inputs"].update(high_noise_expert=f"{MEDIUM}/high_noise_model_bnb_nf4",
                            low_noise_expert=f"{MEDIUM}/low_noise_model_bnb_nf4", memory_mode=memory_mode)
    return prompt


def _interrupted_run(server, seed: int) -> dict:
    """A medium run in swap mode, interrupted at sampler step 2; memory (RSS, or VRAM on a GPU) before, during and
    after (post /free)."""
    server.free()
    out = {"before": server.memory_in_use(), "mid": 0, "sent": False}
    samp_id, _ = _by_type(_demo_prompt(), "LingBotSampler")

    def on_progress(data):
        if data["node"] == samp_id and data["max"] == 40 and data["value"] >= 2 and not out["sent"]:
            out["mid"] = server.memory_in_use()
            out["sent"] = True
            server.post("/interrupt", {})

    res = server.run(_medium_prompt(steps=40, seed=seed, memory_mode="swap"), timeout=600, on_progress=on_progress)
    assert out["sent"], f"the sampler never reported progress: {res['progress'][-5:]} {res['error']}"
    assert res["end"] == "interrupted", res["error"]
    out["last"] = max(v for node, v, m in res["progress"] if node == samp_id and m == 40)
    assert out["last"] < 40, "the run finished instead of stopping"
    # Released: swap mode drops the expert in the sampler's finally; /free drops ComfyUI's caches too.
    server.free()
    out["after"] = _settled_memory(server, below=out["before"] + 0.25 * server.medium_bytes)
    out["seconds"] = res["seconds"]
    return out


def _settled_memory(server, below: float, seconds: float = 45.0) -> int:
    """Memory in use once it is under `below`, or after `seconds` (the caller's assert then says it was not given
    back). The unload takes its time on a busy box, and a /free that reached the worker as a prompt ended is only
    read after the next one: it is sent again every 10 s."""
    start = time.monotonic()
    resent = start
    used = server.memory_in_use()
    while used >= below and time.monotonic() - start < seconds:
        if time.monotonic() - resent >= 10:
            server.post("/free", {"unload_models": True, "free_memory": True})
            resent = time.monotonic()
        time.sleep(1)
        used = server.memory_in_use()
    return used


def test_interrupt_mid_sampling_keeps_server_healthy_and_frees_memory(server):
    # The first run pays one-time costs (kernels, thread pools, allocator arenas); the second one shows
    # whether an interrupted run leaves anything behind.
    runs = [_interrupted_run(server, seed) for seed in (7, 8)]
    mb = 1 / 2**20
    for i, r in enumerate(runs):
        print(f"\ninterrupted run {i + 1}: stopped at step {r['last']}/40 after {r['seconds']:.1f} s; "
              f"{'card VRAM in use' if comfy.GPU else 'server RSS'} "
              f"before {r['before'] * mb:.0f} MB, while sampling {r['mid'] * mb:.0f} MB, after {r['after'] * mb:.0f} MB "
              f"(expert file {server.medium_bytes * mb:.0f} MB)")
    r = runs[1]
    assert r["mid"] - r["before"] > 0.5 * server.medium_bytes, "the expert was never resident?"
    assert r["after"] - r["before"] < 0.25 * server.medium_bytes, "memory was not given back after the interrupt"
    assert server.get("/system_stats")["system"]
    again = server.run(_demo_prompt(steps=2, seed=9), timeout=300)
    assert again["end"] == "done", again["error"]


def test_free_model_and_node_cache_gives_the_ram_back(server):
    """ComfyUI's "Free model and node cache" (/free with both flags) after a run with both experts resident on the
    CPU: the server's RSS returns to where it was, under glibc's default heap behaviour (the pack trims the heap)."""
    if comfy.GPU:
        pytest.skip("with LINGBOT_COMFY_GPU=1 the experts live in VRAM (the interrupt test checks it)")

    def run(seed: int) -> None:
        res = server.run(_medium_prompt(steps=2, seed=seed, memory_mode="resident"), timeout=600)
        assert res["end"] == "done", res["error"]

    run(21)  # one-time costs (thread pools, kernels, allocator arenas) before measuring
    first = server.rss()
    server.free()
    # the baseline once that /free has given run 21's two experts back (it may be read only after a while)
    before = _settled_memory(server, below=first - server.medium_bytes)
    assert first - before > server.medium_bytes, "the first /free did not give the experts back"
    run(22)
    loaded = server.rss()
    server.free()
    after = _settled_memory(server, below=before + server.medium_bytes, seconds=30)  # the test runs without a GPU: RSS
    mb = 1 / 2**20
    print(f"\nresident run + free: RSS before {before * mb:.0f} MB, after the run {loaded * mb:.0f} MB, after /free "
          f"{after * mb:.0f} MB (two experts of {server.medium_bytes * mb:.0f} MB)")
    assert loaded - before > 1.5 * server.medium_bytes, "both experts should have been resident"
    # Without the trim the RSS stays at `loaded`. What remains is allocator and thread-pool noise (measured here:
    # -120 to +100 MB around `before` on a busy 2-core machine).
    assert loaded - after > 0.6 * (loaded - before), "the freed experts stayed in the server's RSS"
    assert after - before < server.medium_bytes, "the freed experts stayed in the server's RSS"


def test_resident_experts_stay_loaded_until_free_memory(server):
    server.free()

    def loads() -> int:
        return server.log().count("Requested to load ExpertContainer")

    def run(seed: int) -> None:
        prompt = _demo_prompt(steps=2, seed=seed)
        _, loader = _by_type(prompt, "LingBotExpertLoader")
        loader["inputs"]["memory_mode"] = "resident"
        res = server.run(prompt, timeout=300)
        assert res["end"] == "done", res["error"]

    start = len(server.log())
    n0 = loads()
    run(11)
    n1 = loads()
    run(12)
    n2 = loads()
    server.free(unload_models=True)
    run(13)
    n3 = loads()
    assert (n1 - n0, n2 - n1, n3 - n2) == (2, 0, 2), (
        "resident: load both once, reuse, reload only after /free\n" + server.log()[start:][-4000:])


def _probe_model_management(pack_dir: str, base_dir: str, cpu: bool = True) -> dict:
    """Runs INSIDE a ComfyUI interpreter (source shipped with inspect.getsource): real model_management."""
    import gc
    import importlib.util
    import sys

    import comfy.options

    comfy.options.enable_args_parsing()
    sys.argv = [sys.argv[0]] + (["--cpu"] if cpu else []) + ["--base-directory", base_dir]
    import comfy.model_management as mm
    import folder_paths  # noqa: F401  (ComfyUI imports both before any custom node; the pack checks for them)

    spec = importlib.util.spec_from_file_location("lingbot_pack_probe", pack_dir + "/__init__.py",
                                                  submodule_search_locations=[pack_dir])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["lingbot_pack_probe"] = pack
    spec.loader.exec_module(pack)
    nodes = pack.NODE_CLASS_MAPPINGS
    from lingbot_pack_probe.nodes.adapters import memory, patchers

    out: dict = {"version": __import__("comfyui_version").__version__}
    loader = nodes["LingBotExpertLoader"]()

    def pair(mode, blocks=-1):
        return loader.load("lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo/low_noise_model_bnb_nf4", "nf4", mode,
                           blocks)[0]

    def provider(experts):
        plan = memory.plan_for(experts, (17, 64, 112), "sequential", True, vram_free=1 << 60, ram_free=1 << 36)
        return memory.ComfyExpertProvider(experts, plan)

    experts = pair("swap")
    prov = provider(experts)
    m = prov.acquire("high")
    out["after_acquire"] = [experts.high.is_loaded(), patchers.is_registered(experts.high), type(m).__name__]
    del m
    prov.release("high")
    out["after_swap_release"] = [experts.high.is_loaded(), patchers.is_registered(experts.high)]
    prov.acquire("high")
    mm.free_memory(1e30, mm.get_torch_device())  # what /free and OOM recovery do
    out["after_free_memory"] = [experts.high.is_loaded(), patchers.is_registered(experts.high),
                                experts.high.weights.loads_from_disk]
    prov.acquire("high")
    lm = next(x for x in mm.current_loaded_models if x.model is experts.high)
    out["partial_unload_request"] = lm.model_unload(memory_to_free=1)  # True = unloaded whole
    out["after_partial"] = experts.high.is_loaded()
    mm.current_loaded_models.remove(lm)

    pinned = pair("swap_pinned")
    prov = provider(pinned)
    prov.acquire("low")
    prov.release("low")
    out["pinned_parked"] = pinned.low.weights.parked is not None
    prov.acquire("low")
    out["pinned_loads"] = [pinned.low.weights.loads_from_disk, pinned.low.weights.loads_from_ram]

    blocks = pair("block_swap", 1)
    prov = provider(blocks)
    prov.acquire("high")
    out["block_swap_loaded"] = [blocks.high.is_loaded(), blocks.high.weights.swapper is not None,
                                patchers.is_registered(blocks.high)]
    mm.unload_all_models()
    out["block_swap_unloaded"] = [blocks.high.is_loaded(), blocks.high.weights.swapper is None]

    resident = pair("resident")
    prov = provider(resident)
    prov.acquire("high")
    prov.release("high")
    prov.acquire("low")
    prov.release("low")
    out["resident_both"] = [resident.high.is_loaded(), resident.low.is_loaded()]
    n_models = len(mm.current_loaded_models)
    del resident, prov
    gc.collect()
    mm.cleanup_models()
    out["dropped_pair_forgotten"] = n_models - len(mm.current_loaded_models)

    stopped = []
    patchers.stop_all_text_encoders = lambda: stopped.append(1) or 1
    slot = patchers.TextEncoderSlot(123456, mm.get_torch_device(), mm.get_torch_device())
    mm.load_models_gpu([slot], force_full_load=True)
    out["slot_registered"] = patchers.is_registered(slot)
    mm.unload_all_models()
    out["slot_stopped_child"] = len(stopped)
    mm.unload_all_models()
    out["all_unloaded"] = [pinned.low.is_loaded(), experts.high.is_loaded(), len(mm.current_loaded_models)]
    return out


def test_patchers_against_real_model_management(server):
    """The ModelPatcher subclass under ComfyUI's own load/free/unload code, in a separate interpreter."""
    src = inspect.getsource(_probe_model_management)
    code = (src + f"\nimport json\nprint('PROBE' + json.dumps(_probe_model_management({str(REPO)!r}, "
            f"{str(server.base)!r}, cpu={not comfy.GPU})))\n")
    proc = subprocess.run([PYTHON, "-c", code], cwd=COMFYUI, capture_output=True, text=True, timeout=300)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("PROBE")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(line[5:])
    assert out["after_acquire"] == [True, True, "WanDiT"]
    assert out["after_swap_release"] == [False, False]
    assert out["after_free_memory"] == [False, False, 2]
    assert out["partial_unload_request"] is True and out["after_partial"] is False
    assert out["pinned_parked"] is True and out["pinned_loads"] == [1, 1]
    assert out["block_swap_loaded"] == [True, True, True] and out["block_swap_unloaded"] == [False, True]
    assert out["resident_both"] == [True, True]
    assert out["dropped_pair_forgotten"] == 2
    assert out["slot_registered"] is True and out["slot_stopped_child"] == 1
    assert out["all_unloaded"] == [False, False, 0]
    assert "memory leak" not in proc.stderr.lower(), proc.stderr[-3000:]


# ---- a first run (issue 27) ----------------------------------------------------------------------------------------
def _refused(server, prompt: dict) -> dict:
    """POST a prompt that must be refused; ComfyUI's answer (error + node_errors)."""
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as info:
        server.post("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert info.value.code == 400
    return json.loads(info.value.read())


def test_a_template_without_its_models_is_refused_with_the_packs_message(server):
    """Nothing runs (not even the camera preview, which needs no model) and the answer names each missing file,
    where it goes and where to get it, in the pack's words, not ComfyUI's "Value not in list"."""
    before = set(server.get("/history"))
    for name in ("Image to video, camera preset", "Act model steered with keys", FAST,
                 "Image to video with native KSamplers, camera preset"):
        answer = _refused(server, _api(name))
        assert answer["error"]["type"] == "prompt_outputs_failed_validation", answer
        errors = {node: e for node, e in answer["node_errors"].items()}
        kinds = {e["class_type"] for e in errors.values()}
        text = json.dumps(answer)
        ours = [err for e in errors.values() if e["class_type"] in NODE_CLASS_MAPPINGS for err in e["errors"]]
        assert ours and all(err["type"] == "custom_validation_failed" for err in ours), ours  # not "Value not in list"
        # (the fixture's base holds a random wan_2.1_vae.safetensors for the native graphs: the VAE is there)
        details = [err["details"] for e in errors.values() for err in e["errors"]]
        assert all("download switch" in d for d in details if "is not installed" in d), details
        if name == FAST:
            assert {"LingBotFastLoader", "LingBotTextEncode"} <= kinds, kinds
            assert "fast_model: lingbot-world-base-cam/lingbot_world_fast is not installed" in text
            assert "huggingface.co/robbyant/lingbot-world-fast" in text and "NF4 experts" not in text
        elif "native" in name:
            assert "LingBotModelLoader" in kinds, kinds
            assert "expert: lingbot-world-base-cam/high_noise_model is not installed" in text
            assert "huggingface.co/robbyant/lingbot-world-base-cam" in text
        else:
            assert {"LingBotExpertLoader", "LingBotTextEncode"} <= kinds, kinds
            model = "Act" if "Act" in name else "Cam"
            assert f"high_noise_expert, low_noise_expert: the LingBot-World Base ({model}) experts are not installed" \
                in text
            assert str(server.base / "models" / "lingbot_world") in text and "models_t5_umt5-xxl-enc-bf16.pth" in text
    assert set(server.get("/history")) == before  # nothing ran, not even part of a template
    assert "not running output node(s)" in server.log()


def test_previews_can_be_switched_off(server):
    res = server.run(_demo_prompt(steps=2, seed=7, previews=False), timeout=600)
    assert res["end"] == "done", res["error"]
    assert res["previews"] == 0


DEMOS = (DEMO, NATIVE_DEMO, "Tiny CPU demo, Fast model (random weights)", "Tiny CPU demo, Act model (random weights)")


def test_the_demo_templates_run_on_a_fresh_models_folder(tmp_path):
    """Right after installing the pack: nothing in models/ and no CLI run; each demo template builds what it needs
    into models/lingbot_world/ on first use and makes a video."""
    base = tmp_path / "fresh"
    comfy.prepare_base(base, demo=False)
    with comfy.running_server(base) as srv:
        assert not any((base / "models" / "lingbot_world").iterdir())
        for name in DEMOS:
            res = srv.run(_api(name), timeout=900)
            assert res["end"] == "done", (name, res["error"])
            save = next(k for k, v in _api(name).items() if v["class_type"] == "SaveVideo")
            video = res["history"]["outputs"][save]["images"][0]
            assert (base / "output" / video["subfolder"] / video["filename"]).stat().st_size > 1000, name
            print(f"\n{name}: {res['seconds']:.1f} s")
    built = sorted(p.name for p in (base / "models" / "lingbot_world").iterdir())
    assert built == ["lingbot-demo", "lingbot-demo-act"], built
    assert not (base / "models" / "vae").exists() or not any((base / "models" / "vae").iterdir())  # no real VAE
    assert "kernels-community" not in srv.log()

"""The native door inside ComfyUI's own code (in-process, no server): our MODEL through comfy.sample, the
conditions, LoRA loaders, the two-pass KSamplerAdvanced, EasyCache, TorchCompileModel, bad input.

Needs COMFYUI_PATH (and COMFYUI_PYTHON, the interpreter with ComfyUI's requirements and this pack's, e.g. its
venv). ComfyUI's modules import only in that interpreter, so `tests/native_probe.py` runs there as a child
process (cwd = the ComfyUI checkout, which is never modified) and prints its measurements as JSON; this file
prepares the models and asserts. Everything runs on the CPU in float32 on the tiny demo checkpoint (about 2
minutes on 2 cores). TorchCompileModel's wrapper runs with the "eager" backend by default; LINGBOT_TEST_INDUCTOR=1
runs the node itself with inductor (it compiled and matched on a CPU in about 3 minutes).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.comfyui


comfy = load_sibling("comfyui_server")
if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint, demo_configs

    base = tmp_path_factory.mktemp("native_base")
    for d in ("custom_nodes", "input", "output", "user", "temp"):
        (base / d).mkdir()
    build_demo_checkpoint(base / "models" / "lingbot_world" / "lingbot-demo")
    comfy.write_tiny_loras(base / "models" / "loras", demo_configs()[0])
    comfy.write_random_wan21_vae(base / "models" / "vae" / "wan_2.1_vae.safetensors")
    env = dict(os.environ, PYTHONPATH=comfy.COMFYUI)  # ComfyUI's modules; the pack is imported by path
    proc = subprocess.run([comfy.PYTHON, str(Path(__file__).with_name("native_probe.py")), str(comfy.REPO), str(base)],
                          cwd=comfy.COMFYUI, capture_output=True, text=True, timeout=900, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = json.loads(line[5:])
    out["stderr"] = proc.stderr
    print("\nnative probe:", {k: v for k, v in out.items() if k != "stderr"})
    return out


def test_model_is_a_wan21_flow_model_with_lingbot_shift(probe):
    assert probe["model_class"] == "LingBotWorldModel" and probe["shift"] == 10.0
    assert probe["keys_unloaded"] > 50  # key names for LoRA without loading anything
    assert probe["loaded_class"] == "WanDiT"


def test_apply_model_is_our_velocity_per_call(probe):
    assert probe["apply_model_err"] < 1e-5
    assert probe["no_camera_err"] < 1e-5  # no camera == the no-camera path
    assert probe["camera_effect"] > 1e-3 and probe["other_camera_effect"] > 1e-3  # the camera reaches the DiT


def test_conditions_become_lingbot_y_and_camera(probe):
    assert probe["concat_err"] < 1e-5  # WAN21's concat of concat_latent_image/concat_mask == LingBot's y
    assert probe["wan21_stats_equal"]
    assert probe["camera_cond"] == [1, 384, 3, 4, 6]


def test_first_frame_through_comfyui_vae_equals_ours(probe):
    """Same Wan 2.1 weights in ComfyUI's VAE and ours: the I2V conditioning y agrees to float32 rounding, from
    LingBot Image To Video (native VAE input) and from LingBot Image To Video (native) through WAN21's concat."""
    tol = 1e-4 * max(1.0, probe["native_vae_y_scale"])
    assert probe["native_vae_y_err"] < tol, probe["native_vae_y_err"]
    assert probe["native_i2v_node_y_err"] < tol, probe["native_i2v_node_y_err"]
    assert probe["native_i2v_node_camera"] == [1, 384, 2, 4, 6]
    assert "not the Wan 2.1 VAE" in probe["wan22_vae_refused"]


def test_native_sampling_calls_equal_our_sampler_velocity(probe):
    assert probe["sample_calls"] == 4 and probe["sample_finite"]
    assert probe["sample_velocity_rel_err"] < 1e-5
    assert probe["sigmas_shift10"][0] > probe["sigmas_shift3"][0] or probe["sigmas_shift10"][1] > probe["sigmas_shift3"][1]


def test_lora_native_and_ours_agree_and_swap_without_reload(probe):
    assert probe["native_lora_patches"] == probe["ours_lora_patches"] > 20
    assert probe["lora_native_vs_ours"] < 1e-5
    assert probe["lora_vs_reference"] < 1e-5
    assert probe["lora_effect"] > 1e-3 and probe["lora_removed_err"] < 1e-6
    assert probe["lora_reloads"] == 0
    assert probe["lora_strength0_same_object"] and probe["lora_on_low_only"]
    msg = probe["lora_other_model"]
    assert msg and "wan_1_3b_style.safetensors" in msg and "(4, 1536)" in msg and "another model" in msg


def test_two_pass_ksampler_advanced_easycache_compile(probe):
    assert probe["two_pass_finite"] and probe["two_pass_low_loaded"]
    assert probe["easycache_finite"] and "EasyCache - skipped" in probe["stderr"]
    c = probe["compile"]
    if not c["ok"]:
        pytest.skip(f"TorchCompileModel's wrapper ({c.get('backend', '?')}) cannot run here: {c['reason']}")
    assert c["err"] < 1e-3, c


def test_bad_input_is_one_clear_line(probe):
    assert "768 wide" in probe["wrong_width"] and "umT5-XXL" in probe["wrong_width"]
    assert "Wan-Fun" in probe["wan_fun_camera"]
    assert "not a LingBot-World model" in probe["bridge_refuses_other_model"]
    assert probe["bridge"] == [True, True, "nf4"]
    assert probe["unloaded"] == [False, False, 0]
    assert "memory leak" not in probe["stderr"].lower()

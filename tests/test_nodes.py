"""Node declarations, folder scanning, name resolution, camera nodes and workflow files, without ComfyUI.

ComfyUI's `folder_paths` is replaced by a small stand-in module (`fake_folder_paths`) whose folders live
in tmp_path; everything else here runs the pack's real code.
"""
from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders import model_folders as mf
from lingbot_world.loaders.vae_files import VAEFileError
from lingbot_world.loaders.vae_shapes import infer_vae_config, vae_config_for_file
from lingbot_world.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from lingbot_world.nodes.adapters import comfy_paths
from lingbot_world.nodes.adapters.video_setup import choose_size
from lingbot_world.nodes.camera import LingBotCameraFromFiles, LingBotCameraPreset
from lingbot_world.wan.vae.footprint import vae_work_bytes
from lingbot_world.nodes.adapters.payloads import CATEGORY, I2VCondition
from lingbot_world.nodes.sampler import plucker_for, text_contexts
from lingbot_world.nodes.save import LingBotSaveCamera
from lingbot_world.nodes.text import child_device
from lingbot_world.nodes.adapters.workflow_convert import FRONTEND_ONLY, WorkflowError, ui_to_api, v1_node_info
from lingbot_world.wan.vae.model import VAEConfig, WanVAE

REPO = Path(__file__).resolve().parents[1]
DEMO_WORKFLOW = "Tiny CPU demo (random weights)"
FAST_WORKFLOW = "Fast image to video, camera preset"
ACT_WORKFLOW = "Act model steered with keys"
CONTINUE_WORKFLOW = "Fast model steered with keys, continued"
WIDGET_KINDS = {"INT", "FLOAT", "STRING", "BOOLEAN"}
# Native nodes used by the example workflows, as ComfyUI 0.3.64's /object_info declares them.
NATIVE = {
    "LoadImage": {"input": {"required": {"image": [[], {"image_upload": True}]}},
                  "input_order": {"required": ["image"]}, "output": ["IMAGE", "MASK"], "output_name": ["IMAGE", "MASK"],
                  "display_name": "Load Image"},
    "PreviewImage": {"input": {"required": {"images": ["IMAGE"]}}, "input_order": {"required": ["images"]},
                     "output": [], "output_name": [], "display_name": "Preview Image"},
    "CreateVideo": {"input": {"required": {"images": ["IMAGE", {}], "fps": ["FLOAT", {"default": 30.0, "min": 1.0, "max": 120.0}]},
                              "optional": {"audio": ["AUDIO", {}]}},
                    "input_order": {"required": ["images", "fps"], "optional": ["audio"]},
                    "output": ["VIDEO"], "output_name": ["VIDEO"], "display_name": "Create Video"},
    "SaveVideo": {"input": {"required": {"video": ["VIDEO", {}], "filename_prefix": ["STRING", {"default": "video/ComfyUI"}],
                                         "format": ["COMBO", {"options": ["auto", "mp4"]}],
                                         "codec": ["COMBO", {"options": ["auto", "h264"]}]}},
                  "input_order": {"required": ["video", "filename_prefix", "format", "codec"]},
                  "output": [], "output_name": [], "display_name": "Save Video"},
    # the native Wan 2.2 pattern (combo lists trimmed to a few entries)
    "KSamplerAdvanced": {"input": {"required": {
        "model": ["MODEL"], "add_noise": [["enable", "disable"]],
        "noise_seed": ["INT", {"default": 0, "min": 0, "max": 18446744073709551615, "control_after_generate": True}],
        "steps": ["INT", {"default": 20, "min": 1, "max": 10000}],
        "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}],
        "sampler_name": [["euler", "uni_pc", "uni_pc_bh2"]], "scheduler": [["simple", "normal", "beta"]],
        "positive": ["CONDITIONING"], "negative": ["CONDITIONING"], "latent_image": ["LATENT"],
        "start_at_step": ["INT", {"default": 0, "min": 0, "max": 10000}],
        "end_at_step": ["INT", {"default": 10000, "min": 0, "max": 10000}],
        "return_with_leftover_noise": [["disable", "enable"]]}},
        "input_order": {"required": ["model", "add_noise", "noise_seed", "steps", "cfg", "sampler_name", "scheduler",
                                     "positive", "negative", "latent_image", "start_at_step", "end_at_step",
                                     "return_with_leftover_noise"]},
        "output": ["LATENT"], "output_name": ["LATENT"], "display_name": "KSampler (Advanced)"},
    "CLIPLoader": {"input": {"required": {"clip_name": [[]], "type": [["stable_diffusion", "sd3", "wan"]]},
                             "optional": {"device": [["default", "cpu"], {"advanced": True}]}},
                   "input_order": {"required": ["clip_name", "type"], "optional": ["device"]},
                   "output": ["CLIP"], "output_name": ["CLIP"], "display_name": "Load CLIP"},
    "CLIPTextEncode": {"input": {"required": {"text": ["STRING", {"multiline": True, "dynamicPrompts": True}],
                                              "clip": ["CLIP"]}},
                       "input_order": {"required": ["text", "clip"]}, "output": ["CONDITIONING"],
                       "output_name": ["CONDITIONING"], "display_name": "CLIP Text Encode (Prompt)"},
    "VAELoader": {"input": {"required": {"vae_name": [[]]}}, "input_order": {"required": ["vae_name"]},
                  "output": ["VAE"], "output_name": ["VAE"], "display_name": "Load VAE"},
    "VAEDecode": {"input": {"required": {"samples": ["LATENT"], "vae": ["VAE"]}},
                  "input_order": {"required": ["samples", "vae"]}, "output": ["IMAGE"], "output_name": ["IMAGE"],
                  "display_name": "VAE Decode"},
    "PreviewAny": {"input": {"required": {"source": ["*", {}]}}, "input_order": {"required": ["source"]},
                   "output": [], "output_name": [], "display_name": "Preview Any"},
    "ModelSamplingSD3": {"input": {"required": {"model": ["MODEL"],
                                                "shift": ["FLOAT", {"default": 3.0, "min": 0.0, "max": 100.0, "step": 0.01}]}},
                         "input_order": {"required": ["model", "shift"]}, "output": ["MODEL"], "output_name": ["MODEL"],
                         "display_name": "ModelSamplingSD3"},
}
FILE_COMBOS = {"LingBotExpertLoader.high_noise_expert", "LingBotExpertLoader.low_noise_expert",
               "LingBotFastLoader.fast_model", "LingBotTextEncode.text_encoder", "LingBotTextEncode.tokenizer",
               "LingBotVAELoader.vae_name", "LoadImage.image", "LingBotModelLoader.expert", "LingBotLoraLoader.lora_name",
               "CLIPLoader.clip_name", "VAELoader.vae_name", "LoraLoaderModelOnly.lora_name",
               "LingBotCameraFromFiles.trajectory", "LingBotActions.key_files"}
NATIVE_WORKFLOWS = ("Image to video with native KSamplers, camera preset", "Image to video with native KSamplers and LoRA",
                    "Tiny CPU demo with native KSamplers (random weights)")
PLAY_WORKFLOWS = ("Play the Fast model live with keys", "Tiny CPU demo, Play (random weights)",
                  "Play the v2 1.3B model live in real time")
V2_WORKFLOWS = ("V2 1.3B causal model, camera preset", "Tiny CPU demo, v2 1.3B model (random weights)")


# ---- a stand-in for ComfyUI's folder_paths ------------------------------------------------------------------
def make_folder_paths(base: Path) -> types.ModuleType:
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(base / "models")
    fp.folder_names_and_paths = {
        "diffusion_models": ([str(base / "models/unet"), str(base / "models/diffusion_models")], {".safetensors"}),
        "text_encoders": ([str(base / "models/text_encoders")], {".safetensors", ".pth"}),
        "vae": ([str(base / "models/vae")], {".safetensors", ".pth"}),
        "loras": ([str(base / "models/loras")], {".safetensors", ".pt"}),
    }

    def add_model_folder_path(name, path, is_default=False):
        if name in fp.folder_names_and_paths:
            paths = fp.folder_names_and_paths[name][0]
            if path not in paths:
                paths.insert(0, path) if is_default else paths.append(path)
        else:
            fp.folder_names_and_paths[name] = ([path], set())

    def get_folder_paths(name):
        return list(fp.folder_names_and_paths[name][0])

    def get_filename_list(name):
        out = []
        paths, exts = fp.folder_names_and_paths[name]
        for root in paths:
            for p in sorted(Path(root).rglob("*")) if Path(root).is_dir() else []:
                if p.is_file() and (not exts or p.suffix in exts):
                    out.append(p.relative_to(root).as_posix())
        return sorted(set(out))

    def get_full_path(name, filename):
        for root in fp.folder_names_and_paths.get(name, ([], None))[0]:
            p = Path(root) / filename
            if p.is_file():
                return str(p)
        return None

    def get_save_image_path(prefix, out_dir, w=0, h=0):
        full = Path(out_dir) / os.path.dirname(prefix)
        full.mkdir(parents=True, exist_ok=True)
        name = os.path.basename(prefix)
        counter = 1 + sum(1 for p in full.iterdir() if p.name.startswith(name + "_"))
        return str(full), name, counter, os.path.dirname(prefix), prefix

    fp.add_model_folder_path = add_model_folder_path
    fp.get_folder_paths = get_folder_paths
    fp.get_filename_list = get_filename_list
    fp.get_full_path = get_full_path
    fp.get_save_image_path = get_save_image_path
    fp.get_input_directory = lambda: str(base / "input")
    fp.get_output_directory = lambda: str(base / "output")
    fp.get_user_directory = lambda: str(base / "user")
    return fp


@pytest.fixture
def fake_folder_paths(tmp_path, monkeypatch):
    for d in ("models/diffusion_models", "models/text_encoders", "models/vae", "input", "output", "user"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    fp = make_folder_paths(tmp_path)
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    comfy_paths.register_model_folders()
    return tmp_path


def write_expert_dir(folder: Path, single_key: str = "patch_embedding_wancamctrl.weight") -> Path:
    """Just the layout the scan looks at (config.json + a safetensors whose header names a camera key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    save_file({single_key: torch.zeros(2)}, str(folder / "model.safetensors"))
    return folder


# ---- declarations ------------------------------------------------------------------------------------------
def test_every_node_is_declared_completely(fake_folder_paths):
    assert set(NODE_CLASS_MAPPINGS) == set(NODE_DISPLAY_NAME_MAPPINGS)
    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert name.startswith("LingBot") and NODE_DISPLAY_NAME_MAPPINGS[name].startswith("LingBot")
        assert cls.CATEGORY == CATEGORY and cls.DESCRIPTION
        assert callable(getattr(cls, cls.FUNCTION))
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS)
        spec = cls.INPUT_TYPES()
        assert set(spec) <= {"required", "optional", "hidden"}
        for section in ("required", "optional"):
            for inp, decl in spec.get(section, {}).items():
                assert isinstance(decl, tuple) and len(decl) == 2, f"{name}.{inp}"
                kind, opts = decl
                assert opts.get("tooltip"), f"{name}.{inp} has no tooltip"
                if isinstance(kind, list):
                    assert "default" not in opts or opts["default"] in kind, f"{name}.{inp} default not in the list"
                elif kind in ("INT", "FLOAT"):
                    assert opts["min"] <= opts["default"] <= opts["max"], f"{name}.{inp}"
                elif kind not in WIDGET_KINDS:
                    assert kind.isupper(), f"{name}.{inp}: link type {kind!r}"
    seed = NODE_CLASS_MAPPINGS["LingBotSampler"].INPUT_TYPES()["required"]["seed"]
    assert seed[0] == "INT" and seed[1]["control_after_generate"] is True and seed[1]["max"] == 2**64 - 1
    sampler = NODE_CLASS_MAPPINGS["LingBotSampler"].INPUT_TYPES()["required"]
    assert (sampler["steps"][1]["default"], sampler["shift"][1]["default"], sampler["boundary"][1]["default"],
            sampler["guide_high"][1]["default"], sampler["guide_low"][1]["default"]) == (70, 10.0, 0.947, 5.0, 5.0)


def test_input_types_survive_broken_folders(monkeypatch):
    fp = types.ModuleType("folder_paths")

    def broken(*a, **k):
        raise OSError("disk gone")

    fp.get_folder_paths = broken
    fp.get_filename_list = broken
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    for cls in NODE_CLASS_MAPPINGS.values():
        cls.INPUT_TYPES()  # must not raise: the node would vanish from ComfyUI's menu
    assert NODE_CLASS_MAPPINGS["LingBotExpertLoader"].INPUT_TYPES()["required"]["high_noise_expert"][0] == []
    assert NODE_CLASS_MAPPINGS["LingBotTextEncode"].INPUT_TYPES()["required"]["tokenizer"][0] == ["auto"]


# ---- folder scanning --------------------------------------------------------------------------------------
def test_scan_finds_expert_layouts_and_ignores_other_models(tmp_path):
    root = tmp_path / "lingbot_world"
    write_expert_dir(root / "repo" / "high_noise_model_bnb_nf4")
    write_expert_dir(root / "repo" / "low_noise_model_bnb_nf4")
    official = root / "official" / "high_noise_model"
    official.mkdir(parents=True)
    (official / "diffusion_pytorch_model.safetensors.index.json").write_text("{}")
    (official / "config.json").write_text("{}")
    other = tmp_path / "diffusion_models"
    other.mkdir()
    save_file({"patch_embedding_wancamctrl.weight": torch.zeros(1)}, str(other / "lingbot_high.safetensors"))
    save_file({"model.diffusion_model.input_blocks.0.weight": torch.zeros(1)}, str(other / "sdxl.safetensors"))
    (other / "broken.safetensors").write_bytes(b"\x00" * 5)
    (root / "repo" / ".git").mkdir()
    write_expert_dir(root / "repo" / ".git" / "hidden_expert")

    roots = [root, other]
    assert mf.scan_expert_dirs(roots) == ["official/high_noise_model", "repo/high_noise_model_bnb_nf4",
                                          "repo/low_noise_model_bnb_nf4"]
    assert mf.scan_expert_files(roots) == ["lingbot_high.safetensors"]  # model.safetensors inside dirs excluded
    assert mf.pick_default(mf.scan_expert_dirs(roots), "low") == "repo/low_noise_model_bnb_nf4"


def test_expert_loaders_default_to_the_cam_experts_beside_act_ones(fake_folder_paths):
    """The release's Act folder sorts first (base-act < base-cam); a new loader still starts on the Cam experts, the
    ones the camera workflows need. Only Act experts installed: those are the default."""
    import shutil

    root = fake_folder_paths / "models" / "lingbot_world"
    for repo in ("lingbot-world-base-act", "lingbot-world-base-cam"):
        for expert in ("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4"):
            write_expert_dir(root / repo / expert)

    def defaults() -> tuple:
        pair = NODE_CLASS_MAPPINGS["LingBotExpertLoader"].INPUT_TYPES()["required"]
        native = NODE_CLASS_MAPPINGS["LingBotModelLoader"].INPUT_TYPES()["required"]
        return pair["high_noise_expert"][1]["default"], pair["low_noise_expert"][1]["default"], native["expert"][1]["default"]

    assert defaults() == ("lingbot-world-base-cam/high_noise_model_bnb_nf4",
                          "lingbot-world-base-cam/low_noise_model_bnb_nf4", "lingbot-world-base-cam/high_noise_model_bnb_nf4")
    shutil.rmtree(root / "lingbot-world-base-cam")
    assert defaults() == ("lingbot-world-base-act/high_noise_model_bnb_nf4",
                          "lingbot-world-base-act/low_noise_model_bnb_nf4", "lingbot-world-base-act/high_noise_model_bnb_nf4")
    # a whole word of the path, not any substring: 'exact' and 'impact' are not Act folders
    assert mf.pick_default(["exact/high", "impact/high", "z-act/high"], "high", avoid=("act",)) == "exact/high"
    assert mf.pick_default(["a-act/high", "b/low"], "high", avoid=("act",)) == "a-act/high"
    assert mf.pick_default(["b/low"], "high", avoid=("act",)) is None


def test_scan_release_files_and_tokenizers(tmp_path):
    root = tmp_path / "lingbot_world"
    (root / "ckpt" / "google" / "umt5-xxl").mkdir(parents=True)
    (root / "ckpt" / "google" / "umt5-xxl" / "spiece.model").write_bytes(b"x")
    (root / "ckpt" / "tokenizer").mkdir()
    (root / "ckpt" / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / "ckpt" / "models_t5_umt5-xxl-enc-bf16.pth").write_bytes(b"x")
    (root / "ckpt" / "Wan2.1_VAE.pth").write_bytes(b"x")
    (root / "ckpt" / "notes.pth").write_bytes(b"x")
    assert mf.scan_t5_files([root]) == ["ckpt/models_t5_umt5-xxl-enc-bf16.pth"]
    assert mf.scan_vae_files([root]) == ["ckpt/Wan2.1_VAE.pth"]
    assert mf.scan_tokenizer_dirs([root]) == ["ckpt/google/umt5-xxl", "ckpt/tokenizer"]


def test_resolve_refuses_paths_outside_the_roots(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1")
    (tmp_path / "secret").write_bytes(b"1")
    assert mf.resolve_in_roots([tmp_path / "a"], "x.bin", want_dir=False) == tmp_path / "a" / "x.bin"
    assert mf.resolve_in_roots([tmp_path / "a"], "../secret") is None
    assert mf.resolve_in_roots([tmp_path / "a"], str(tmp_path / "secret")) is None
    assert mf.resolve_in_roots([tmp_path / "a"], "x.bin", want_dir=True) is None


def test_comfy_paths_lists_and_resolves_across_folders(fake_folder_paths):
    base = fake_folder_paths
    lingbot = base / "models" / "lingbot_world"
    assert lingbot.is_dir()  # registered and created
    write_expert_dir(lingbot / "ckpt" / "high_noise_model_bnb_nf4")
    write_expert_dir(base / "models" / "diffusion_models" / "low_noise_model_bnb_nf4")
    (lingbot / "ckpt" / "models_t5_umt5-xxl-enc-bf16.pth").write_bytes(b"x")
    (base / "models" / "text_encoders" / "umt5_xxl_fp16.safetensors").write_bytes(b"x")
    (base / "models" / "vae" / "wan_2.1_vae.safetensors").write_bytes(b"x")

    from lingbot_world.nodes.adapters.demo_models import demo_entries
    from lingbot_world.world.hub import release_names

    # the demo's entries (built on first use) and the releases the loaders download come last
    assert comfy_paths.list_experts() == ["ckpt/high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4",
                                          *demo_entries("experts"), *demo_entries("fast"), *release_names("experts"),
                                          *release_names("fast")]
    assert comfy_paths.list_text_encoders() == ["umt5_xxl_fp16.safetensors", "ckpt/models_t5_umt5-xxl-enc-bf16.pth",
                                                *demo_entries("text_encoder"), *release_names("text_encoder")]
    assert comfy_paths.list_vaes() == ["wan_2.1_vae.safetensors", *demo_entries("vae"), *release_names("vae")]
    assert comfy_paths.resolve_expert("low_noise_model_bnb_nf4") == base / "models/diffusion_models/low_noise_model_bnb_nf4"
    assert comfy_paths.resolve_text_encoder("ckpt/models_t5_umt5-xxl-enc-bf16.pth").parent == lingbot / "ckpt"
    assert comfy_paths.resolve_tokenizer("auto") is None
    with pytest.raises(comfy_paths.ModelFileNotFound, match="lingbot_world.*cahlen/lingbot-world-base-cam-nf4"):
        comfy_paths.resolve_expert("nope/high_noise_model_bnb_nf4", "high-noise expert")
    with pytest.raises(FileNotFoundError, match="text encoder 'missing.pth'.*models/text_encoders"):
        comfy_paths.resolve_text_encoder("missing.pth")
    with pytest.raises(FileNotFoundError, match="VAE 'x.pth'"):
        comfy_paths.resolve_vae("x.pth")
    assert comfy_paths.resolve_input_path("cams/00", "camera") == base / "input" / "cams" / "00"
    assert comfy_paths.resolve_input_path(str(base), "camera") == base
    with pytest.raises(ValueError, match="no path given"):
        comfy_paths.resolve_input_path("  ", "camera path")
    assert comfy_paths.text_cache_dir() == base / "user" / "lingbot_world" / "text_cache"


def test_registration_keeps_paths_from_extra_model_paths(fake_folder_paths, monkeypatch):
    fp = sys.modules["folder_paths"]
    fp.folder_names_and_paths["lingbot_world"] = (["/mnt/big/lingbot"], set())  # from a user's yaml
    comfy_paths.register_model_folders()
    assert comfy_paths.lingbot_roots() == ["/mnt/big/lingbot", str(fake_folder_paths / "models" / "lingbot_world")]


# ---- VAE config from shapes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [VAEConfig(), VAEConfig.tiny(), VAEConfig.tiny(dim=4, dim_mult=(1, 2, 4, 2),
                                                                              num_res_blocks=3,
                                                                              temporal_downsample=(True, False, True))])
def test_vae_config_is_read_from_shapes(cfg):
    with torch.device("meta"):
        vae = WanVAE(cfg)
    assert infer_vae_config({k: tuple(v.shape) for k, v in vae.state_dict().items()}) == cfg


def test_vae_config_from_files_and_wrong_files(tmp_path):
    cfg = VAEConfig.tiny()
    sd = WanVAE(cfg).state_dict()
    torch.save(sd, tmp_path / "vae.pth")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "vae.safetensors"))
    assert vae_config_for_file(tmp_path / "vae.pth") == cfg
    assert vae_config_for_file(tmp_path / "vae.safetensors") == cfg
    save_file({"blocks.0.self_attn.q.weight": torch.zeros(2, 2)}, str(tmp_path / "dit.safetensors"))
    with pytest.raises(VAEFileError, match="DiT"):
        vae_config_for_file(tmp_path / "dit.safetensors")
    with pytest.raises(FileNotFoundError):
        vae_config_for_file(tmp_path / "none.pth")


# ---- sizes, camera, text glue -------------------------------------------------------------------------------
def test_sizes_follow_the_reference_rule():
    assert choose_size("480p", 720, 1280, 0, 0) == (464, 832)
    assert choose_size("720p", 720, 1280, 0, 0) == (720, 1280)
    assert choose_size("custom", 720, 1280, 112, 64) == (64, 112)
    with pytest.raises(ValueError, match="multiples of 16"):
        choose_size("custom", 720, 1280, 100, 64)
    with pytest.raises(ValueError, match="size must be one of"):
        choose_size("1080p", 720, 1280, 0, 0)
    cfg = VAEConfig()
    assert vae_work_bytes(cfg, 464, 832, 81, True, 256) < vae_work_bytes(cfg, 464, 832, 81, False, 256)


def test_camera_preset_node_outputs_path_and_picture():
    cam, image = LingBotCameraPreset().make("dolly_in", "pan_right", 1.0, 17)
    assert cam.poses.shape == (17, 4, 4) and cam.intrinsics.shape == (17, 4)
    assert not cam.per_frame_intrinsics and cam.label == "dolly_in+pan_right"
    assert image.dim() == 4 and image.shape[0] == 1 and image.shape[-1] == 3 and 0 <= image.min() <= image.max() <= 1
    zoom, _ = LingBotCameraPreset().make("zoom_in", "none", 2.0, 9)
    assert zoom.per_frame_intrinsics and zoom.intrinsics[-1, 0] > zoom.intrinsics[0, 0]
    with pytest.raises(ValueError, match="unknown camera preset"):
        LingBotCameraPreset().make("spin", "none", 1.0, 9)


def test_image_to_video_rounds_frames_and_says_what_it_changed():
    from lingbot_world.nodes.adapters.video_setup import video_frames, video_summary

    assert video_frames(81, None) == (81, [])
    assert video_frames(80, None) == (77, ["80 frames is not of the form 4n+1: using 77."])
    assert video_frames(2, None) == (1, ["2 frames is not of the form 4n+1: using 1."])
    frames, notes = video_frames(100, 57)  # rounded to 97, then limited by a 57-pose camera
    assert frames == 57 and notes[0].endswith("using 97.") and "57 poses, enough for 57 frames" in notes[1]
    with pytest.raises(ValueError, match="at least 1"):
        video_frames(0, None)
    text = video_summary(832, 464, 77, ["80 frames is not of the form 4n+1: using 77."])
    assert text == ("832x464, 77 frames (4.8 s at 16 fps), 20 latent frames\n"
                    "80 frames is not of the form 4n+1: using 77.")


def test_camera_files_node_lists_reads_folders_and_paths(fake_folder_paths, examples_dir):
    import shutil

    from lingbot_world.nodes.camera import CUSTOM_PATH
    from lingbot_world.nodes.adapters.ui_hints import SHORT_LABELS, SHOW_IF, UPLOAD

    shutil.copytree(examples_dir / "00", fake_folder_paths / "input" / "cams" / "00")
    (fake_folder_paths / "input" / "cams" / "not_a_trajectory").mkdir()
    (fake_folder_paths / "input" / "cams" / "not_a_trajectory" / "poses.npy").write_bytes(b"")
    spec = LingBotCameraFromFiles.INPUT_TYPES()
    names, opts = spec["required"]["trajectory"]
    assert names == ["cams/00", CUSTOM_PATH] and opts["default"] == "cams/00"  # folders with BOTH files, then custom
    assert opts[SHORT_LABELS] is True and opts[UPLOAD] == "camera_npy"
    for name in ("path", "intrinsics_path"):  # the path widgets show only for "custom path"
        assert spec["optional"][name][1][SHOW_IF] == {"trajectory": [CUSTOM_PATH]}
    node = LingBotCameraFromFiles()
    cam, image = node.load("cams/00", "first_frame")
    assert cam.poses.shape == (961, 4, 4) and not cam.per_frame_intrinsics and image.shape[0] == 1
    assert cam.label == "00"
    cam2, _ = node.load(CUSTOM_PATH, "per_frame", "cams/00/poses.npy")  # intrinsics.npy beside it
    np.testing.assert_array_equal(cam2.poses, cam.poses)
    assert cam2.per_frame_intrinsics
    cam3, _ = node.load(CUSTOM_PATH, "first_frame", str(examples_dir / "00" / "poses.npy"),
                        str(examples_dir / "00" / "intrinsics.npy"))
    np.testing.assert_array_equal(cam3.intrinsics, cam.intrinsics)
    assert "cams/00" in node.IS_CHANGED("cams/00")
    assert node.IS_CHANGED("cams/gone").startswith("missing: ")  # never raises; load() reports it
    with pytest.raises(FileNotFoundError, match="camera trajectory folder 'cams/gone' was not found"):
        node.load("cams/gone", "first_frame")
    with pytest.raises(FileNotFoundError, match="camera path not found"):
        node.load(CUSTOM_PATH, "first_frame", "cams/missing")
    with pytest.raises(ValueError, match="no path given"):
        node.load(CUSTOM_PATH, "first_frame", "")


def test_camera_files_node_defaults_to_the_installed_example(fake_folder_paths):
    from lingbot_world.nodes.camera import CUSTOM_PATH
    from lingbot_world.nodes.adapters.example_inputs import (ACT_EXAMPLE, EXAMPLE_TRAJECTORY, FAST_EXAMPLE,
                                                             install_example_inputs)

    names, opts = LingBotCameraFromFiles.INPUT_TYPES()["required"]["trajectory"]
    assert names == [CUSTOM_PATH] and opts["default"] == CUSTOM_PATH  # nothing under input/ yet
    install_example_inputs(fake_folder_paths / "input")
    names, opts = LingBotCameraFromFiles.INPUT_TYPES()["required"]["trajectory"]
    # the camera example first (the default), then the Fast and Act examples (05 also holds key files)
    assert names == [EXAMPLE_TRAJECTORY, FAST_EXAMPLE, ACT_EXAMPLE, CUSTOM_PATH]
    assert opts["default"] == EXAMPLE_TRAJECTORY
    cam, _ = LingBotCameraFromFiles().load(EXAMPLE_TRAJECTORY, "first_frame")
    assert cam.num_frames == 961


def test_save_camera_writes_an_action_path_folder(fake_folder_paths):
    cam, _ = LingBotCameraPreset().make("orbit_left", "none", 1.0, 9)
    out = LingBotSaveCamera().save(cam, "lingbot_camera/trajectory")
    folder = Path(out["result"][0])
    assert folder.parent == fake_folder_paths / "output" / "lingbot_camera"
    np.testing.assert_array_equal(np.load(folder / "poses.npy"), cam.poses)
    np.testing.assert_array_equal(np.load(folder / "intrinsics.npy"), cam.intrinsics)
    again, _ = LingBotCameraFromFiles().load("(custom path)", "first_frame", str(folder))
    np.testing.assert_array_equal(again.poses, cam.poses)
    second = Path(LingBotSaveCamera().save(cam, "lingbot_camera/trajectory")["result"][0])
    assert second != folder  # a new numbered folder, never overwriting


def test_camera_must_cover_the_video():
    cond = I2VCondition(torch.zeros(1, 20, 5, 4, 6), 32, 48, 17, (0.0,) * 16, (1.0,) * 16)
    cam, _ = LingBotCameraPreset().make("pan_left", "none", 1.0, 9)
    with pytest.raises(ValueError, match="covers 9 frames but the video has 17"):
        plucker_for(cam, cond)
    long_cam, _ = LingBotCameraPreset().make("pan_left", "none", 1.0, 33)
    assert tuple(plucker_for(long_cam, cond).shape) == (1, 384, 5, 4, 6)


def test_text_context_width_must_match_the_experts():
    from lingbot_world.nodes.adapters.payloads import TextEmbeds

    experts = types.SimpleNamespace(text_dim=32, text_len=512)
    ok = TextEmbeds(torch.ones(7, 32), torch.ones(3, 32), "p", "n")
    pos, neg = text_contexts(ok, experts)
    assert pos.shape == (1, 512, 32) and pos[0, 7:].abs().sum() == 0 and neg[0, :3].sum() == 3 * 32
    with pytest.raises(ValueError, match="text encoder does not belong to these experts"):
        text_contexts(TextEmbeds(torch.ones(7, 4096), torch.ones(3, 4096), "p", "n"), experts)


def test_text_device_choice():
    assert child_device("auto", cpu_mode=True) == "cpu"
    assert child_device("auto", cpu_mode=False) == "auto"
    assert child_device("cuda", cpu_mode=True) == "cuda"
    with pytest.raises(ValueError):
        child_device("tpu", cpu_mode=False)


# ---- example workflows ----------------------------------------------------------------------------------------
def _object_info() -> dict:
    info = {name: v1_node_info(name, cls, NODE_DISPLAY_NAME_MAPPINGS[name]) for name, cls in NODE_CLASS_MAPPINGS.items()}
    info.update(NATIVE)
    return info


def test_example_workflows_match_the_nodes_and_their_api_copies(fake_folder_paths):
    info = _object_info()
    files = sorted((REPO / "example_workflows").glob("*.json"))
    assert {p.stem for p in files} == {ACT_WORKFLOW, FAST_WORKFLOW, CONTINUE_WORKFLOW, "Image to video, camera preset",
                                       "Image to video, recorded trajectory", "Tiny CPU demo (random weights)",
                                       "Tiny CPU demo, Fast model (random weights)",
                                       "Tiny CPU demo, Act model (random weights)", *NATIVE_WORKFLOWS, *PLAY_WORKFLOWS,
                                       *V2_WORKFLOWS}
    for path in files:
        ui = json.loads(path.read_text())
        assert ui["version"] == 0.4 and ui["last_node_id"] == max(n["id"] for n in ui["nodes"])
        notes = [n for n in ui["nodes"] if n["type"] in FRONTEND_ONLY]
        text = " ".join(v for n in notes for v in n["widgets_values"])
        demo = "demo" in path.stem.lower()
        for needed in ("models/lingbot_world", "lingbot-demo" if demo else "lingbot-world"):
            assert needed in text, f"{path.name}: the note does not mention {needed}"
        if demo:  # built on first use: no pip, no CLI
            import re

            assert not re.search(r"\bpip\b", text) and "--demo" not in text and "built" in text, path.name
        api = ui_to_api(ui, info, unchecked=FILE_COMBOS)
        expected = json.loads((REPO / "tests" / "workflows" / f"{path.stem}.api.json").read_text())
        assert api == expected, f"tests/workflows/{path.stem}.api.json is out of date with {path.name}"
        chain = [v["class_type"] for v in api.values()]
        if path.stem in NATIVE_WORKFLOWS:  # the native Wan 2.2 pattern, in the template's four groups
            assert chain.count("KSamplerAdvanced") == 2 and chain.count("LingBotModelLoader") == 2
            kinds = ("LoadImage", "LingBotImageToVideoNative", "LingBotCameraPreset",
                     "LingBotVAEDecode" if "demo" in path.stem.lower() else "VAEDecode", "CreateVideo", "SaveVideo")
            assert [g["title"] for g in ui["groups"]] == ["Step 1 – Load models", "Step 2 – Image + camera",
                                                          "Step 3 – Prompt", "Step 4 – Sample + save"]
            _check_two_pass(api)
        elif path.stem in PLAY_WORKFLOWS:  # the live player, the keys it played shown on Preview Any
            kinds = ("LoadImage", "LingBotFastLoader", "LingBotImageToVideo", "LingBotPlay", "PreviewAny")
        else:
            fast = "LingBotFastSampler" in chain
            kinds = ("LoadImage", "LingBotVAEDecode", "CreateVideo", "SaveVideo",
                     "LingBotFastSampler" if fast else "LingBotSampler")
            if not fast:  # the LingBot-Sampler templates have the native ones' four groups
                assert [g["title"] for g in ui["groups"]] == ["Step 1 – Load models", "Step 2 – Image + camera",
                                                              "Step 3 – Prompt", "Step 4 – Sample + save"], path.name
        for kind in kinds:
            assert kind in chain
    walk = _api_copy(CONTINUE_WORKFLOW)  # Sampler (keys) -> Continue (keys) -> Continue (keys)
    steps = {k: v for k, v in walk.items() if v["class_type"] in ("LingBotFastSampler", "LingBotFastContinue")}
    assert sorted(v["class_type"] for v in steps.values()) == ["LingBotFastContinue"] * 2 + ["LingBotFastSampler"]
    for v in steps.values():
        assert walk[v["inputs"]["camera"][0]]["class_type"] == "LingBotActions"
        if v["class_type"] == "LingBotFastContinue":
            assert v["inputs"]["state"][1] == (1 if walk[v["inputs"]["state"][0]]["class_type"] == "LingBotFastSampler" else 2)
    # the LoRA template's loaders point at a placeholder file: bypassed until the user picks a LoRA
    lora_ui = json.loads((REPO / "example_workflows" / "Image to video with native KSamplers and LoRA.json").read_text())
    assert [n["mode"] for n in lora_ui["nodes"] if n["type"] == "LingBotLoraLoader"] == [4, 4]
    assert "LingBotLoraLoader" not in [v["class_type"] for v in _api_copy("Image to video with native KSamplers and "
                                                                             "LoRA").values()]


def _api_copy(stem: str) -> dict:
    return json.loads((REPO / "tests" / "workflows" / f"{stem}.api.json").read_text())


def _check_two_pass(api: dict) -> None:
    """High-noise expert from step 0 with noise and leftover noise, low-noise expert after it on its latent."""
    ks = [(k, v["inputs"]) for k, v in api.items() if v["class_type"] == "KSamplerAdvanced"]
    (k1, a), (k2, b) = sorted(ks, key=lambda kv: kv[1]["start_at_step"])
    assert (a["add_noise"], a["start_at_step"], a["return_with_leftover_noise"]) == ("enable", 0, "enable")
    assert (b["add_noise"], b["return_with_leftover_noise"]) == ("disable", "disable")
    assert b["start_at_step"] == a["end_at_step"] and b["latent_image"] == [k1, 0] and a["steps"] == b["steps"]

    def expert_of(inputs):
        src = api[inputs["model"][0]]
        while src["class_type"] != "LingBotModelLoader":
            src = api[src["inputs"]["model"][0]]
        return src["inputs"]["expert"]

    assert "high_noise" in expert_of(a) and "low_noise" in expert_of(b)


def test_every_example_workflow_has_a_title_and_a_thumbnail():
    """The template browser shows a custom node's workflow file name as its title and <name>.jpg as its picture."""
    from PIL import Image

    for path in sorted((REPO / "example_workflows").glob("*.json")):
        assert "_" not in path.stem and path.stem[0].isupper(), f"{path.name}: not a title for the template browser"
        assert not set(path.stem) & set('<>:"/\\|?*'), f"{path.name}: not a portable file name"
        with Image.open(path.with_suffix(".jpg")) as im:
            assert im.format == "JPEG" and im.size == (512, 512)


def test_thumbnails_are_drawn_from_what_the_workflow_uses():
    from PIL import Image

    from lingbot_world.tools.template_thumbnails import camera_picture, chained_actions, first_frame, thumbnail

    for stem in ("Image to video, camera preset", "Image to video, recorded trajectory", FAST_WORKFLOW, ACT_WORKFLOW,
                 CONTINUE_WORKFLOW):
        ui = json.loads((REPO / "example_workflows" / f"{stem}.json").read_text())
        assert min(first_frame(ui).size) >= 720 and camera_picture(ui) is not None  # the example's own image
        im = thumbnail(ui)
        assert im.size == (512, 512) and max(hi - lo for lo, hi in im.getextrema()) > 100
    # a Fast Continue chain is drawn as one walk: its parts' keys in chain order (not the nodes' order in the file)
    walk = json.loads((REPO / "example_workflows" / f"{CONTINUE_WORKFLOW}.json").read_text())
    walk["nodes"].reverse()
    assert chained_actions(walk) == ["w-10,l-10", "a-12,iw-12", "d-12"]
    assert chained_actions(json.loads((REPO / "example_workflows" / f"{FAST_WORKFLOW}.json").read_text())) == []
    demo = json.loads((REPO / "example_workflows" / f"{DEMO_WORKFLOW}.json").read_text())
    frames = [Image.new("RGB", (112, 64), (40 * i, 90, 200 - 40 * i)) for i in range(4)]
    assert thumbnail(demo, demo=frames).size == (512, 512)  # the demo's frames come from a real CLI run in the tool


def test_converter_rejects_inconsistent_workflows():
    info = _object_info()
    ui = json.loads((REPO / "example_workflows" / f"{DEMO_WORKFLOW}.json").read_text())
    sampler = next(n for n in ui["nodes"] if n["type"] == "LingBotSampler")
    sampler["widgets_values"] = sampler["widgets_values"][:-1]
    with pytest.raises(WorkflowError, match="LingBotSampler"):
        ui_to_api(ui, info, unchecked=FILE_COMBOS)
    ui = json.loads((REPO / "example_workflows" / f"{DEMO_WORKFLOW}.json").read_text())
    loader = next(n for n in ui["nodes"] if n["type"] == "LingBotExpertLoader")
    loader["widgets_values"][3] = "everything_everywhere"
    with pytest.raises(WorkflowError, match="memory_mode"):
        ui_to_api(ui, info, unchecked=FILE_COMBOS)
    ui["nodes"].append({"id": 99, "type": "SomeMissingNode", "widgets_values": []})
    with pytest.raises(WorkflowError, match="not installed"):
        ui_to_api(ui, {k: v for k, v in info.items()}, unchecked=FILE_COMBOS | {"LingBotExpertLoader.memory_mode"})

    # a seed whose control_after_generate is False has no control widget in the frontend: no "fixed" after it
    play = json.loads((REPO / "example_workflows" / "Tiny CPU demo, Play (random weights).json").read_text())
    node = next(n for n in play["nodes"] if n["type"] == "LingBotPlay")
    assert info["LingBotPlay"]["input"]["required"]["seed"][1]["control_after_generate"] is False
    assert ui_to_api(play, info, unchecked=FILE_COMBOS)[str(node["id"])]["inputs"]["noise_source"] == "cpu"
    node["widgets_values"].insert(1, "fixed")  # the Play templates' first version: the frontend sent 'fixed'
    with pytest.raises(WorkflowError, match="LingBotPlay"):
        ui_to_api(play, info, unchecked=FILE_COMBOS)


# ---- templates a newcomer can run (issue 27) ---------------------------------------------------------------------
def test_templates_are_up_to_date_with_the_template_tool():
    from lingbot_world.tools.update_templates import main

    assert main(["--check"]) == 0, "run: python -m lingbot_world.tools.update_templates"


def test_every_template_model_is_downloadable_from_the_graph():
    """Each LingBot loader's choice is a release layout the loader downloads itself (world/hub.py: its part of the
    model's hub repository) and the Missing Models dialog lists only what it can download: the core loaders'
    repackaged .safetensors, with where they go and an https link; no folder, .json or .pth entry (issue 49)."""
    from lingbot_world.nodes.adapters.example_inputs import shipped_files
    from lingbot_world.world.hub import part_for

    pack_widgets = {"LingBotExpertLoader": (0, 1), "LingBotModelLoader": (0,), "LingBotFastLoader": (0,),
                    "LingBotTextEncode": (0,), "LingBotVAELoader": (0,)}
    for path in sorted((REPO / "example_workflows").glob("*.json")):
        ui = json.loads(path.read_text())
        assert "models" not in ui, path.name  # the dialog lists the workflow's own entries too
        for node in ui["nodes"]:
            values = node.get("widgets_values") or []
            if node["type"] == "LoadImage":  # Load Image lists only the top of input/
                assert "/" not in values[0] and values[0] in shipped_files(), (path.name, values[0])
            models = node.get("properties", {}).get("models", [])
            for m in models:
                assert m["url"].startswith("https://huggingface.co/") and m["name"].endswith(".safetensors"), m
                assert m["directory"] in ("text_encoders", "vae") and m["name"] == values[0], m
            if node["type"] in ("CLIPLoader", "VAELoader"):
                assert [m["name"] for m in models] == [values[0]], (path.name, node["type"])
            if node.get("mode", 0) == 4 or "demo" in path.stem.lower():
                continue
            for i in pack_widgets.get(node["type"], ()):
                assert part_for(values[i]) is not None, (path.name, values[i])
                assert not models, (path.name, node["type"], models)


def test_every_template_has_a_one_line_card_description_and_the_first_one_opens_first():
    """web/lingbot_templates.js: one line per template for the browser's cards (a frontend that shows a description
    repeated the title), the README's first template named as the one listed first (issue 49; the browser itself:
    tests/test_comfyui_frontend.py)."""
    import re

    js = (REPO / "web" / "lingbot_templates.js").read_text()
    block = js[js.index("export const DESCRIPTIONS = {"):]
    block = block[:block.index("\n};")]
    described = dict(re.findall(r'^  "([^"]+)": "([^"]+)",$', block, re.M))
    templates = {p.stem for p in (REPO / "example_workflows").glob("*.json")}
    assert set(described) == templates, sorted(set(described) ^ templates)
    for name, text in described.items():
        assert text != name and len(text) <= 100 and text.endswith("."), (name, text)
    first = re.search(r'^export const FIRST = "([^"]+)";$', js, re.M).group(1)
    readme = " ".join((REPO / "README.md").read_text().split())  # its lines rewrapped
    assert first in templates and f"start with *{first}*" in readme


def test_nothing_sits_under_a_fast_sampler_so_its_previews_stay_in_view():
    """The Fast Sampler's previews grow the node downwards: no node below it in its column (issue 49)."""
    for path in sorted((REPO / "example_workflows").glob("*.json")):
        ui = json.loads(path.read_text())
        for sampler in (n for n in ui["nodes"] if n["type"] == "LingBotFastSampler"):
            x0, x1 = sampler["pos"][0], sampler["pos"][0] + sampler["size"][0]
            below = [n["type"] for n in ui["nodes"] if n is not sampler and n["pos"][1] > sampler["pos"][1]
                     and n["pos"][0] < x1 and n["pos"][0] + n["size"][0] > x0]
            assert below == [] and sampler["size"][1] >= 640, (path.name, below)


def test_the_link_checker_catches_a_link_that_enters_the_wrong_slot():
    info = _object_info()
    ui = json.loads((REPO / "example_workflows" / f"{ACT_WORKFLOW}.json").read_text())
    ui_to_api(ui, info, unchecked=FILE_COMBOS)
    link = next(l for l in ui["links"] if l[5] == "LINGBOT_ACT")
    link[4] -= 1  # what the Act template shipped with: the act link pointing at the camera slot
    with pytest.raises(WorkflowError, match="enters input slot"):
        ui_to_api(ui, info, unchecked=FILE_COMBOS)


def test_groups_of_the_lingbot_sampler_templates_do_not_overlap_and_hold_their_nodes():
    for path in sorted((REPO / "example_workflows").glob("*.json")):
        ui = json.loads(path.read_text())
        groups = ui.get("groups") or []
        boxes = [g["bounding"] for g in groups]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                apart = a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]
                assert apart, (path.name, a, b)
        if "LingBotSampler" not in [n["type"] for n in ui["nodes"]]:
            continue
        sampler = next(n for n in ui["nodes"] if n["type"] == "LingBotSampler")
        below = [n for n in ui["nodes"] if n is not sampler and n["pos"][1] > sampler["pos"][1]
                 and n["pos"][0] < sampler["pos"][0] + sampler["size"][0] and n["pos"][0] + n["size"][0] > sampler["pos"][0]]
        assert not below, f"{path.name}: nodes under the sampler, where its preview grows"

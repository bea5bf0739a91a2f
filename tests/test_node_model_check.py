"""Model choices are checked when a prompt is queued (VALIDATE_INPUTS), with the pack's own message; the tiny demo is
listed before it exists and built on first use; errors reach ComfyUI in node words under plain type names."""
from __future__ import annotations

import logging
import sys

import pytest

from lingbot_world.nodes.adapters import comfy_paths, demo_models, model_check, node_errors
from lingbot_world.nodes.expert import LingBotExpertLoader
from lingbot_world.nodes.lora import LingBotLoraLoader
from lingbot_world.nodes.model import LingBotModelLoader
from lingbot_world.nodes.text import LingBotTextEncode
from lingbot_world.nodes.vae import LingBotVAELoader

from tests.conftest import load_sibling


make_folder_paths = load_sibling("test_nodes").make_folder_paths  # ComfyUI's folder_paths stand-in, as test_nodes.py


@pytest.fixture
def comfy_folders(tmp_path, monkeypatch):
    for d in ("models/diffusion_models", "models/text_encoders", "models/vae", "models/loras", "input", "output",
              "user"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    monkeypatch.setitem(sys.modules, "folder_paths", make_folder_paths(tmp_path))
    comfy_paths.register_model_folders()
    return tmp_path


@pytest.fixture(scope="module")
def built_demo(tmp_path_factory):
    """The camera demo folder, built once for the module (a few seconds)."""
    from lingbot_world.world.files import WorldFiles

    root = tmp_path_factory.mktemp("demo") / "lingbot-demo"
    WorldFiles.demo(root)
    return root


def test_a_missing_expert_is_refused_at_queue_time_with_where_and_what(comfy_folders):
    msg = LingBotExpertLoader.VALIDATE_INPUTS("lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4",
                                              "lingbot-world-base-cam-nf4/low_noise_model_bnb_nf4")
    assert isinstance(msg, str)
    assert "high_noise_expert 'lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4' was not found" in msg
    assert str(comfy_folders / "models" / "lingbot_world") in msg  # where it was looked for
    assert "FOLDER" in msg and "config.json" in msg and "model.safetensors" in msg  # an expert is a folder: its files
    assert "huggingface.co/cahlen/lingbot-world-base-cam-nf4" in msg and "ComfyUI/models/lingbot_world/" in msg
    assert "--" not in msg
    assert "expert 'x' was not found" in LingBotModelLoader.VALIDATE_INPUTS("x")


def test_missing_files_name_their_widget_folder_and_download(comfy_folders):
    te = LingBotTextEncode.VALIDATE_INPUTS("umt5_xxl_fp16.safetensors", "auto")
    assert te.startswith("text_encoder: text encoder 'umt5_xxl_fp16.safetensors' was not found")
    assert "ComfyUI/models/text_encoders/" in te and "huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged" in te
    vae = LingBotVAELoader.VALIDATE_INPUTS("wan_2.1_vae.safetensors")
    assert vae.startswith("vae_name: VAE 'wan_2.1_vae.safetensors' was not found") and "ComfyUI/models/vae/" in vae
    lora = LingBotLoraLoader.VALIDATE_INPUTS("style.safetensors")
    assert lora.startswith("lora_name: LoRA 'style.safetensors' was not found") and "bypass" in lora
    # linked widgets (None) are checked when the node runs
    assert LingBotTextEncode.VALIDATE_INPUTS(None, None) is True


def test_demo_entries_are_listed_and_valid_before_they_exist(comfy_folders):
    experts = comfy_paths.list_experts()
    for name in ("lingbot-demo/high_noise_model_bnb_nf4", "lingbot-demo-act/low_noise_model_bnb_nf4",
                 "lingbot-demo/lingbot_world_fast_bnb_nf4"):
        assert name in experts
    assert "lingbot-demo/Wan2.1_VAE.pth" in comfy_paths.list_vaes()
    assert "lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth" in comfy_paths.list_text_encoders()
    assert LingBotExpertLoader.VALIDATE_INPUTS("lingbot-demo/high_noise_model_bnb_nf4",
                                               "lingbot-demo/low_noise_model_bnb_nf4") is True
    assert LingBotVAELoader.VALIDATE_INPUTS("lingbot-demo/Wan2.1_VAE.pth") is True
    assert not (comfy_folders / "models" / "lingbot_world" / "lingbot-demo").exists()  # validation builds nothing
    # a real install is the default; the demo only where nothing else is there
    defaults = LingBotExpertLoader.INPUT_TYPES()["required"]
    assert defaults["high_noise_expert"][1]["default"] == "lingbot-demo/high_noise_model_bnb_nf4"


def test_a_demo_entry_is_built_on_first_use(comfy_folders, monkeypatch):
    calls = []
    monkeypatch.setattr("lingbot_world.loaders.demo_checkpoint.build_demo_checkpoint",
                        lambda root, control="camera", seed=0: calls.append((root, control)) or
                        (root / "high_noise_model_bnb_nf4").mkdir(parents=True))
    path = comfy_paths.resolve_expert("lingbot-demo-act/high_noise_model_bnb_nf4")
    root = comfy_folders / "models" / "lingbot_world" / "lingbot-demo-act"
    assert path == root / "high_noise_model_bnb_nf4" and calls == [(root, "act")]
    assert demo_models.ensure_demo("lingbot-demo-act/high_noise_model_bnb_nf4", [str(root.parent)]) == path
    assert calls == [(root, "act")]  # built once
    assert demo_models.ensure_demo("elsewhere/high_noise_model_bnb_nf4", [str(root.parent)]) is None


def test_a_wrong_kind_of_model_is_refused_in_node_words(comfy_folders, built_demo):
    import shutil

    shutil.copytree(built_demo, comfy_folders / "models" / "lingbot_world" / "mine")
    msg = LingBotExpertLoader.VALIDATE_INPUTS("mine/lingbot_world_fast_bnb_nf4", "mine/low_noise_model_bnb_nf4")
    assert msg.startswith("high_noise_expert: ") and "Fast (causal) model" in msg
    assert "LingBot Fast Model Loader" in msg and "--model" not in msg
    assert LingBotExpertLoader.VALIDATE_INPUTS("mine/high_noise_model_bnb_nf4", "mine/low_noise_model_bnb_nf4") is True
    same = LingBotExpertLoader.VALIDATE_INPUTS("mine/high_noise_model_bnb_nf4", "mine/high_noise_model_bnb_nf4")
    assert "both 'mine/high_noise_model_bnb_nf4'" in same
    assert model_check.expert("fast_model", "mine/high_noise_model_bnb_nf4", want="fast").startswith("fast_model: ")


def test_swapped_experts_get_a_warning_naming_both_folders():
    note = model_check.swapped_experts_note("m/low_noise_model_bnb_nf4", "m/high_noise_model_bnb_nf4")
    assert "swapped" in note and "m/low_noise_model_bnb_nf4" in note and "m/high_noise_model_bnb_nf4" in note
    one = model_check.swapped_experts_note("m/low_noise_model", "m/other")
    assert "m/low_noise_model" in one and "m/other" in one and "high_noise_expert" in one
    assert model_check.swapped_experts_note("m/high_noise_model", "m/low_noise_model") is None
    assert model_check.swapped_experts_note("a/expert1", "a/expert2") is None


def test_errors_reach_comfyui_in_node_words_under_plain_types():
    from lingbot_world.loaders.expert_format import ExpertLoadError
    from lingbot_world.nodes.adapters.comfy_paths import ModelFileNotFound

    plain = node_errors.plain_error(ExpertLoadError("x is the Fast model: run it with --model fast"))
    assert isinstance(plain, ExpertLoadError) and str(plain) == "x is the Fast model: load it with LingBot Fast Model Loader"
    # what ComfyUI prints as the type: module + qualname (for a custom node the module is its file path)
    assert f"{type(plain).__module__}.{type(plain).__qualname__}" == "LingBot-World.ExpertLoadError"
    gone = node_errors.plain_error(ModelFileNotFound("gone"))
    assert isinstance(gone, FileNotFoundError) and type(gone).__module__ == "LingBot-World"
    assert type(node_errors.plain_error(ModelFileNotFound("again"))) is type(gone)  # one shown class per class
    assert node_errors.in_node_words("use --camera-cache host or auto; --compute bf16") == \
        "use camera_cache host or auto; compute bf16"
    assert "480p or 720p" in node_errors.in_node_words("frame size 60x100 must be ...; use target_size() to pick one")
    keep = ValueError("fine as it is")
    assert node_errors.plain_error(keep) is keep

    class Node:
        FUNCTION = "run"

        def run(self, fail):
            if fail:
                raise ExpertLoadError("--weights nf4 please")
            return ("ok",)

    node_errors.install([Node])
    node_errors.install([Node])  # idempotent
    assert Node().run(False) == ("ok",)
    with pytest.raises(ExpertLoadError) as info:
        Node().run(True)
    assert type(info.value).__module__ == "LingBot-World" and str(info.value) == "weights nf4 please"
    assert type(info.value.__cause__) is ExpertLoadError
    with pytest.raises(ValueError) as info:  # a builtin keeps its type, in node words
        node_errors.node_door(lambda: (_ for _ in ()).throw(ValueError("use --tile-size 32")))()
    assert type(info.value) is ValueError and str(info.value) == "use tile_size 32"


def test_every_registered_node_goes_through_the_door():
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS

    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert getattr(getattr(cls, cls.FUNCTION), "lingbot_door", False), name


def test_the_optional_bitsandbytes_kernel_warning_is_dropped(caplog):
    import lingbot_world.nodes  # noqa: F401 - installs quant's filter (the CLI's too) before bitsandbytes loads

    BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
    logger = logging.getLogger(BNB_CPU_LOGGER)
    with caplog.at_level(logging.WARNING, logger=BNB_CPU_LOGGER):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please ...", "no kernels")
        logger.warning("something else")
    assert [r.getMessage() for r in caplog.records if r.name == BNB_CPU_LOGGER] == ["something else"]


def test_a_prompt_with_a_missing_model_runs_nothing_not_just_the_camera_preview(comfy_folders):
    """The demo template's camera preview needs no model: with a missing expert it is held back too, so ComfyUI
    finds no valid output and shows the pack's message instead of a partial 'success'."""
    import json
    from pathlib import Path

    from lingbot_world.nodes import NODE_CLASS_MAPPINGS
    from lingbot_world.nodes.adapters.prompt_guard import failing_nodes, make_handler

    repo = Path(__file__).resolve().parents[1]
    prompt = json.loads((repo / "tests" / "workflows" / "Image to video, camera preset.api.json").read_text())
    prompt["900"] = {"class_type": "SaveImage", "inputs": {"images": ["901", 0]}}  # unrelated to the pack
    prompt["901"] = {"class_type": "LoadImage", "inputs": {"image": "x.png"}}
    outputs = {"PreviewImage", "SaveVideo", "SaveImage"}
    core = {name: type(name, (), {"OUTPUT_NODE": name in outputs}) for name in ("PreviewImage", "SaveVideo",
                                                                               "SaveImage", "LoadImage", "CreateVideo")}
    handler = make_handler(NODE_CLASS_MAPPINGS, {**core, **NODE_CLASS_MAPPINGS})
    failing = failing_nodes(prompt, NODE_CLASS_MAPPINGS)
    kinds = {prompt[k]["class_type"] for k in failing}
    assert {"LingBotExpertLoader", "LingBotTextEncode", "LingBotVAELoader"} <= kinds
    out = handler({"prompt": prompt, "client_id": "x"})
    left = {v["class_type"] for v in out["prompt"].values()}
    assert "PreviewImage" not in left and "SaveVideo" in left and "SaveImage" in left
    assert out["client_id"] == "x" and len(prompt) == len(out["prompt"]) + 1  # the caller's dict is not changed
    # all installed: nothing is held back
    ok = {"1": {"class_type": "LingBotCameraPreset", "inputs": {}},
          "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 1]}}}
    assert handler({"prompt": ok})["prompt"] == ok


def test_current_comfyui_conventions_search_aliases_and_advanced_widgets(comfy_folders):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS
    from lingbot_world.nodes.adapters.ui_hints import SHOW_IF

    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert {"LingBot", "Wan"} <= set(cls.SEARCH_ALIASES), name
    sampler = NODE_CLASS_MAPPINGS["LingBotSampler"].INPUT_TYPES()
    assert sampler["required"]["shift"][1]["advanced"] and "advanced" not in sampler["required"]["steps"][1]
    assert sampler["optional"]["previews"][1] == {**sampler["optional"]["previews"][1], "default": True,
                                                  "advanced": True}
    for cls in NODE_CLASS_MAPPINGS.values():  # every conditional widget is an advanced one in current ComfyUI
        for section in cls.INPUT_TYPES().values():
            for spec in section.values():
                if len(spec) > 1 and SHOW_IF in spec[1]:
                    assert spec[1]["advanced"] is True


def test_a_custom_size_error_says_width_x_height_in_widget_words():
    from lingbot_world.nodes.adapters.video_setup import choose_size

    with pytest.raises(ValueError) as info:
        choose_size("custom", 480, 832, width=100, height=60)
    assert str(info.value) == ("custom size 100x60 (width x height): width and height must be multiples of 16, "
                               "e.g. 96x64")
    assert choose_size("custom", 480, 832, width=112, height=64) == (64, 112)


def test_the_fast_loader_checks_its_model_at_queue_time(comfy_folders):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS

    fast = NODE_CLASS_MAPPINGS["LingBotFastLoader"]
    msg = fast.VALIDATE_INPUTS("lingbot-world-base-cam/lingbot_world_fast")
    # the Fast model's own files and repository (not the NF4 experts' advice), and how to get them from the graph
    assert msg.startswith("fast_model: lingbot-world-base-cam/lingbot_world_fast is not installed. It is the "
                          "LingBot-World Fast's DiT: config.json and the *.safetensors shards with their index, from "
                          "huggingface.co/robbyant/lingbot-world-fast into "), msg
    assert "download switch" in msg and "Apache-2.0" in msg and "cahlen" not in msg
    assert fast.VALIDATE_INPUTS("lingbot-world-base-cam/lingbot_world_fast", True) is True  # the node fetches it
    v2 = fast.VALIDATE_INPUTS("lingbot-world-v2-1.3b-causal-fast")
    assert "CC BY-NC-SA 4.0" in v2 and "non-commercial" in v2 and "robbyant/lingbot-world-v2-1.3b-causal-fast" in v2
    other = fast.VALIDATE_INPUTS("my_models/fast")
    assert "lingbot-world-base-cam/lingbot_world_fast" in other and "EXPERT" not in other.upper().split("FAST")[0]
    assert fast.VALIDATE_INPUTS("lingbot-demo/lingbot_world_fast_bnb_nf4") is True
    # a base expert offered in the Fast loader is refused by kind before anything is fetched
    assert "pick it in LingBot Expert Loader" in fast.VALIDATE_INPUTS("lingbot-world-base-cam/high_noise_model", True)


def test_the_experts_of_one_release_get_one_message_and_download_offers_are_listed(comfy_folders):
    from lingbot_world.nodes.adapters import comfy_paths

    msg = LingBotExpertLoader.VALIDATE_INPUTS("lingbot-world-base-cam/high_noise_model",
                                              "lingbot-world-base-cam/low_noise_model")
    assert msg.startswith("high_noise_expert, low_noise_expert: the LingBot-World Base (Cam) experts are not "
                          "installed"), msg
    assert msg.count("robbyant/lingbot-world-base-cam") == 1 and "high_noise_model/, low_noise_model/" in msg
    assert LingBotExpertLoader.VALIDATE_INPUTS("lingbot-world-base-cam/high_noise_model",
                                               "lingbot-world-base-cam/low_noise_model", True) is True
    listed = comfy_paths.list_experts()
    for name in ("lingbot-world-base-cam/high_noise_model", "lingbot-world-base-act/low_noise_model",
                 "lingbot-world-base-cam/lingbot_world_fast", "lingbot-world-v2-14b-causal-fast/transformers",
                 "lingbot-world-v2-1.3b-causal-fast"):
        assert name in listed, name
    assert "lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth" in comfy_paths.list_text_encoders()
    assert "lingbot-world-base-cam/Wan2.1_VAE.pth" in comfy_paths.list_vaes()
    # an offer is never a new node's default while something installed (here: the demo) is there
    assert LingBotExpertLoader.INPUT_TYPES()["required"]["high_noise_expert"][1]["default"].startswith("lingbot-demo/")
    te = LingBotTextEncode.VALIDATE_INPUTS("lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth", "auto")
    assert "the folder google/umt5-xxl/" in te and "models_t5_umt5-xxl-enc-bf16.pth" in te and "download switch" in te
    assert LingBotVAELoader.VALIDATE_INPUTS("lingbot-world-base-cam/Wan2.1_VAE.pth", True) is True


def test_node_text_counts_in_words():
    from lingbot_world.nodes.adapters.progress import count

    assert [count(1, "chunk"), count(7, "chunk"), count(0, "frame"), count(1, "pass", "passes"),
            count(2, "pass", "passes")] == ["1 chunk", "7 chunks", "0 frames", "1 pass", "2 passes"]

"""Pack-side pieces of the ComfyUI experience that need no ComfyUI: the example inputs copied into input/, the
frontend hints in input options, the display names the node search finds."""
from __future__ import annotations

import pytest

from lingbot_world.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from lingbot_world.nodes.adapters.example_inputs import (DEMO_IMAGE, EXAMPLE_IMAGE, EXAMPLE_TRAJECTORY,
                                                         install_example_inputs, shipped_files)
from lingbot_world.nodes.adapters.ui_hints import HIDE_IF, SHOW_IF, hide_if, short_labels, show_if, upload


def test_example_inputs_are_copied_once_and_repaired(tmp_path):
    copied = install_example_inputs(tmp_path)
    assert set(copied) == set(shipped_files()) and EXAMPLE_IMAGE in copied and DEMO_IMAGE in copied
    for rel, src in shipped_files().items():
        assert (tmp_path / rel).read_bytes() == src.read_bytes()
    assert {f"{EXAMPLE_TRAJECTORY}/poses.npy", f"{EXAMPLE_TRAJECTORY}/intrinsics.npy"} <= set(copied)
    assert install_example_inputs(tmp_path) == []  # nothing to do the second time
    cut = tmp_path / EXAMPLE_TRAJECTORY / "poses.npy"
    cut.write_bytes(cut.read_bytes()[:100])  # an interrupted copy
    (tmp_path / "mine.png").write_bytes(b"user file")
    assert install_example_inputs(tmp_path) == [f"{EXAMPLE_TRAJECTORY}/poses.npy"]
    assert (tmp_path / "mine.png").read_bytes() == b"user file"


def test_an_unwritable_input_folder_is_reported_not_raised(tmp_path, caplog):
    (tmp_path / "lingbot_examples").write_text("a file where the pack wants a folder")  # fails even for root
    assert install_example_inputs(tmp_path) == []
    assert "could not copy the example input" in caplog.text


def test_ui_hints():
    # conditional widgets are "advanced" ones in current ComfyUI (its own way to keep them out of sight)
    assert show_if(size=["custom"]) == {SHOW_IF: {"size": ["custom"]}, "advanced": True}
    assert hide_if(window=[0]) == {HIDE_IF: {"window": [0]}, "advanced": True}
    assert short_labels() == {"lingbot_short_labels": True}
    assert upload("camera_npy") == {"lingbot_upload": "camera_npy"}
    with pytest.raises(ValueError):
        show_if()
    with pytest.raises(ValueError):
        hide_if()
    with pytest.raises(ValueError, match="upload kind"):
        upload("anything")


def test_display_names_are_found_by_searching_lingbot_and_wan():
    """The frontend's node search matches class and display names fuzzily, weighting the start of the name: each
    display name says LingBot and Wan, "Wan" within its first 30 characters."""
    assert set(NODE_DISPLAY_NAME_MAPPINGS) == set(NODE_CLASS_MAPPINGS)
    for name, title in NODE_DISPLAY_NAME_MAPPINGS.items():
        assert title.startswith("LingBot ") and 0 <= title.find("Wan") <= 30, title


def test_the_newer_nodes_declare_their_hints():
    """Fast, Actions, native loaders and VAE Decode: settings that only apply to one choice hide, paths are short."""
    def opts(node, name):
        inputs = NODE_CLASS_MAPPINGS[node].INPUT_TYPES()
        return {**inputs["required"], **inputs.get("optional", {})}[name][1]

    assert opts("LingBotFastSampler", "sink")[HIDE_IF] == {"window": [0]}
    assert opts("LingBotFastLoader", "fast_model")["lingbot_short_labels"]
    assert opts("LingBotActions", "actions")[SHOW_IF] == {"key_files": ["(action string)"]}
    assert opts("LingBotActions", "path")[SHOW_IF] == {"key_files": ["(custom path)"]}
    assert opts("LingBotModelLoader", "expert")["lingbot_short_labels"]
    assert opts("LingBotLoraLoader", "lora_name")["lingbot_short_labels"]
    assert opts("LingBotExpertsFromModels", "blocks_on_gpu")[SHOW_IF] == {"memory_mode": ["block_swap"]}
    assert opts("LingBotImageToVideoNative", "width")[SHOW_IF] == {"size": ["custom"]}
    assert opts("LingBotVAEDecode", "tile_size")[SHOW_IF] == {"tiled": [True]}

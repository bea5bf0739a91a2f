"""LingBot Fast LoRA Loader: the LoRA file read against the Fast model's shapes and attached to a clone of its
patcher as ComfyUI patches (applied on the NF4 weights when it loads, like the experts' LoRAs); strength 0 passes
the model on unchanged; a LoRA for another model is one line."""
from __future__ import annotations

import sys
import types

import pytest
import torch
from safetensors.torch import save_file

from lingbot_world.loaders.expert_format import detect_format
from lingbot_world.world.models import V1_FAST
from lingbot_world.nodes.adapters import lora_attach
from lingbot_world.nodes.adapters.fast_host import FastModel
from lingbot_world.nodes.fast import LingBotFastLoraLoader


class _Patcher:  # the two ModelPatcher calls the node makes
    def __init__(self, fmt, patches=None):
        self.weights = types.SimpleNamespace(fmt=fmt)
        self.patches = dict(patches or {})

    def clone(self):
        return _Patcher(self.weights.fmt, self.patches)

    def add_patches(self, patches, strength):
        for k, v in patches.items():
            self.patches.setdefault(k, []).append((strength, v))
        return list(patches)


@pytest.fixture
def fast(demo_ckpt, monkeypatch, tmp_path):
    from lingbot_world.world import WorldFiles

    from lingbot_world.world.assembly import Checked

    files = WorldFiles.demo(demo_ckpt)
    fmt = detect_format(files.dit)
    monkeypatch.setattr(lora_attach.comfy_paths, "resolve_lora", lambda name: tmp_path / name)
    monkeypatch.setattr(lora_attach, "_lora_cache", {})
    comfy = types.ModuleType("comfy")  # the two ComfyUI modules lora_patches imports
    comfy.lora = types.SimpleNamespace(calculate_weight=None)

    class LoRAAdapter:  # the fields of comfy.weight_adapter.LoRAAdapter the pack fills
        def __init__(self, keys, weights):
            self.loaded_keys, self.weights = keys, weights

    comfy.weight_adapter = types.SimpleNamespace(LoRAAdapter=LoRAAdapter)
    for name, mod in (("comfy", comfy), ("comfy.lora", comfy.lora), ("comfy.weight_adapter", comfy.weight_adapter)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "lingbot_world.nodes.adapters.lora_patches", raising=False)
    monkeypatch.setattr("lingbot_world.nodes.fast.show_on_node", lambda text: None)
    return FastModel(_Patcher(fmt), Checked(files, fmt, V1_FAST), "nf4", "auto"), fmt.config


def test_the_lora_goes_on_a_clone_of_the_fast_models_patcher(fast, tmp_path):
    model, cfg = fast
    d = cfg.dim
    save_file({f"diffusion_model.blocks.{i}.self_attn.q.lora_down.weight": torch.randn(4, d) for i in range(2)}
              | {f"diffusion_model.blocks.{i}.self_attn.q.lora_up.weight": torch.randn(d, 4) for i in range(2)},
              str(tmp_path / "style.safetensors"))
    out, = LingBotFastLoraLoader().load(model, "style.safetensors", 0.8)
    assert out.patcher is not model.patcher and not model.patcher.patches
    assert sorted(out.patcher.patches) == [f"diffusion_model.blocks.{i}.self_attn.q.weight" for i in range(2)]
    assert all(s == 0.8 for lst in out.patcher.patches.values() for s, _ in lst)
    assert (out.format, out.weights, out.kv_cache) == (model.format, model.weights, model.kv_cache)
    assert LingBotFastLoraLoader().load(model, "style.safetensors", 0.0)[0] is model


def test_a_lora_for_another_model_is_one_line(fast, tmp_path):
    model, cfg = fast
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(4, cfg.dim + 8),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(cfg.dim, 4)},
              str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="blocks.0.self_attn.q"):
        LingBotFastLoraLoader().load(model, "other.safetensors", 1.0)

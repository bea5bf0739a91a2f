"""Behaviour changes of current ComfyUI (0.35-0.38) simulated without a server: an interrupt that is a BaseException,
a load budget <= 0, a free-memory function that counts differently, and the RAM-pressure cache's tensor hook."""
from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch


class InterruptProcessingException(BaseException):  # newer ComfyUI: no longer an Exception
    pass


def _stub_comfy(free: int = 10 << 30):
    """The parts of comfy.* that nodes/adapters/patchers.py and nodes/adapters/memory.py touch."""
    mm = types.ModuleType("comfy.model_management")
    mm.InterruptProcessingException = InterruptProcessingException
    mm.current_loaded_models = []
    mm.get_free_memory = lambda device=None: free
    mm.soft_empty_cache = lambda *a, **k: None
    mm.is_device_cpu = lambda d: torch.device(d).type == "cpu"
    mm.minimum_inference_memory = lambda: 0

    mp = types.ModuleType("comfy.model_patcher")

    class ModelPatcher:
        def __init__(self, model, load_device, offload_device, size=0, **kwargs):
            self.model, self.load_device, self.offload_device, self.size = model, load_device, offload_device, size
            self.patches, self.patches_uuid, self.object_patches_backup, self.backup = {}, None, {}, {}
            self.detached = 0

        @contextlib.contextmanager
        def use_ejected(self, **kwargs):
            yield

        def unpatch_model(self, *a, **k):
            pass

        def patch_model(self, *a, **k):
            pass

        def detach(self, *a, **k):
            self.detached += 1

        def model_size(self):
            return self.size

        def get_all_callbacks(self, kind):
            return []

        def eject_model(self):
            pass

    mp.ModelPatcher = ModelPatcher
    utils = types.ModuleType("comfy.utils")
    utils.set_attr = lambda *a: None
    ext = types.ModuleType("comfy.patcher_extension")
    ext.CallbacksMP = types.SimpleNamespace(ON_LOAD="on_load")
    comfy = types.ModuleType("comfy")
    comfy.model_management, comfy.model_patcher, comfy.utils, comfy.patcher_extension = mm, mp, utils, ext
    return {"comfy": comfy, "comfy.model_management": mm, "comfy.model_patcher": mp, "comfy.utils": utils,
            "comfy.patcher_extension": ext}


@pytest.fixture
def patchers(monkeypatch):
    for name, module in _stub_comfy().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "lingbot_world.nodes.adapters.patchers", raising=False)
    import lingbot_world.nodes.adapters.patchers as patchers

    yield patchers
    sys.modules.pop("lingbot_world.nodes.adapters.patchers", None)  # the next import sees the real (or no) ComfyUI


def _expert_patcher(patchers):
    from lingbot_world.loaders.demo_checkpoint import demo_configs

    class Fmt:
        config = demo_configs()[0]

    weights = types.SimpleNamespace(fmt=Fmt(), mode="nf4", label="high-noise expert", keep_in_ram=False,
                                    blocks_on_gpu=None, block_swapping=lambda: False)
    model = types.SimpleNamespace(weights=weights, model_loaded_weight_memory=0, get_dtype=lambda: torch.bfloat16,
                                  slot=types.SimpleNamespace(dit=None))
    return patchers.ExpertPatcher(model, torch.device("cuda", 0), torch.device("cpu"), size=100)


def test_a_budget_of_zero_or_less_asks_for_the_smallest_placement(patchers):
    assert patchers.load_budget(0, 1e32) == (True, 0)  # "load everything"
    assert patchers.load_budget(5 << 30, 2 << 30) == (False, 7 << 30)
    assert patchers.load_budget(5 << 30, -(6 << 30)) == (False, patchers.SMALLEST_BUDGET)  # less than nothing left
    assert patchers.load_budget(0, 0) == (False, patchers.SMALLEST_BUDGET)


def test_partially_load_with_no_room_places_the_expert_as_small_as_it_goes(patchers, monkeypatch):
    p = _expert_patcher(patchers)
    budgets = []

    class Placed(Exception):
        pass

    def place(self, device, budget):
        budgets.append(budget)
        raise Placed

    monkeypatch.setattr(patchers.ExpertPatcher, "_place_for_budget", place)
    with pytest.raises(Placed):
        p.partially_load(torch.device("cuda", 0), extra_memory=-(1 << 30))
    assert budgets == [patchers.SMALLEST_BUDGET]  # not ignored (it was: only budgets > 0 were honoured)
    assert p.detached == 1


def test_an_interrupt_during_an_expert_load_still_cleans_up(patchers, monkeypatch):
    p = _expert_patcher(patchers)

    def cancelled(self, *a, **k):
        raise InterruptProcessingException()

    monkeypatch.setattr(patchers.ExpertPatcher, "load", cancelled)
    with pytest.raises(InterruptProcessingException):
        p.partially_load(torch.device("cuda", 0), extra_memory=1 << 30)
    assert p.detached == 1  # `except Exception` skipped this on current ComfyUI


def test_free_memory_is_read_the_way_current_core_counts_it():
    from lingbot_world.nodes.adapters.memory import free_memory, vram_comfy_can_free

    mm = _stub_comfy(free=3 << 30)["comfy.model_management"]
    cuda = torch.device("cuda", 0)

    class DynamicAware:  # newer ModelPatcher: counts what dynamic VRAM would give up too
        def get_free_memory(self, device):
            return 9 << 30

    class Held:
        device = cuda

        def model_loaded_memory(self):
            return 1 << 30

    mm.current_loaded_models = [Held()]
    assert free_memory(mm, cuda, DynamicAware()) == 9 << 30
    assert free_memory(mm, cuda, object()) == 3 << 30  # 0.3.64: the module function
    assert free_memory(mm, cuda, None) == 3 << 30
    assert vram_comfy_can_free(mm, cuda, DynamicAware()) == 10 << 30
    assert vram_comfy_can_free(mm, torch.device("cpu"), DynamicAware()) is None

    class OtherSignature:
        def get_free_memory(self):
            return 1

    assert free_memory(mm, cuda, OtherSignature()) == 3 << 30


def test_outputs_held_in_ram_tell_the_node_cache_their_size():
    from lingbot_world.nodes.adapters.expert_weights import ExpertWeights
    from lingbot_world.nodes.adapters.payloads import ExpertPair, TextEmbeds

    fmt = types.SimpleNamespace(config=None)
    w = ExpertWeights("high", fmt)
    assert w._comfy_cache_tensors() == []  # nothing parked: nothing in RAM
    w.parked = torch.nn.Linear(64, 32)  # a parked copy in host memory
    w.kept_parts = (torch.nn.Linear(8, 8), [types.SimpleNamespace(host=torch.zeros(1000))])
    sizes = sum(t.numel() * t.element_size() for t in w._comfy_cache_tensors())
    assert sizes == (64 * 32 + 32 + 8 * 8 + 8 + 1000) * 4
    patcher = types.SimpleNamespace(model=types.SimpleNamespace(weights=w))
    pair = ExpertPair(patcher, types.SimpleNamespace(model=None), {}, "nf4", "swap_pinned", -1)
    assert sum(t.numel() for t in pair._comfy_cache_tensors()) == 64 * 32 + 32 + 72 + 1000
    text = TextEmbeds(torch.zeros(7, 16), torch.zeros(3, 16), "p", "n")
    assert [t.shape[0] for t in text._comfy_cache_tensors()] == [7, 3]

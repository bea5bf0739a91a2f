"""A Fast video's state in ComfyUI tells current ComfyUI's RAM-pressure node cache what it holds in RAM: the
parked K/V cache (the chain's one copy) and the state's latents, conditioning and prompt, each storage once."""
from __future__ import annotations

import types

import torch

from lingbot_world.memory.kv_park import ParkedKV
from lingbot_world.nodes.adapters.fast_state_store import FastStateHandle, KVStore


def test_a_state_counts_its_parked_cache_and_tensors_once():
    k = [torch.ones(1, 4, 2, 8) for _ in range(2)]
    v = [torch.zeros(1, 4, 2, 8) for _ in range(2)]
    latent = torch.randn(1, 16, 3, 2, 2)
    condition = types.SimpleNamespace(y=torch.randn(1, 20, 4, 2, 2))
    state = types.SimpleNamespace(latents=(latent, latent[:, :, :1]), context=torch.randn(5, 8), condition=condition,
                                  settings=types.SimpleNamespace(evicting=False))
    handle = FastStateHandle.first(state, ParkedKV(k, v, 4, 4), model=None, i2v=None)
    held = handle._comfy_cache_tensors()
    ptrs = {t.untyped_storage().data_ptr() for t in held}
    assert len(held) == len(ptrs) == 7  # 4 K/V layers, the latent's storage once, the context, the conditioning
    assert sum(t.numel() * t.element_size() for t in held) >= handle.store.nbytes
    assert FastStateHandle.empty(None, None)._comfy_cache_tensors() == []
    handle.store = KVStore(ParkedKV([None], [None], 0, 0), handle.id, False)
    assert len(handle._comfy_cache_tensors()) == 3  # a cache moved out: only the state's own tensors

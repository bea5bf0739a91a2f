"""Where the v2 models go on consumer cards (the memory plan, memory/fast_planner.py; sizes from the registry's full
configs, nothing allocated): the 14B on a 24 GB card streams its K/V window from pinned RAM (its bf16 window of 18
latent frames alone is 23 GB at 480x832) with the NF4 model resident; the 1.3B keeps the model and its whole
window on a 12 GB card with the tiny decoder (the VAE's streaming decode takes 4.7-7 GB at 480x832: beside it a
part of the window streams from pinned RAM), and on an 8 GB card at 304x528 with the VAE's decode in bf16 or the
tiny decoder."""
from __future__ import annotations

import pytest

from lingbot_world.memory.fast_planner import plan_fast_memory
from lingbot_world.wan.sampling.fast_state import FastSettings
from lingbot_world.wan.vae.model import VAEConfig
from lingbot_world.wan.vae.streaming import streaming_decode_bytes
from lingbot_world.wan.vae.tiny import TinyConfig, tiny_decode_bytes
from lingbot_world.world.models import V2_14B, V2_1_3B
from lingbot_world.world.plan import play_layout

GiB = 1024**3
CONTEXT_GIB = 0.85  # what a card's CUDA context and libraries take outside torch (measured on the H200s)


def _plan(entry, h, w, card_gib, decoder, *, kv_fp8=False, weights="nf4"):
    video = FastSettings(h, w, 42, "cuda", "continuable", window=entry.play_window, sink=entry.play_sink,
                         recipe=entry.recipe)
    decode = {"vae": streaming_decode_bytes(VAEConfig(), h, w, half=False),
              "vae_bf16": streaming_decode_bytes(VAEConfig(), h, w, half=True),
              "tiny": tiny_decode_bytes(TinyConfig(), h, w, 2)}[decoder]
    return plan_fast_memory(h, w, entry.dit, play_layout(video), int((card_gib - CONTEXT_GIB) * GiB), 48 * GiB,
                            extra_vram=decode, weights=weights, compute_bytes=2, kv_fp8=kv_fp8)


def test_the_14b_on_a_24_gb_card_streams_its_window_from_pinned_ram():
    plan = _plan(V2_14B, 480, 832, 24, "vae")
    assert plan.fits and plan.cache == "host" and plan.blocks_on_gpu is None  # the NF4 model resident
    assert plan.estimates["cache_bytes"] > 22e9  # the bf16 window alone would not fit
    fp8 = _plan(V2_14B, 480, 832, 24, "vae_bf16", kv_fp8=True)  # fast / draft: the FP8 cache, more layers on board
    assert fp8.fits and fp8.cache_layers_on_gpu > plan.cache_layers_on_gpu


@pytest.mark.parametrize("kv_fp8", [False, True])
def test_the_1_3b_is_resident_on_a_12_gb_card_with_the_tiny_decoder(kv_fp8):
    plan = _plan(V2_1_3B, 480, 832, 12, "tiny", kv_fp8=kv_fp8)
    assert plan.fits and plan.cache == "gpu" and plan.blocks_on_gpu is None


@pytest.mark.parametrize("decoder,kv_fp8,layers", [("vae", False, 2), ("vae_bf16", True, 15)])
def test_the_1_3b_beside_the_vaes_decode_on_12_gb_streams_part_of_its_window(decoder, kv_fp8, layers):
    plan = _plan(V2_1_3B, 480, 832, 12, decoder, kv_fp8=kv_fp8)  # the decoder's 4.7-7 GB leave too little
    assert plan.fits and plan.cache == "host" and plan.blocks_on_gpu is None  # the model stays resident
    assert plan.cache_layers_on_gpu == layers  # of 30; the others stream from pinned RAM one layer ahead


@pytest.mark.parametrize("decoder", ["tiny", "vae_bf16"])
def test_the_1_3b_is_resident_at_304x528_on_an_8_gb_card(decoder):
    plan = _plan(V2_1_3B, 304, 528, 8, decoder)
    assert plan.fits and plan.cache == "gpu" and plan.blocks_on_gpu is None

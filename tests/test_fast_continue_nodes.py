"""LingBot Fast Sampler -> LingBot Fast Continue -> ... in-process on the tiny demo (ComfyUI's modules stood in by
test_nodes_pipeline.py): the chain equals one run of the concatenated keys, its steps share one cache, a step can be
queued again with other keys, a stale branch and an unkept state are refused with the fix, a cancelled step leaves
its input state usable, and a windowed video copies its (bounded) cache per step."""
from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import load_sibling


F = load_sibling("test_fast_nodes")
comfy = F.comfy
demo_base = F.demo_base
Interrupted = F.Interrupted
H, W = 32, 48
TOKENS_PER_LATENT = (H // 16) * (W // 16)


def N(name):
    from lingbot_world.nodes import NODE_CLASS_MAPPINGS

    return NODE_CLASS_MAPPINGS[name]()


@pytest.fixture
def inputs(comfy):
    text = N("LingBotTextEncode").encode("lingbot-demo/models_t5_umt5-xxl-enc-bf16.pth", "auto",
                                          "a lake with a lone tree", "", "auto", True)[0]
    vae = N("LingBotVAELoader").load("lingbot-demo/Wan2.1_VAE.pth")[0]
    image = torch.rand(1, 72, 128, 3, generator=torch.Generator().manual_seed(3))
    return text, vae, image, {}  # I2V outputs by frame count, reused like ComfyUI's cache does


def keys(text):
    camera, _, _, frames = N("LingBotActions").build(text, 0, "")
    return camera, frames


def sampler(inputs, actions, rule="continuable", used=True, model=None, **kw):
    text, vae, image, made = inputs
    cam, frames = keys(actions)
    if frames not in made:
        made[frames] = N("LingBotImageToVideo").encode(vae, image, "custom", W, H, frames, False, cam)[0]
    i2v = made[frames]
    prompt = {"9": {"inputs": {}}, "10": {"inputs": {"state": ["9", 1]}}} if used else {"9": {"inputs": {}}}
    args = dict(seed=5, noise_source="cpu", max_attention=0, window=0, sink=0, camera=cam, rule=rule,
                prompt=prompt, unique_id="9")
    args.update(kw)
    return N("LingBotFastSampler").sample(model if model is not None else F.fast_loader(), text, i2v, **args)


def cont(state, actions=None, frames=0, used=True, **kw):
    cam = keys(actions)[0] if actions else None
    prompt = {"10": {"inputs": {}}, "11": {"inputs": {"state": ["10", 2]}}} if used else {"10": {"inputs": {}}}
    return N("LingBotFastContinue").extend(state, frames, cam, prompt=prompt, unique_id="10", **kw)


def test_the_chain_is_one_run_of_the_concatenated_keys(comfy, inputs):
    vae = inputs[1]
    one, _ = sampler(inputs, "w-10,l-10,a-12,iw-12")
    assert one["samples"].shape[2] == 12  # 44 frames of keys: 4 chunks, 45 frames
    first, s1 = sampler(inputs, "w-10,l-10")
    assert first["samples"].shape[2] == 6 and s1.state.chunks == 2
    whole, segment, s2 = cont(s1, "a-12,iw-12")
    assert torch.equal(whole["samples"], one["samples"])
    assert s2.state.chunks == 4 and s2.store is s1.store  # one cache for the chain
    cfg = F.fast_loader().config
    per_token = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 4  # K and V of every layer, float32 on the CPU
    assert s1.store.nbytes == 12 * TOKENS_PER_LATENT * per_token  # the whole video's cache, once
    decode = N("LingBotVAEDecode")
    frames_one = decode.decode(vae, one)[0]
    frames_part = decode.decode(vae, segment)[0]
    assert frames_part.shape[0] == 24 and torch.equal(frames_part, frames_one[21:])  # the new part, exactly
    from lingbot_world.nodes.adapters.payloads import DECODE_KEY

    # every LATENT says how its model's speed plan decodes (no Speed Options: the exact defaults, float32)
    assert one[DECODE_KEY] == whole[DECODE_KEY] == segment[DECODE_KEY] == "float32"


def test_a_step_can_be_queued_again_and_a_stale_branch_is_refused(comfy, inputs):
    from lingbot_world.nodes.adapters.fast_state_store import StaleStateError

    _, s1 = sampler(inputs, "w-10,l-10")
    a, _, sa = cont(s1, "a-12")
    b, _, sb = cont(s1, "d-12")  # queued again with other keys: the cache goes back to s1's
    assert not torch.equal(a["samples"], b["samples"])
    assert torch.equal(a["samples"][:, :, :6], b["samples"][:, :, :6])
    again, _, _ = cont(s1, "a-12")
    assert torch.equal(again["samples"], a["samples"])  # deterministic from the same state
    with pytest.raises(StaleStateError, match="overwritten by another continuation"):
        cont(sa, "w-12")
    cont(sb if sb.store.lineage[-1] == sb.id else s1, "w-12")  # the latest branch of s1 goes on


def test_an_unkept_sampler_state_is_refused_with_the_fix(comfy, inputs):
    latent, state = sampler(inputs, "w-20", used=False)
    assert state.state is None and latent["samples"].shape[2] == 6
    with pytest.raises(ValueError, match="did not keep its state.*queue again"):
        cont(state, "w-12")
    # a Continue whose state output nobody takes leaves its input state's cache as it was
    _, s1 = sampler(inputs, "w-20")
    size = s1.store.nbytes
    _, _, out = cont(s1, "w-12", used=False)
    assert out.state is None and s1.store.nbytes == size and s1.store.lineage == [s1.id]


def test_a_cancelled_step_leaves_its_input_state_usable(comfy, inputs):
    _, s1 = sampler(inputs, "w-10,l-10")
    ref, _, _ = cont(s1, "a-24")
    comfy.interrupt_after = 6  # the second chunk of the step
    with pytest.raises(Interrupted):
        cont(s1, "a-24")
    assert s1.store.parked is not None and s1.store.parked.tokens == 6 * TOKENS_PER_LATENT
    again, _, _ = cont(s1, "a-24")
    assert torch.equal(again["samples"], ref["samples"])


def test_no_keys_stands_still_and_frames_count_chunks(comfy, inputs):
    _, s1 = sampler(inputs, "w-20")
    whole, segment, s2 = cont(s1, None, frames=24)
    assert whole["samples"].shape[2] == 12 and s2.state.chunks == 4
    assert s2.state.has_camera and s2.state.parts[-1]["label"].startswith("none")


def test_a_windowed_video_copies_its_bounded_cache_per_step(comfy, inputs):
    _, s1 = sampler(inputs, "w-10,l-10", window=3)
    assert s1.store.evicting
    before = [t.clone() for t in s1.store.parked.k]
    _, _, s2 = cont(s1, "a-12")
    _, _, s3 = cont(s1, "d-12")  # the input's cache was not touched: both continue it
    assert s2.store is not s1.store and s3.store is not s1.store
    assert all(torch.equal(a, b) for a, b in zip(before, s1.store.parked.k))
    assert s2.store.parked.tokens == 3 * TOKENS_PER_LATENT  # the window: 3 latent frames
    del s2, s3
    gc.collect()


def test_each_step_says_on_the_node_what_it_adds_and_the_ram_its_state_keeps(comfy, inputs, monkeypatch):
    import lingbot_world.nodes.fast as fast_nodes

    shown = []
    monkeypatch.setattr(fast_nodes, "show_on_node", shown.append)  # the Loader's, the Sampler's and Continue's
    model = F.fast_loader()  # the loader says what it read and the model's licence
    assert shown == ["LingBot-World Fast: read lingbot_world_fast_bnb_nf4 as it is; weights licensed Apache-2.0: "
                     "https://www.apache.org/licenses/LICENSE-2.0"], shown
    shown.clear()
    _, s1 = sampler(inputs, "w-10,l-10", model=model)
    assert shown[0].startswith(f"{W}x{H}, 21 frames (1.3 s at 16 fps): 2 chunks x 4 steps\nmemory: ")
    assert shown[-1] == shown[0] + f"\nstate kept for LingBot Fast Continue: the chain's K/V cache (shared by its " \
                                   f"states), {s1.store.nbytes / 1e9:.1f} GB in RAM"
    shown.clear()
    _, _, s2 = cont(s1, "a-12,iw-12")
    assert shown[0].startswith(f"{W}x{H}, 24 new frames after 21 (45 frames, 2.8 s at 16 fps): 2 chunks x 4 steps")
    assert shown[-1].endswith("states), 0.0 GB in RAM") and len(shown) == 2
    shown.clear()
    cont(s2, "d-12", used=False)  # nobody continues it: no state line
    assert len(shown) == 1 and "state kept" not in shown[0]
    shown.clear()
    _, w1 = sampler(inputs, "w-10,l-10", window=3)
    assert shown[-1].endswith("its own K/V cache, 0.0 GB in RAM")

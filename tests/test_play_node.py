"""LingBot Play in-process on the tiny demo (ComfyUI's modules stood in by test_nodes_pipeline.py, no server): the
node's state output continues the played world in LingBot Fast Continue exactly as the batch run of the concatenated
keys and as playing on, it is a snapshot (playing on or rewinding after the node ran leaves it as it was), it is taken
between chunks, and it is refused (one line naming `window`) when its copy does not fit in RAM. Chunks are played
through the driver's own API, each awaited to its end: no sleeps racing the session's thread."""
from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest
import torch


def _helpers():
    spec = importlib.util.spec_from_file_location("_lingbot_test_fast_continue_nodes", Path(__file__).with_name(
        "test_fast_continue_nodes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


C = _helpers()
comfy = C.comfy
demo_base = C.demo_base
inputs = C.inputs
N = C.N
NODE = "50"


@pytest.fixture
def players(comfy):
    yield
    from lingbot_world.nodes.play_node import _open, close_player

    for node in list(_open):
        close_player(node)


def play(inputs, window=21, sink=3, used=True):
    """One run of the node (the same model, text and I2V objects each time, as ComfyUI's cache gives them)."""
    text, vae, image, made = inputs
    if "play" not in made:
        made["play"] = (C.F.fast_loader(), N("LingBotImageToVideo").encode(vae, image, "custom", C.W, C.H, 9)[0])
    fast_model, i2v = made["play"]
    prompt = {NODE: {"inputs": {}}}
    if used:
        prompt["51"] = {"inputs": {"state": [NODE, 1]}}
    return N("LingBotPlay").play(fast_model, text, i2v, seed=5, noise_source="cpu", window=window, sink=sink,
                                 prompt=prompt, unique_id=NODE)["result"]


def driver():
    from lingbot_world.nodes.play_node import _open

    return _open[NODE].driver


def step(keys):
    """One chunk through the driver, as the page's socket plays it (returns when the chunk is done)."""
    async def ignore(*_):
        pass

    return asyncio.run(driver().step(keys, ignore))


def rewind(chunks):
    asyncio.run(driver().rewind(chunks))


def played_latent():
    return driver().call_now(lambda session: session.latent())


# the whole video (the state's cache moves on into the continuation); a window that keeps chunk 2 beside the sink and
# evicts it at chunk 4 (the state's cache is copied into each continuation)
@pytest.mark.parametrize("window,sink", [(0, 3), (9, 3)])
def test_the_state_continues_the_played_world_as_the_batch_run_and_as_playing_on(comfy, inputs, players, window,
                                                                                  sink):
    actions, state = play(inputs, window, sink)
    assert actions == "" and state.state is None
    with pytest.raises(ValueError, match="^LingBot Fast Continue: LingBot Play had played no chunk when it ran"):
        C.cont(state, "a-12")
    step("w-8")
    step("jw-12")
    actions, state = play(inputs, window, sink)  # queued again: IS_CHANGED saw new keys
    assert actions == "w-8,wj-12" and state.state.chunks == 2
    assert N("LingBotPlay").IS_CHANGED(unique_id=NODE) == actions
    assert state.store.evicting == bool(window)
    # the session goes on after the node ran: a second chunk 2 overwrites the cache slots the state was copied from
    rewind(1)
    step("d-12")
    whole, segment, after = C.cont(state, "a-12,s-12")
    batch, _ = C.sampler(inputs, actions + ",a-12,s-12", used=False, window=window, sink=sink)
    assert torch.equal(whole["samples"], batch["samples"])
    assert after.state.chunks == 4 and whole["samples"].shape[2] == 12
    # playing on with the same keys gives the same video
    rewind(1)
    for keys in ("jw-12", "a-12", "s-12"):
        step(keys)
    evicted = driver().call_now(lambda session: session.cache.global_end > session.cache.local_end)
    assert evicted == bool(window)
    i2v = inputs[3]["play"][1]
    assert torch.equal(i2v.to_raw_latent(played_latent()), whole["samples"])


def test_the_state_is_taken_between_chunks(comfy, inputs, players):
    """A node run while a chunk plays waits for its end: its keys and its state are both those after that chunk."""
    play(inputs)
    started, go = threading.Event(), threading.Event()

    def hold(info):  # the chunk's first model call waits until the node run is queued behind it
        if not started.is_set():
            started.set()
            go.wait(60)

    driver().call_now(lambda session: setattr(session, "callback", hold))
    chunk = threading.Thread(target=step, args=("w-8",))
    chunk.start()
    assert started.wait(60)
    out = {}
    node = threading.Thread(target=lambda: out.update(result=play(inputs)))
    node.start()
    node.join(0.5)
    assert node.is_alive()  # waiting for the chunk (a correct node never gets past this while the chunk is held)
    go.set()
    chunk.join(60)
    node.join(60)
    actions, state = out["result"]
    assert actions == "w-8" and state.state.chunks == 1
    assert state.store.parked.global_end == state.state.kv_global_end


def test_an_unused_or_too_big_state_is_not_kept_and_says_why(comfy, inputs, players, monkeypatch):
    import lingbot_world.nodes.play_node as play_node
    from lingbot_world.memory.kv_placement import RAM_MARGIN

    play(inputs, window=0)
    step("w-8")
    actions, state = play(inputs, window=0, used=False)  # nothing takes the state: no copy
    assert actions == "w-8" and state.state is None
    with pytest.raises(ValueError, match="LingBot Play kept no state: nothing took its state output"):
        C.cont(state, "a-12")
    need = driver().call_now(lambda session: session.snapshot_bytes())
    assert need > 0
    monkeypatch.setattr(play_node, "available_ram_bytes", lambda: need + RAM_MARGIN - 1)
    with pytest.raises(MemoryError) as err:
        play(inputs, window=0)
    line = str(err.value)
    assert "\n" not in line and "set window (21 with sink 3" in line and "disconnect the state output" in line
    monkeypatch.setattr(play_node, "available_ram_bytes", lambda: need + RAM_MARGIN)
    actions, state = play(inputs, window=0)  # the session was left as it was
    assert actions == "w-8" and state.store.nbytes == need


def test_play_and_the_fast_nodes_take_turns_on_the_model(comfy, inputs, players):
    """Every session opened on a Fast model (Play's, a Sampler's, a Continue's: nodes/fast_host.open_fast_world) holds
    that model's lock while it runs (tests/test_world_session.py checks every forward does): two sessions never run
    the same weights at once. A LoRA'd copy of the model shares the lock with its base."""
    import dataclasses

    play(inputs)
    fast_model, _ = inputs[3]["play"]
    assert driver().call_now(lambda session: session.model_lock) is fast_model.lock
    assert dataclasses.replace(fast_model, speed=None).lock is fast_model.lock
    assert step("w-8").chunk == 1

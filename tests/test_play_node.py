"""LingBot Play in-process on the tiny demo (ComfyUI's modules stood in by test_nodes_pipeline.py, no server): the
node's state output continues the played world in LingBot Fast Continue exactly as the batch run of the concatenated
keys and as playing on, it is a snapshot (playing on or rewinding after the node ran leaves it as it was), it is taken
between chunks, and it is refused (one line naming `window`) when its copy does not fit in RAM. Its `tiny_vae` input
lists ComfyUI's vae_approx folder, decodes the played frames with the chosen tiny decoder (the plan counting its
memory, the VAE left off the card), refuses a bad file in one line before the session opens, and a new choice starts
a new session. Chunks are played through the driver's own API, each awaited to its end: no sleeps racing the
session's thread."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from lingbot_world.world.models import V1_FAST

from tests.conftest import load_sibling


C = load_sibling("test_fast_continue_nodes")
comfy = C.comfy
demo_base = C.demo_base
inputs = C.inputs
N = C.N
NODE = "50"


@pytest.fixture
def players(comfy):
    yield
    from lingbot_world.nodes.play import _open, close_player

    for node in list(_open):
        close_player(node)


def made(inputs):
    """The Fast model and the I2V output the node plays on (built once, reused like ComfyUI's cache)."""
    text, vae, image, made = inputs
    if "play" not in made:
        made["play"] = (C.F.fast_loader(), N("LingBotImageToVideo").encode(vae, image, "custom", C.W, C.H, 9)[0])
    return made["play"]


def play(inputs, window=21, sink=3, used=True, **kw):
    """One run of the node (the same model, text and I2V objects each time, as ComfyUI's cache gives them)."""
    fast_model, i2v = made(inputs)
    prompt = {NODE: {"inputs": {}}}
    if used:
        prompt["51"] = {"inputs": {"state": [NODE, 1]}}
    return N("LingBotPlay").play(fast_model, inputs[0], i2v, seed=5, noise_source="cpu", window=window, sink=sink,
                                 prompt=prompt, unique_id=NODE, **kw)["result"]


def driver():
    from lingbot_world.nodes.play import _open

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


# the model's play window (window 0: v1 Fast's 21 + 3, which four chunks do not fill); a window that keeps chunk 2
# beside the sink and evicts it at chunk 4 (the state's cache is copied into each continuation either way)
@pytest.mark.parametrize("window,sink", [(0, 0), (9, 3)])
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
    assert state.store.evicting  # a played video always has a window
    batch_window, batch_sink = (window, sink) if window else (V1_FAST.play_window, V1_FAST.play_sink)
    # the session goes on after the node ran: a second chunk 2 overwrites the cache slots the state was copied from
    rewind(1)
    step("d-12")
    whole, segment, after = C.cont(state, "a-12,s-12")
    batch, _ = C.sampler(inputs, actions + ",a-12,s-12", used=False, window=batch_window, sink=batch_sink)
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
    import lingbot_world.nodes.play as play_node
    from lingbot_world.memory.fast_planner import RAM_MARGIN

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
    assert "\n" not in line and "lower window (21 latent frames kept)" in line and "disconnect the state output" in line
    monkeypatch.setattr(play_node, "available_ram_bytes", lambda: need + RAM_MARGIN)
    actions, state = play(inputs, window=0)  # the session was left as it was
    assert actions == "w-8" and state.store.nbytes == need


def test_play_and_the_fast_nodes_take_turns_on_the_model(comfy, inputs, players):
    """Every session opened on a Fast model (Play's, a Sampler's, a Continue's: nodes/adapters/fast_host.py's
    open_fast_world) holds that model's lock while it runs (tests/test_world_session.py checks every forward does): two
    sessions never run the same weights at once. A LoRA'd copy of the model shares the lock with its base."""
    import dataclasses

    play(inputs)
    fast_model, _ = inputs[3]["play"]
    assert driver().call_now(lambda session: session.model_lock) is fast_model.lock
    assert dataclasses.replace(fast_model, speed=None).lock is fast_model.lock
    assert step("w-8").chunk == 1


TINY = "taew2_1.safetensors"


@pytest.fixture
def vae_approx(comfy, tmp_path):
    """ComfyUI's vae_approx folder (as ComfyUI registers it) holding a random tiny decoder in taew2_1's format."""
    import sys

    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    folder = tmp_path / "vae_approx"
    folder.mkdir()
    sys.modules["folder_paths"].add_model_folder_path("vae_approx", str(folder))
    write_random_tiny_vae(folder / TINY)
    return folder


def played_frames(keys):
    """One chunk on the session's thread: its decoded frames, uint8 [n, H, W, 3]."""
    import numpy as np

    return driver().call_now(lambda session: np.concatenate([b.frames for b in session.step(keys)]))


def tiny_vae_choices():
    return N("LingBotPlay").INPUT_TYPES()["optional"]["tiny_vae"]


def test_tiny_vae_lists_the_vae_approx_folder(comfy, tmp_path):
    import sys

    choices, opts = tiny_vae_choices()
    offers = ["taew2_1.safetensors", "lighttaew2_1.safetensors"]  # listed before they are installed: downloadable
    assert choices == ["none", *offers] and opts["default"] == "none"  # a ComfyUI without the folder
    folder = tmp_path / "vae_approx"
    (folder / "sub").mkdir(parents=True)
    for name in ("taew2_1.safetensors", "taesd_decoder.pth", "sub/lighttaew2_1.pt", "readme.txt", "taew2_1.json"):
        (folder / name).write_bytes(b"")
    sys.modules["folder_paths"].add_model_folder_path("vae_approx", str(folder))
    choices, opts = tiny_vae_choices()
    assert choices == ["none", "sub/lighttaew2_1.pt", "taesd_decoder.pth", "taew2_1.safetensors",
                       "lighttaew2_1.safetensors"]
    assert opts["default"] == "none"
    assert "vae_approx" in opts["tooltip"] and "full VAE" in opts["tooltip"]


def test_a_tiny_vae_decodes_the_played_frames_and_a_new_choice_starts_a_new_session(comfy, inputs, players,
                                                                                      vae_approx):
    import numpy as np

    from lingbot_world.wan.vae.streaming import streaming_decode_bytes
    from lingbot_world.wan.vae.tiny import TinyStreamingDecoder
    from lingbot_world.world.frames import to_uint8
    from lingbot_world.world.assembly import load_tiny, tiny_bytes

    cpu = torch.device("cpu")
    vae = inputs[1]
    assert TINY in tiny_vae_choices()[0]
    play(inputs)  # none: the VAE decodes and is loaded beside the model
    by_vae = driver()
    assert by_vae.call_now(lambda s: (s.tiny_decoder, s.vae is vae.model)) == (None, True)
    assert by_vae.call_now(lambda s: s.placement.extra_vram) == streaming_decode_bytes(vae.model.cfg, C.H, C.W,
                                                                                       half=False)
    vae_frames = played_frames("w-8")
    z = played_latent()

    comfy.calls.clear()
    actions, state = play(inputs, tiny_vae=TINY)
    assert driver() is not by_vae and by_vae.closed  # a new session, from the start image
    assert actions == "" and state.state is None
    loads = [c[1] for c in comfy.calls if c[0] == "load_models_gpu"]
    assert loads and all(names == ["ExpertContainer"] for names in loads)  # the VAE stays off the card
    tiny = load_tiny(vae_approx / TINY, cpu)
    assert driver().call_now(lambda s: (s.tiny_decoder is not None, s.vae, s.placement.extra_vram)) == (
        True, None, tiny_bytes(tiny, C.H, C.W))
    tiny_frames = played_frames("w-8")
    assert torch.equal(played_latent(), z)  # the decoder changes the frames only
    assert np.array_equal(tiny_frames, to_uint8(TinyStreamingDecoder(tiny).decode(z)))
    assert tiny_frames.shape == vae_frames.shape and not np.array_equal(tiny_frames, vae_frames)

    by_tiny = driver()
    play(inputs)  # back to none
    assert driver() is not by_tiny and by_tiny.closed
    assert driver().call_now(lambda s: s.tiny_decoder) is None
    assert np.array_equal(played_frames("w-8"), vae_frames)


def test_a_bad_tiny_vae_is_one_line_naming_the_input_before_the_session_opens(comfy, inputs, players, vae_approx):
    from safetensors.torch import save_file

    from lingbot_world.nodes.play import _open

    save_file({"decoder.1.weight": torch.zeros(8, 48, 3, 3)}, str(vae_approx / "taew2_2.safetensors"))
    made(inputs)
    comfy.calls.clear()
    with pytest.raises(ValueError) as err:
        play(inputs, tiny_vae="taew2_2.safetensors")
    line = str(err.value)
    assert line.startswith("LingBot Play: tiny_vae taew2_2.safetensors: ") and "\n" not in line
    assert "a tiny decoder for 48-channel latents" in line
    with pytest.raises(ValueError) as err:  # gone since the page listed it
        play(inputs, tiny_vae="gone.safetensors")
    line = str(err.value)
    assert line.startswith("LingBot Play: tiny_vae gone.safetensors: tiny VAE 'gone.safetensors' was not found in: "
                           f"{vae_approx}") and line.endswith("or choose none.") and "\n" not in line
    assert NODE not in _open and not comfy.calls  # nothing planned, loaded or opened
    play(inputs, tiny_vae=TINY)
    assert driver().call_now(lambda s: s.tiny_decoder) is not None


def test_an_offered_tiny_vae_is_asked_for_at_queue_time_and_fetched_with_the_switch(comfy, inputs, players, tmp_path,
                                                                                    monkeypatch):
    """taew2_1 listed but not installed: the queue stops with where it comes from and its licence, naming the
    download switch; with the switch on, the node fetches the one file into vae_approx (from a local fake hub) and
    the session decodes with it."""
    import functools
    import sys

    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae
    from lingbot_world.nodes.play import LingBotPlay
    from lingbot_world.world import hub

    from tests.conftest import load_sibling

    folder = tmp_path / "vae_approx"
    folder.mkdir()
    sys.modules["folder_paths"].add_model_folder_path("vae_approx", str(folder))
    line = LingBotPlay.VALIDATE_INPUTS(tiny_vae=TINY, download=False)
    assert line.startswith(f"LingBot Play: tiny_vae: {TINY} is not installed.") and "\n" not in line
    assert "huggingface.co/lightx2v/Autoencoders" in line and "download switch" in line and "MIT" in line
    assert LingBotPlay.VALIDATE_INPUTS(tiny_vae=TINY, download=True) is True
    assert LingBotPlay.VALIDATE_INPUTS(tiny_vae="none", download=False) is True
    with pytest.raises(ValueError, match=f"tiny_vae {TINY}: tiny_vae: {TINY} is not installed"):
        play(inputs, tiny_vae=TINY)  # queued without the check (an API client): the same line, nothing fetched
    repo = tmp_path / "autoencoders"
    repo.mkdir()
    write_random_tiny_vae(repo / TINY)
    (repo / "lightvaew2_1.safetensors").write_bytes(b"not asked for")
    fake_hub = load_sibling("fake_hub")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with fake_hub.FakeHub({"lightx2v/Autoencoders": repo}) as served:
        monkeypatch.setattr(hub, "fetch_file", functools.partial(hub.fetch_file, endpoint=served.url))
        play(inputs, tiny_vae=TINY, download=True)
        assert [p for m, p, _ in served.requests if m == "GET" and "/resolve/" in p] == [
            f"/lightx2v/Autoencoders/resolve/{fake_hub.SHA}/{TINY}"]
    assert (folder / TINY).read_bytes() == (repo / TINY).read_bytes()
    assert driver().call_now(lambda s: s.tiny_decoder) is not None
    assert LingBotPlay.VALIDATE_INPUTS(tiny_vae=TINY, download=False) is True  # installed now

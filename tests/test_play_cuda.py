"""On a CUDA GPU (skipped without one): a session played through the real `lingbot-world play` server on the GPU, in
bf16, equals the batch run of its recorded keys frame for frame, with pause-free stepping, a rewind and the speed
presets (the player's "render this path" with Fast is that batch run: `generate --model fast --rule continuable
--actions <recorded>` with the player's seed, noise, window, sink and preset)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import load_sibling

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


support = load_sibling("test_player_support")
server_tests = load_sibling("test_player_server")  # its socket helpers (Tab, _restart); its tests aren't collected here
KEYS = ("w-8", "wj-12", "d-6,dl-6", "none-12", "i-12")


@pytest.mark.parametrize("speed,chunk_steps", [("exact", None), ("auto", None), ("fast", None), ("draft", None),
                                               ("draft", 2)])
def test_a_session_played_on_the_gpu_equals_the_batch_run(tmp_path_factory, speed, chunk_steps):
    cache = support.shared_cache(tmp_path_factory)
    out_dir = tmp_path_factory.mktemp(f"play_cuda_{speed}_{chunk_steps}") / "out"
    steps_args = ("--chunk-steps", str(chunk_steps)) if chunk_steps else ()
    srv = support.PlayServer(cache, out_dir, "--device", "cuda", "--noise", "cuda", "--speed", speed, *steps_args)

    async def go():
        http, tab, _ = await server_tests._restart(srv)
        try:
            for keys in KEYS:
                await tab.step(keys)
            _, before = await tab.step("a-12")
            await tab.send(op="rewind", chunks=len(KEYS))
            await tab.until("rewound")
            end, again = await tab.step("a-12")
            assert [d for _, _, d in again] == [d for _, _, d in before]  # rewind on the GPU is exact too
            await tab.send(op="save")
            saved = (await tab.until("saved"))["files"]
            await tab.send(op="render", target="fast720", run=True)
            while (r := await tab.until("render"))["status"] == "running":
                pass
            assert r["status"] == "done", r
            assert "--device cuda" in r["command"] and f"--speed {speed}" in r["command"], r["command"]
            assert (f"--chunk-steps {chunk_steps}" in r["command"]) == bool(chunk_steps), r["command"]
            # the played kernels, pinned: `auto` alone would not compile a 2-chunk batch video, and on this narrow
            # demo model the session compiled only into its CUDA graphs (speed.options.fit_to_model)
            assert f"--compile {'off' if speed == 'exact' else 'graphs'}" in r["command"], r["command"]
            return end["state"], saved, r["out"]
        finally:
            await tab.ws.close()
            await http.close()

    try:
        state, saved, rendered = server_tests.run(go())
    finally:
        assert srv.stop() in (0, 130), srv.output()
    played = server_tests._mp4_frames(next(p for p in saved if p.endswith(".mp4")))
    batch = server_tests._mp4_frames(rendered)
    assert played.shape == batch.shape and played.shape[0] == state["frames"]
    diff = int(np.abs(played.astype(np.int16) - batch.astype(np.int16)).max())
    steps = f", --chunk-steps {chunk_steps}" if chunk_steps else ""
    print(f"\nplayed vs batch on {torch.cuda.get_device_name()} ({speed}{steps}): max |diff| {diff}")
    assert diff == 0

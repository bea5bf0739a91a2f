"""Chunk previews in the live player's server (a real `lingbot-world play --demo --tiny-vae` process with a random tiny
decoder, driven over its WebSocket): each chunk's preview frames arrive marked, before the chunk's real frames of the
same numbers; the real frames are those of a server without previews (--no-preview, which sends none); a tab that
connects later is shown a real frame; the exit summary and the --timings JSON carry the preview's moments."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.slow


support = load_sibling("test_player_support")
WAIT_S = 300.0  # bounds a hung run only: every wait ends on a message
KEYS = ["w-8", "j-6,jw-6"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return support.shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory) -> Path:
    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    return write_random_tiny_vae(tmp_path_factory.mktemp("tiny_vae") / "taew2_1.safetensors")


@pytest.fixture(scope="module")
def previewing(cache, tiny_vae, tmp_path_factory):
    folder = tmp_path_factory.mktemp("player_preview")
    srv = support.PlayServer(cache, folder / "out", "--tiny-vae", str(tiny_vae),
                             "--timings", str(folder / "timings.json"))
    yield srv
    srv.stop()


def _frame(data: bytes) -> tuple[bool, int, int, bytes]:
    from lingbot_world.player.frames import is_preview, read_frame_message

    return (is_preview(data), *read_frame_message(data))


async def _json(ws, *types: str) -> dict:
    while True:
        msg = await ws.receive(timeout=WAIT_S)
        if msg.type == aiohttp.WSMsgType.TEXT:
            m = json.loads(msg.data)
            if m["type"] == "error":
                raise AssertionError(f"server error: {m['message']}")
            if m["type"] in types:
                return m
        elif msg.type != aiohttp.WSMsgType.BINARY:
            raise AssertionError(f"socket ended: {msg.type} {msg.data!r}")


async def _play(server, keys: list, timing: bool = False) -> tuple[list, list, tuple]:
    """A new video played chunk by chunk: every chunk's frame messages in arrival order, its chunk_end, and the frame
    a tab connecting afterwards is shown first."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(server.url_for("/ws"), max_msg_size=0)
        await _json(ws, "hello")
        await ws.send_str(json.dumps({"op": "start", "image": None, "prompt": ""}))
        await _json(ws, "state")
        assert _frame((await ws.receive(timeout=WAIT_S)).data)[:3] == (False, 0, 0)  # the start image
        chunks, ends = [], []
        for k in keys:
            await ws.send_str(json.dumps({"op": "step", "keys": k}))
            frames = []
            while True:
                msg = await ws.receive(timeout=WAIT_S)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    frames.append(_frame(msg.data))
                    continue
                m = json.loads(msg.data)
                assert m["type"] != "error", m
                if m["type"] == "chunk_end":
                    break
            chunks.append(frames)
            ends.append(m)
            if timing:  # the page's report of the chunk's two moments on screen
                await ws.send_str(json.dumps({"op": "timing", "chunk": m["chunk"], "request_to_preview_s": 0.2,
                                              "key_to_preview_s": 0.3, "request_to_screen_s": 0.5,
                                              "key_to_screen_s": 0.6}))
                row = (await _json(ws, "timings"))["row"]
                assert row["server_preview_s"] == m["preview_s"] and row["key_to_preview_s"] == 0.3, row
        await ws.close()
        ws = await http.ws_connect(server.url_for("/ws"), max_msg_size=0)
        await _json(ws, "hello")
        first = _frame((await ws.receive(timeout=WAIT_S)).data)
        await ws.close()
        return chunks, ends, first


def test_previews_come_marked_before_each_chunks_frames_which_stay_the_same(previewing, cache, tiny_vae,
                                                                            tmp_path):
    chunks, ends, first = asyncio.run(_play(previewing, KEYS, timing=True))
    numbers = [range(9), range(9, 21)]
    for c, (frames, end, want) in enumerate(zip(chunks, ends, numbers), start=1):
        previews, real = frames[:len(want)], frames[len(want):]
        assert [(p, n, f) for p, n, f, _ in previews] == [(True, c, f) for f in want]
        assert [(p, n, f) for p, n, f, _ in real] == [(False, c, f) for f in want]
        assert [d for *_, d in previews] != [d for *_, d in real]  # the first step's picture, not the chunk's
        assert 0 < end["preview_s"] <= end["first_frame_s"] <= end["total_s"], end
        assert end["seconds"]["preview"] > 0 and end["frames"] == len(want)
    assert first == real[-1]  # a tab that connects later sees the last real frame

    quiet = support.PlayServer(cache, tmp_path / "out", "--tiny-vae", str(tiny_vae), "--no-preview")
    try:
        without, quiet_ends, _ = asyncio.run(_play(quiet, KEYS))
    finally:
        quiet.stop()
    assert [f for f in without[0] + without[1] if f[0]] == []  # --no-preview: none
    assert all(e["preview_s"] is None and "preview" not in e["seconds"] for e in quiet_ends)
    # the real frames are the same with previews and without (the JPEG of the same pixels)
    assert without == [frames[len(want):] for frames, want in zip(chunks, numbers)]


def test_the_exit_summary_and_the_timings_file_report_the_preview(previewing):
    """Last in this file: it stops the module's server."""
    assert previewing.stop() == 130
    out = previewing.output()
    summary = next(line for line in out.splitlines() if line.startswith("player timings"))
    assert "key -> screen 0.60 s" in summary and "key -> preview 0.30 s" in summary, summary
    assert "server preview" in summary, summary
    record = json.loads((previewing.out_dir.parent / "timings.json").read_text())
    assert record["summary"]["key_to_preview_s"]["n"] == 2 and record["summary"]["server_preview_s"]["n"] == 2
    assert all(r["server_preview_s"] <= r["server_first_frame_s"] for r in record["chunks"]), record["chunks"]

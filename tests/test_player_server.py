"""The live player's server without a browser: a real `lingbot-world play --demo` process (the real World session on
the tiny demo checkpoint, CPU) driven over HTTP and its WebSocket with aiohttp's client."""
from __future__ import annotations

import asyncio
import io
import json
import shutil
import signal
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.slow


support = load_sibling("test_player_support")
WAIT_S = 300.0  # a whole chunk or render on a busy CI machine; every wait ends on a message, not on a clock


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return support.shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def server(cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("player")
    srv = support.PlayServer(cache, folder / "out", "--timings", str(folder / "timings.json"))
    yield srv
    srv.stop()


class Tab:
    """One page's WebSocket: JSON messages and frames (chunk, frame number, JPEG bytes)."""

    def __init__(self, ws):
        self.ws = ws
        self.frames: list[tuple[int, int, bytes]] = []
        self.previews = 0  # preview frames received (a server without a tiny decoder sends none)

    async def send(self, **op) -> None:
        await self.ws.send_str(json.dumps(op))

    async def until(self, *types: str) -> dict:
        """The next JSON message of one of `types` (frames on the way are kept; errors raise unless asked for)."""
        from lingbot_world.player.frames import is_preview, read_frame_message

        while True:
            msg = await self.ws.receive(timeout=WAIT_S)
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.previews += is_preview(msg.data)
                self.frames.append(read_frame_message(msg.data))
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"socket ended: {msg.type} {msg.data!r}")
            m = json.loads(msg.data)
            if m["type"] in types:
                return m
            if m["type"] == "error":
                raise AssertionError(f"server error: {m['message']}")

    async def frame(self) -> tuple[int, int, bytes]:
        """The next frame (the start image follows the state message of a start)."""
        from lingbot_world.player.frames import read_frame_message

        msg = await self.ws.receive(timeout=WAIT_S)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        return read_frame_message(msg.data)

    async def step(self, keys) -> tuple[dict, list]:
        self.frames = []
        await self.send(op="step", keys=keys)
        end = await self.until("chunk_end")
        return end, self.frames


def run(coro):
    return asyncio.run(coro)


async def _open(server, token=None) -> tuple[aiohttp.ClientSession, Tab]:
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(server.url_for("/ws", token if token is not None else ""), max_msg_size=0)
    return http, Tab(ws)


async def _restart(server) -> tuple[aiohttp.ClientSession, Tab, dict]:
    """A driving tab on a new video from the demo image and prompt."""
    http, tab = await _open(server)
    await tab.until("hello")
    await tab.send(op="start", image=None, prompt="")
    state = (await tab.until("state"))["state"]
    tab.frames.append(await tab.frame())
    return http, tab, state


def _mp4_frames(path) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(path)


# ---- the token --------------------------------------------------------------------------------------------------
def test_every_route_needs_the_token(server):
    async def go():
        async with aiohttp.ClientSession() as http:
            for path in ("/", "/static/player.js", "/static/player.css", "/images"):
                for token in (None, "wrong", server.token[:-1]):
                    async with http.get(server.url_for(path, token)) as r:
                        assert r.status == 403, (path, token)
                async with http.get(server.url_for(path)) as r:
                    assert r.status == 200, path
            async with http.get(server.base + "/static/player.js",
                                headers={"X-LingBot-Token": server.token}) as r:
                assert r.status == 200
            form = aiohttp.FormData()
            form.add_field("image", b"x", filename="a.png")
            async with http.post(server.url_for("/upload", "wrong"), data=form) as r:
                assert r.status == 403
            for token in (None, "wrong"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                    await http.ws_connect(server.url_for("/ws", token))
                assert e.value.status == 403
            async with http.get(server.url_for("/static/..%2Froutes.py")) as r:
                assert r.status == 404  # only the page's own files are served
            async with http.get(server.url_for("/")) as r:
                page = await r.text()
            assert server.token in page and "static/player.js" in page

    run(go())


# ---- playing ----------------------------------------------------------------------------------------------------
def test_chunks_rewind_save_and_render_equal_the_batch_run(server):
    async def go():
        http, tab, state = await _restart(server)
        try:
            assert state["chunks"] == 0 and state["next_keys"] == 8
            assert tab.frames and tab.frames[-1][0] == 0  # the start image, shown before the first chunk
            end, frames = await tab.step("w-8")
            assert [(c, f) for c, f, _ in frames] == [(1, i) for i in range(9)]
            assert end["state"]["chunks"] == 1 and end["state"]["next_keys"] == 12 and end["frames"] == 9
            assert end["state"]["minimap"].startswith("data:image/png;base64,")
            assert end["first_frame_s"] <= end["total_s"] and set(end["seconds"]) == {"dit", "decode", "total"}
            assert end["preview_s"] is None and tab.previews == 0  # decoded by the VAE: no preview
            _, second = await tab.step("j-6,jw-6")
            assert [f for _, f, _ in second] == list(range(9, 21))
            await tab.send(op="rewind", chunks=1)
            assert (await tab.until("rewound"))["state"]["chunks"] == 1
            _, again = await tab.step("j-6,jw-6")
            assert [d for _, _, d in again] == [d for _, _, d in second]  # rewind is exact
            end, _ = await tab.step("d-4")  # shorter keys: padded with frames without keys
            assert end["state"]["action_string"] == "w-8,j-6,wj-6,d-4,none-8"
            # bad input: one line back, the session goes on
            await tab.send(op="step", keys="x-3")
            err = await tab.until("error")
            assert "segment 1 'x-3'" in err["message"] and "\n" not in err["message"]
            await tab.send(op="step", keys="w-13")
            assert "13 frames of keys" in (await tab.until("error"))["message"]
            await tab.send(op="fly")
            assert "unknown operation" in (await tab.until("error"))["message"]
            # the page's clock: kept beside the server's numbers of the same chunk; a bad report is one line
            await tab.send(op="timing", chunk=2, request_to_arrival_s=0.5, request_to_screen_s=0.9,
                           key_to_screen_s=1.4, fps=15.5)
            timed = await tab.until("timings")
            assert timed["row"]["chunk"] == 2 and timed["row"]["key_to_screen_s"] == 1.4
            assert timed["row"]["server_first_frame_s"] <= timed["row"]["server_total_s"]
            assert timed["summary"]["chunks"] == 3  # chunk 3 was played again after the rewind, measured once
            await tab.send(op="timing", chunk=2, request_to_screen_s="soon")
            assert "request_to_screen_s" in (await tab.until("error"))["message"]
            await tab.send(op="save")
            saved = (await tab.until("saved"))["files"]
            await tab.send(op="render", target="fast720", run=False)
            shown = await tab.until("render")
            assert shown["status"] == "command" and "--rule continuable" in shown["command"]
            # the played kernels, pinned (on a GPU `auto` would not compile a short batch video)
            assert "--compile off --compute bf16 --attention" in shown["command"], shown["command"]
            await tab.send(op="render", target="fast720", run=True)
            while (r := await tab.until("render"))["status"] == "running":
                pass
            assert r["status"] == "done", r
            return end["state"]["action_string"], saved, r["out"]
        finally:
            await tab.ws.close()
            await http.close()

    actions, saved, rendered = run(go())
    video = next(Path(p) for p in saved if p.endswith(".mp4"))
    assert Path(video).parent == server.out_dir and (server.out_dir / Path(video).name).is_file()
    assert Path(next(p for p in saved if p.endswith(".actions.txt"))).read_text().strip() == actions
    played = _mp4_frames(video)
    assert played.shape[0] == 9 + 2 * 12
    # "render this path" with Fast on the demo is the batch run `generate --demo --model fast --rule continuable
    # --actions <the recorded string>` with the player's seed, window and sink: the played clip, frame for frame
    assert Path(rendered).parent == server.out_dir
    assert np.array_equal(played, _mp4_frames(rendered))


def test_second_tab_is_told_in_use_and_a_closed_tab_lets_another_drive(server):
    async def go():
        http, first = await _open(server)
        await first.until("hello")
        http2, second = await _open(server)
        busy = await second.until("busy")
        assert "in use" in busy["message"]
        closing = await second.ws.receive(timeout=WAIT_S)
        assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 4001
        await first.ws.close()
        third_http, third = await _open(server)
        await third.until("hello")
        for t, h in ((second, http2), (third, third_http)):
            await t.ws.close()
            await h.close()
        await http.close()

    run(go())


def test_closing_the_tab_mid_chunk_finishes_the_chunk(server):
    async def go():
        http, tab, _ = await _restart(server)
        await tab.send(op="step", keys="a-8")
        await tab.send(op="step", keys="a-12")  # queued behind the running chunk: dropped with the tab
        await tab.until("chunk_begin")  # the first chunk runs: the tab goes away now
        await tab.ws.close()
        await http.close()
        http, tab = await _open(server)
        await tab.until("hello")
        end, _ = await tab.step(None)  # waits for the first tab's chunk, then makes the next one
        await tab.ws.close()
        await http.close()
        return end["state"]

    state = run(go())
    assert state["chunks"] == 2 and state["action_string"] == "a-8,none-12"


def test_uploads_are_checked_and_kept_in_the_out_dir(server):
    from PIL import Image

    async def go():
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("image", b"not a picture", filename="x.png")
            async with http.post(server.url_for("/upload"), data=form) as r:
                assert r.status == 400
            buf = io.BytesIO()
            Image.new("RGB", (160, 96), (200, 40, 10)).save(buf, format="PNG")
            form = aiohttp.FormData()
            form.add_field("image", buf.getvalue(), filename="../../evil.png")
            async with http.post(server.url_for("/upload"), data=form) as r:
                assert r.status == 200
                name = (await r.json())["image"]
            async with http.get(server.url_for("/images")) as r:
                assert name in (await r.json())["uploads"]
        http, tab = await _open(server)
        await tab.until("hello")
        await tab.send(op="start", image="../" + name, prompt="a red wall")
        assert "not among the uploads" in (await tab.until("error"))["message"]
        await tab.send(op="start", image=name, prompt="a red wall")
        state = (await tab.until("state"))["state"]
        assert (await tab.frame())[:2] == (0, 0)
        await tab.ws.close()
        await http.close()
        return name, state

    name, state = run(go())
    assert (server.out_dir / "uploads" / name).is_file()
    assert Path(state["image"]) == server.out_dir / "uploads" / name and state["prompt"] == "a red wall"
    assert not list(server.out_dir.rglob(".*.part"))


# ---- bad input and exits ----------------------------------------------------------------------------------------
def test_port_taken_and_host_warning_are_one_line(server, tmp_path, capsys):
    from lingbot_world.cli import main

    rc = main(["play", "--demo", "--no-browser", "--port", str(server.port), "--host", "127.0.0.1",
               "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"port {server.port}" in err[0] and "--port" in err[0]
    rc = main(["play", "--demo", "--no-browser", "--port", str(server.port), "--host", "0.0.0.0",
               "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 2 and err[0].startswith("warning: --host 0.0.0.0")
    for target, why in ((tmp_path, "is a folder, not a file; give a file name inside it, e.g. "),
                        (tmp_path / "missing" / "t.json", "does not exist")):
        rc = main(["play", "--demo", "--no-browser", "--port", "0", "--out-dir", str(tmp_path / "o"),
                   "--timings", str(target)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].count("--timings") == 1 and why in err[0], err


def test_missing_or_damaged_model_files_give_generates_line(cache, tmp_path, capsys, monkeypatch):
    from lingbot_world.cli import main
    from lingbot_world.loaders.demo_checkpoint import DEMO_IMAGE

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    demo = support_demo_dir(cache)
    damaged = tmp_path / "damaged"
    shutil.copytree(demo, damaged)
    model = next((damaged / "lingbot_world_fast_bnb_nf4").glob("*.safetensors"))
    model.write_bytes(model.read_bytes()[:200])
    for folder in (tmp_path / "nothing", damaged):
        common = ["--ckpt-dir", str(folder), "--image", str(DEMO_IMAGE), "--prompt", "p", "--device", "cpu"]
        assert main(["play", *common, "--no-browser", "--port", "0", "--out-dir", str(tmp_path / "o")]) == 2
        play = _error_lines(capsys.readouterr().err)
        assert main(["generate", "--model", "fast", *common, "--out", str(tmp_path / "g.mp4")]) == 2
        gen = _error_lines(capsys.readouterr().err)
        assert len(play) == 1 and play[0].startswith("lingbot-world play: error: "), play
        assert play[0].split(": error: ", 1)[1] == gen[-1].split(": error: ", 1)[1], (play, gen)


def _error_lines(err: str) -> list[str]:
    """The CLI's own lines (bitsandbytes may log a warning about optional CPU kernels on import)."""
    return [line for line in err.strip().splitlines() if line.startswith("lingbot-world ")]


def support_demo_dir(cache: Path) -> Path:
    from lingbot_world.loaders.demo_checkpoint import default_demo_dir
    from lingbot_world.world.files import WorldFiles

    return Path(WorldFiles.demo(default_demo_dir()).root)


def test_sigterm_stops_the_render_child_and_leaves_no_temp_files(cache, tmp_path):
    srv = support.PlayServer(cache, tmp_path / "out")
    try:
        async def go():
            http, tab = await _open(srv)
            await tab.until("hello")
            await tab.step("w-8")
            await tab.send(op="render", target="cam", run=True)
            first = await tab.until("render")
            assert first["status"] == "running"
            children = support.descendants(srv.proc.pid)
            await tab.ws.close()
            await http.close()
            return children

        children = run(go())
        assert children, "the render child was not started"
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 143, srv.output()
    assert "terminated (SIGTERM)" in srv.output()
    assert not [p for p in children if support.alive(p)]
    leftovers = [p.name for p in (tmp_path / "out").rglob("*") if p.name.startswith(".") or ".tmp" in p.name]
    assert not leftovers and not list((tmp_path / "out").glob("render_*.mp4"))


def test_ctrl_c_mid_chunk_exits_130_after_the_chunk(server):
    """Last in this file: it stops the module's server."""
    async def go():
        http, tab = await _open(server)
        await tab.until("hello")
        await tab.send(op="step", keys="s-12")
        await tab.until("chunk_begin")
        children = support.descendants(server.proc.pid)
        server.proc.send_signal(signal.SIGINT)
        await tab.ws.receive(timeout=WAIT_S)  # frames or the close: the server goes away either way
        await http.close()
        return children

    children = run(go())
    assert server.stop() == 130, server.output()
    assert "interrupted" in server.output()
    assert "player timings" in server.output()  # the run's latency record, printed however it ends
    record = json.loads((server.out_dir.parent / "timings.json").read_text())
    assert set(record) == {"summary", "chunks"} and "timings written to" in server.output()
    assert not [p for p in children if support.alive(p)]

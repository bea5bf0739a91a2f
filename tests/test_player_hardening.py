"""The player's server against hostile or broken clients, through real HTTP and WebSocket requests to a real
`lingbot-world play --demo` process: Host and Origin checks, bad and oversized uploads, floods and malformed socket
messages, the render child's arguments and working folder, the loading page, the host flag, a clean shutdown."""
from __future__ import annotations

import asyncio
import json
import shlex
import signal
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.slow


support = load_sibling("test_player_support")
WAIT_S = 300.0
BAD_LINES = ("Traceback", "Task was destroyed", "Event loop is closed", "Exception ignored")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return support.shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def server(cache, tmp_path_factory):
    srv = support.PlayServer(cache, tmp_path_factory.mktemp("hardening") / "out")
    yield srv
    srv.stop()


def run(coro):
    return asyncio.run(coro)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def _receive_json(ws, *types: str) -> dict:
    while True:
        msg = await ws.receive(timeout=WAIT_S)
        if msg.type == aiohttp.WSMsgType.BINARY:
            continue
        assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data)
        m = json.loads(msg.data)
        if m["type"] in types:
            return m


# ---- Host and Origin ----------------------------------------------------------------------------------------------
def test_other_hosts_and_other_sites_are_refused(server):
    async def go():
        async with aiohttp.ClientSession() as http:
            for host in ("evil.example", f"evil.example:{server.port}", f"127.0.0.1:{server.port + 1}", "[::2]"):
                for path in ("/", "/images", "/static/player.js"):
                    async with http.get(server.url_for(path), headers={"Host": host}) as r:
                        assert r.status == 403 and "answers to http://127.0.0.1:" in await r.text(), (host, path)
                with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                    await http.ws_connect(server.url_for("/ws"), headers={"Host": host})
                assert e.value.status == 403
            async with http.get(server.url_for("/"), headers={"Host": f"localhost:{server.port}"}) as r:
                assert r.status == 200  # the names of the address it was started on
            for origin in ("http://evil.example", f"http://evil.example:{server.port}", "null"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                    await http.ws_connect(server.url_for("/ws"), origin=origin)
                assert e.value.status == 403, origin
                form = aiohttp.FormData()
                form.add_field("image", support.png_header(8, 8), filename="a.png")
                async with http.post(server.url_for("/upload"), data=form, headers={"Origin": origin}) as r:
                    assert r.status == 403 and "another site" in await r.text()
            ws = await http.ws_connect(server.url_for("/ws"), origin=server.base)  # same origin: the page's own
            assert (await _receive_json(ws, "hello"))["type"] == "hello"
            await ws.close()

    run(go())


def test_a_mount_on_another_server_leaves_host_and_origin_to_it(tmp_path):
    """ComfyUI's mount (nodes/play_node.py) makes its options without `hosts`: ComfyUI's own checks apply there, so
    the player answers whatever Host a proxy in front of ComfyUI sends; the token is still needed."""
    from aiohttp import web

    from lingbot_world.player.driver import SessionDriver
    from lingbot_world.player.guard import HostCheck
    from lingbot_world.player.options import PlayerOptions
    from lingbot_world.player.routes import Player

    async def status(hosts, headers, token="tok") -> int:
        app = web.Application()
        Player(SessionDriver(None), PlayerOptions(out_dir=tmp_path, token="tok", hosts=hosts)).add_routes(app.router)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/images?token={token}", headers=headers) as r:
                    return r.status
        finally:
            await runner.cleanup()

    evil = {"Host": "comfy.example.org", "Origin": "https://comfy.example.org"}
    assert run(status(None, evil)) == 200
    assert run(status(None, evil, token="wrong")) == 403
    assert run(status(HostCheck.for_bind("127.0.0.1", 8189), evil)) == 403


# ---- uploads --------------------------------------------------------------------------------------------------------
def test_bad_upload_bodies_are_one_line_400_never_500(server):
    async def post(http, data, content_type=None):
        headers = {"Content-Type": content_type} if content_type else {}
        async with http.post(server.url_for("/upload"), data=data, headers=headers) as r:
            return r.status, await r.text()

    async def go():
        async with aiohttp.ClientSession() as http:
            cases = [
                (support.png_header(8, 8), "image/png", "send a multipart/form-data form"),
                (b"{}", "application/json", "got application/json"),
                (b"", "multipart/form-data", "the form could not be read"),
                (b"", "multipart/form-data; boundary=xyz", "the form could not be read"),
                (b"--xyz--\r\n", "multipart/form-data; boundary=xyz", "has no field 'image'"),
                (b"--xyz\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nhello\r\n--xyz--\r\n",
                 "multipart/form-data; boundary=xyz", "has no field 'image'"),
            ]
            for body, kind, expect in cases:
                status, text = await post(http, body, kind)
                assert status == 400 and expect in text and "\n" not in text.strip(), (kind, status, text)
            form = aiohttp.FormData()
            form.add_field("image", b"", filename="empty.png")
            assert await post(http, form) == (400, "upload: the picture is empty")

    run(go())


@pytest.mark.parametrize("width, height, expect", [
    (16000, 11000, "the picture is 16000x11000 (176 megapixels); the player takes at most 40 megapixels"),
    (20000, 20000, "the picture has 400 megapixels; the player takes at most 40"),  # past PIL's own limit too
])
def test_a_huge_picture_is_refused_from_its_header_without_decoding(server, width, height, expect):
    before = peak_rss_bytes(server.proc.pid)

    async def go():
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("image", support.png_header(width, height), filename="huge.png")
            async with http.post(server.url_for("/upload"), data=form) as r:
                return r.status, await r.text()

    status, text = run(go())
    assert status == 413 and text.startswith("upload: ") and expect in text, text
    assert peak_rss_bytes(server.proc.pid) - before < 100 * 2**20  # decoded, it would take gigabytes
    uploads = server.out_dir / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())  # nothing refused is kept


# ---- socket messages -----------------------------------------------------------------------------------------------
def test_bad_messages_get_one_line_and_the_socket_carries_on(server):
    async def go():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(server.url_for("/ws"), max_msg_size=0)
            await _receive_json(ws, "hello")
            bad = [
                ("[" * 50_000 + "]" * 50_000, "of more than 64 KB"),
                ("[" * 5_000 + "]" * 5_000, "nested too deeply"),
                ("not json", "not JSON"),
                ("[1, 2]", "not a JSON object"),
                (json.dumps({"op": "fly"}), "unknown operation 'fly'"),
                (json.dumps({"op": "step", "keys": {"w": 8}}), "step: 'keys' must be text or null, got dict"),
                (json.dumps({"op": "rewind", "chunks": True}), "'chunks' must be a whole number, got bool"),
                (json.dumps({"op": "save", "state": True, "path": "/etc"}), "save: unknown field 'path'"),
                (json.dumps({"op": "start", "prompt": "x" * 9000}), "'prompt' is longer than 8192 characters"),
                (json.dumps({"op": "timing", "chunk": 500}), "timing: chunk 500 has not been played"),
                (json.dumps({"op": "render", "target": "../../x", "run": True}),
                 "render target '../../x': choose one of cam, fast720"),
            ]
            for text, expect in bad:
                await ws.send_str(text)
                err = await _receive_json(ws, "error")
                assert expect in err["message"] and "\n" not in err["message"], (expect, err)
            await ws.send_bytes(b"\x00" * 10)
            assert "binary message" in (await _receive_json(ws, "error"))["message"]
            await ws.send_str(json.dumps({"op": "rewind", "chunks": 0}))
            assert (await _receive_json(ws, "rewound"))["state"]["chunks"] == 0  # the socket still works
            await ws.close()

    run(go())


def test_a_flood_is_dropped_and_stalls_nobody(server):
    """12,000 timing messages (they stalled another request for 66 s and became 12,000 chunks in the exit summary)
    and 5,000 unknown ones: most are dropped at the socket's rate, the rest refused, and another connection is
    answered at once."""
    async def go():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(server.url_for("/ws"), max_msg_size=0)
            await _receive_json(ws, "hello")
            replies: list = []

            async def read():  # as a page does: what the server answers is read while the flood goes out
                while (m := await _receive_json(ws, "rewound", "error", "timings"))["type"] != "rewound":
                    replies.append(m)

            reader = asyncio.ensure_future(read())
            for i in range(12_000):
                await ws.send_str(json.dumps({"op": "timing", "chunk": i + 1, "fps": 16}))
            for _ in range(5_000):
                await ws.send_str(json.dumps({"op": "nothing"}))
            t0 = time.monotonic()
            async with http.get(server.url_for("/images")) as r:
                assert r.status == 200
            answered_in = time.monotonic() - t0
            await asyncio.sleep(1.1)  # the budget refills: the next message is taken again
            await ws.send_str(json.dumps({"op": "rewind", "chunks": 0}))
            await asyncio.wait_for(reader, WAIT_S)
            await ws.close()
            return answered_in, replies

    answered_in, replies = run(go())
    assert answered_in < 30, answered_in  # a bound on a hang (it was 66 s), not a measurement
    dropped = [m for m in replies if m["type"] == "error" and m["message"].startswith("ignored ")]
    assert dropped and all("more than 40 a second" in m["message"] for m in dropped)
    assert len(replies) < 2_000  # far fewer answers than messages: the flood cost the server little
    summaries = [m["summary"]["chunks"] for m in replies if m["type"] == "timings"]
    assert all(n <= 1 for n in summaries)  # only a chunk that exists gets a row


# ---- the render child -----------------------------------------------------------------------------------------------
def test_render_takes_any_prompt_a_file_of_keys_and_ignores_the_out_folders_modules(server):
    marker = server.out_dir / "numpy_was_imported"
    (server.out_dir / "numpy.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\nraise SystemExit(3)\n")
    prompt = "-hazy forest at dawn"

    async def go():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(server.url_for("/ws"), max_msg_size=0)
            await _receive_json(ws, "hello")
            await ws.send_str(json.dumps({"op": "start", "image": None, "prompt": prompt}))
            await _receive_json(ws, "state")
            await ws.send_str(json.dumps({"op": "step", "keys": "w-8"}))
            end = await _receive_json(ws, "chunk_end")
            await ws.send_str(json.dumps({"op": "render", "target": "fast720", "run": False}))
            shown = await _receive_json(ws, "render")
            await ws.send_str(json.dumps({"op": "render", "target": "fast720", "run": True}))
            while (r := await _receive_json(ws, "render"))["status"] == "running":
                pass
            await ws.close()
            return end["state"]["action_string"], shown, r

    actions, shown, done = run(go())
    assert done["status"] == "done", done
    assert not marker.exists()
    argv = shlex.split(shown["command"])
    assert argv[argv.index("-m") + 1] == "lingbot_world"
    from lingbot_world.cli import build_parser

    args = build_parser().parse_args(argv[argv.index("-m") + 2:])  # the printed command parses as it reads
    assert args.prompt == prompt and Path(args.actions).parent == server.out_dir
    assert Path(args.actions).read_text().strip() == actions and Path(args.actions).name.endswith(".actions.txt")
    assert Path(done["out"]).is_file()
    (server.out_dir / "numpy.py").unlink()


# ---- the loading page, the host flag -------------------------------------------------------------------------------
def test_the_loading_page_answers_while_the_model_loads():
    from lingbot_world.player.guard import HostCheck, RequestGuard
    from lingbot_world.player.loading import LoadingServer
    from lingbot_world.player.standalone import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    loading = LoadingServer(sock, RequestGuard("tok", HostCheck.for_bind("127.0.0.1", port)), "Player").start()
    loading.status = "the Fast model: 40% of 9.6 GB"

    async def go():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/?token=tok") as r:
                assert r.status == 503 and r.headers["Retry-After"] == "2"
                page = await r.text()
            assert "loading&hellip; the Fast model: 40% of 9.6 GB" in page and 'http-equiv="refresh"' in page
            async with http.get(f"http://127.0.0.1:{port}/?token=nope") as r:
                assert r.status == 403
            async with http.get(f"http://127.0.0.1:{port}/?token=tok", headers={"Host": "evil.example"}) as r:
                assert r.status == 403

    try:
        run(go())
        loading.stop()
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # the player's socket still listens (the connection waits in its backlog)
    finally:
        loading.stop()
        sock.close()


def test_a_long_load_prints_its_progress_and_the_page_shows_it(capsys):
    from lingbot_world.cli.play import LoadProgress

    class Page:
        status = ""

    now = [100.0]
    page = Page()
    progress = LoadProgress(page, clock=lambda: now[0])
    for tenth in range(11):  # 9.6 GB read in 80 s: a line every few seconds, at whole tenths
        now[0] = 100.0 + 8 * tenth
        progress(int(9.6e9 * tenth / 10), int(9.6e9))
        assert page.status == f"the Fast model: {tenth * 10}% of 9.6 GB"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "loading the Fast model: 10% of 9.6 GB, 8 s" and lines[-1].endswith("100% of 9.6 GB, 80 s")
    assert len(lines) == 10
    quick = LoadProgress(Page(), clock=lambda: 5.0)  # the demo's load: done at once, nothing printed
    quick(1, 1)
    assert capsys.readouterr().out == ""


def test_the_page_url_is_printed_before_the_load_and_loopback_needs_no_warning(server):
    lines = server.output().splitlines()
    page = next(i for i, line in enumerate(lines) if line.startswith("player page: http://127.0.0.1:"))
    load = next(i for i, line in enumerate(lines) if line.startswith("loading LingBot-World Fast..."))
    ready = next(i for i, line in enumerate(lines) if line.startswith("player ready: "))
    assert page < load < ready and not any("warning: --host" in line for line in lines)


@pytest.mark.parametrize("host, url_host", [("localhost", "127.0.0.1"), ("::1", "[::1]")])
def test_loopback_hosts_print_a_working_url_without_a_warning(cache, tmp_path, host, url_host):
    if host == "::1":
        try:
            socket.socket(socket.AF_INET6).bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
    srv = support.PlayServer(cache, tmp_path / "out", "--host", host)
    try:
        assert srv.url.startswith(f"http://{url_host}:") and "warning" not in srv.output()

        async def go():
            async with aiohttp.ClientSession() as http:
                async with http.get(srv.url) as r:
                    return r.status

        assert run(go()) == 200
    finally:
        srv.stop()


def test_an_address_of_another_machine_is_not_called_a_taken_port(tmp_path, capsys):
    from lingbot_world.cli import main

    rc = main(["play", "--demo", "--no-browser", "--port", "0", "--host", "8.8.8.8", "--out-dir", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("lingbot-world")]
    assert rc == 2 and len(err) == 1 and "--host 8.8.8.8: not an address of this machine" in err[0], err
    assert "in use" not in err[0]


# ---- shutdown ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_chunk_ends_cleanly(cache, tmp_path, sig, code):
    srv = support.PlayServer(cache, tmp_path / "out")

    async def go():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(srv.url_for("/ws"), max_msg_size=0)
            await _receive_json(ws, "hello")
            await ws.send_str(json.dumps({"op": "step", "keys": "d-8"}))
            await _receive_json(ws, "chunk_begin")
            srv.proc.send_signal(sig)
            await ws.receive(timeout=WAIT_S)  # frames or the close: the server goes away either way

    try:
        run(go())
    finally:
        rc = srv.stop(sig)
    out = srv.output()
    assert rc == code, out
    assert not [line for line in out.splitlines() if any(bad in line for bad in BAD_LINES)], out
    assert "player timings" in out


def test_the_exit_summary_counts_played_chunks_only(server):
    """Last in this file: it stops the module's server (after the flood above)."""
    rc = server.stop(signal.SIGINT)
    out = server.output()
    assert rc == 130
    summary = next(line for line in out.splitlines() if line.startswith("player timings"))
    assert "over 12000 chunks" not in summary and not any(bad in out for bad in BAD_LINES), out

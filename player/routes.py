"""The player's HTTP surface: page, static files, uploads and one WebSocket; every route needs the run's token
(and on the standalone server the right Host and Origin: guard.py).

Mounted under a prefix: '' on the standalone server, '/lingbot_world/play' on ComfyUI's. The first WebSocket
drives the session; while it is connected another tab gets a clear "in use" message. Messages (JSON text, page
-> server, checked by messages.py): start {image, prompt} · step {keys} · rewind {chunks} · save {state} ·
render {target, run} · cancel_render · timing {chunk, ...} (the page's own clock: player/timings.py). Server ->
page: hello, state, chunk_begin, chunk_end, rewound, saved, render, timings, error, note (JSON) and frames
(binary, frames.py): a chunk's preview, where the session makes one, before its real frames.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shlex
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from aiohttp import WSMsgType, web

from .driver import SessionDriver
from .frames import frame_message
from .guard import RequestGuard
from .messages import MAX_WAITING_OPS, MessageBudget, MessageError, parse_message
from .options import PlayerOptions
from .render_job import TARGETS, RenderJob, printable, render_command, write_actions_file
from .timings import PlayTimings
from .uploads import ImageRefused, check_image_header, existing_upload, keep_upload, read_upload, refusal

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
UPLOADS = "uploads"
BUSY_CLOSE_CODE = 4001
SOCKET_MAX_BYTES = 1 << 20  # aiohttp closes a socket past this; messages.py refuses far smaller ones first
log = logging.getLogger("lingbot_world.player")


def _static_files() -> dict[str, Path]:
    """The page's files: a fixed listing made once, so a request can only name one of them."""
    return {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in STATIC_TYPES}


class Player:
    """One session's page and socket; `add_routes` mounts them on an aiohttp router."""

    def __init__(self, driver: SessionDriver, options: PlayerOptions, prefix: str = ""):
        self.driver, self.options, self.prefix = driver, options, prefix.rstrip("/")
        self.render = RenderJob()
        self.timings = PlayTimings()
        self._workers: set = set()
        self._static = _static_files()
        self._socket: Optional[web.WebSocketResponse] = None
        self._last_render: Optional[dict] = None
        self.guard = RequestGuard(options.token, options.hosts)

    # ---- routing and the token ----
    def add_routes(self, router) -> None:
        p = self.prefix
        router.add_get(p + "/", self.page)
        router.add_get(p + "/static/{name}", self.static)
        router.add_get(p + "/ws", self.websocket)
        router.add_post(p + "/upload", self.upload)
        router.add_get(p + "/images", self.images)

    def _check(self, request: web.Request) -> None:
        self.guard.check(request)

    def page_url(self, base: str) -> str:
        return f"{base}{self.prefix}/?token={self.options.token}"

    # ---- page and files ----
    async def page(self, request: web.Request) -> web.Response:
        self._check(request)
        html = self._static["index.html"].read_text(encoding="utf-8")
        html = html.replace("{{TOKEN}}", self.options.token).replace("{{TITLE}}", self.options.title)
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def static(self, request: web.Request) -> web.Response:
        self._check(request)
        path = self._static.get(request.match_info["name"])
        if path is None or path.name == "index.html":
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes(), content_type=STATIC_TYPES[path.suffix],
                            headers={"Cache-Control": "no-store"})

    def _uploads(self) -> Path:
        return self.options.out_dir / UPLOADS

    async def images(self, request: web.Request) -> web.Response:
        """The start images the page can pick: the door's own and the uploads."""
        self._check(request)
        folder = self._uploads()
        names = sorted(p.name for p in folder.iterdir() if existing_upload(folder, p.name)) if folder.is_dir() else []
        return web.json_response({"default": self.options.image.name if self.options.image else None,
                                  "uploads": names})

    async def upload(self, request: web.Request) -> web.Response:
        """A picture from the page, checked from its header (format, pixel count) before anything decodes it, kept
        only inside the out dir (uploads/); a refusal is one line (400 / 413) the page shows."""
        self._check(request)
        try:
            data = await read_upload(request)
            fmt = check_image_header(data)
        except ImageRefused as e:
            raise refusal(e) from None
        return web.json_response({"image": keep_upload(self._uploads(), data, fmt)})

    def _start_image(self, name: Optional[str]) -> Path:
        if not name:
            if self.options.image is None:
                raise ValueError("no start image: pick or upload one")
            return self.options.image
        if self.options.image is not None and name == self.options.image.name:
            return self.options.image
        path = existing_upload(self._uploads(), name)
        if path is None:
            raise ValueError(f"start image {name[:80]!r} is not among the uploads; upload it first")
        check_image_header(path)  # a file put there by hand is bounded like an upload
        return path

    # ---- the socket ----
    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        self._check(request)
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=SOCKET_MAX_BYTES)
        await ws.prepare(request)
        if self._socket is not None and not self._socket.closed:
            await ws.send_json({"type": "busy", "message": "this player is in use in another tab or window; "
                                "close it there (or wait for it to close) and reload this page"})
            await ws.close(code=BUSY_CLOSE_CODE, message=b"in use")
            return ws
        self._socket = ws
        ops: asyncio.Queue = asyncio.Queue()
        # the loop holds tasks weakly: a socket's operations keep running after its handler returns (a chunk
        # always finishes), so the task is kept here until it ends
        worker = asyncio.ensure_future(self._serve_ops(ws, ops))
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)
        budget = MessageBudget()
        try:
            await self._send(ws, {"type": "hello", "state": self.driver.snapshot, "render": self._render_info()})
            if self.driver.last_frame is not None:
                await self._send(ws, frame_message(*self.driver.last_frame))
            if self._last_render is not None:
                await self._send(ws, dict(self._last_render, type="render"))
            async for msg in ws:
                if not budget.take():
                    line = budget.report()
                    if line:
                        await self._send(ws, {"type": "error", "message": line})
                    continue
                try:
                    if msg.type != WSMsgType.TEXT:
                        raise MessageError("ignored a binary message; the page sends JSON text")
                    op = parse_message(msg.data)
                    if op["op"] != "timing" and ops.qsize() >= MAX_WAITING_OPS:
                        raise MessageError(f"{op['op']}: {MAX_WAITING_OPS} operations are already waiting for the "
                                           "running one; try again when it has finished")
                except MessageError as e:
                    await self._send(ws, {"type": "error", "message": str(e)})
                    continue
                if op["op"] == "timing":
                    await self._timing(ws, op)  # at once: it must not wait behind a running chunk
                else:
                    ops.put_nowait(op)
        finally:
            if self._socket is ws:
                self._socket = None  # another tab may drive now; a running chunk still finishes
            ops.put_nowait(None)
        return ws

    async def _serve_ops(self, ws, ops: asyncio.Queue) -> None:
        """The socket's operations one after another; after the socket closes only the running one finishes."""
        while (op := await ops.get()) is not None:
            if ws.closed:
                break  # the tab left: what it queued after the running operation is dropped
            try:
                await self._op(ws, op)
            except Exception as e:  # noqa: BLE001 - the page shows the one line; the server keeps running
                if not isinstance(e, (ValueError, FileNotFoundError)):
                    log.exception("player operation %r failed", op)
                await self._send(ws, {"type": "error", "message": _one_line(e), "op": op.get("op")})

    async def _op(self, ws, op: dict) -> None:
        kind = op.get("op")
        if kind == "start" and self.options.restart is not None:  # the door fixed the start (ComfyUI's inputs)
            await self.driver.restart(self.options.restart)
            self.timings.forget_after(0)
            await self._send(ws, {"type": "state", "state": self.driver.snapshot})
            if self.driver.last_frame is not None:
                await self._send(ws, frame_message(*self.driver.last_frame))
        elif kind == "start":
            image = self._start_image(op.get("image"))
            prompt = str(op.get("prompt") or self.options.prompt or "").strip()
            if not prompt:
                raise ValueError("no prompt: write one before starting")
            await self._send(ws, {"type": "note", "message": "starting: encoding the prompt and the image..."})
            await self.driver.start(image, prompt)
            self.timings.forget_after(0)
            await self._send(ws, {"type": "state", "state": self.driver.snapshot})
            await self._send(ws, frame_message(*self.driver.last_frame))
        elif kind == "step":
            await self._step(ws, op.get("keys") or None)
        elif kind == "rewind":
            chunks = op.get("chunks")
            if not isinstance(chunks, int) or chunks < 0:
                raise ValueError(f"rewind: 'chunks' must be a whole number >= 0, got {chunks!r}")
            state = await self.driver.rewind(chunks)
            self.timings.forget_after(state.get("chunks", chunks))
            await self._send(ws, {"type": "rewound", "state": state})
        elif kind == "save":
            prefix = self.options.out_dir / f"play_{time.strftime('%Y%m%d_%H%M%S')}"
            saved = await self.driver.save(prefix, state=bool(op.get("state")))
            await self._send(ws, {"type": "saved", "files": _paths(saved)})
        elif kind == "render":
            await self._render(ws, str(op.get("target") or "cam"), bool(op.get("run")))
        elif kind == "cancel_render":
            await self.render.stop()
        else:
            raise ValueError(f"unknown operation {kind!r}")

    async def _step(self, ws, keys) -> None:
        if keys is not None and not isinstance(keys, str):
            raise ValueError("step: 'keys' must be an action string such as 'w-8' (or null for no keys)")
        chunk = self.driver.snapshot.get("chunks", 0) + 1
        await self._send(ws, {"type": "chunk_begin", "chunk": chunk, "keys": keys})

        async def on_frames(chunk_no, first, data, preview=False):
            for i, jpg in enumerate(data):
                await self._send(ws, frame_message(chunk_no, first + i, jpg, preview))

        async def on_preview(chunk_no, first, data):
            await on_frames(chunk_no, first, data, True)

        report = await self.driver.step(keys, on_frames, on_preview)
        self.timings.server(report.chunk, report.first_frame_s, report.total_s, report.preview_s)
        await self._send_timings(ws, report.chunk)
        await self._send(ws, {"type": "chunk_end", "chunk": report.chunk, "frames": report.frames,
                              "first_frame_s": round(report.first_frame_s, 4), "total_s": round(report.total_s, 4),
                              "preview_s": None if report.preview_s is None else round(report.preview_s, 4),
                              "seconds": report.seconds, "state": self.driver.snapshot})

    async def _timing(self, ws, op: dict) -> None:
        try:
            played = self.driver.snapshot.get("chunks", 0) + 1  # the page may show a chunk before it ends here
            if op["chunk"] > played:
                raise ValueError(f"timing: chunk {op['chunk']} has not been played (chunk {played} is the latest)")
            row = self.timings.page(op)
        except ValueError as e:
            await self._send(ws, {"type": "error", "message": _one_line(e), "op": "timing"})
            return
        await self._send_timings(ws, row.chunk)

    async def _send_timings(self, ws, chunk: int) -> None:
        """A chunk's row as known now (the page's report may come before or after the chunk's end)."""
        await self._send(ws, {"type": "timings", "row": asdict(self.timings.row(chunk)),
                              "summary": self.timings.summary()})

    def _render_info(self) -> dict:
        return {"available": self.options.render is not None, "running": self.render.running,
                "fixed_start": self.options.restart is not None}

    async def _render(self, ws, target: str, run: bool) -> None:
        snap = self.driver.snapshot
        actions = snap.get("action_string") or ""
        if self.options.render is None:
            await self._send(ws, {"type": "render", "status": "command", "actions": actions,
                                  "command": f"--actions {shlex.quote(actions)}"})
            return
        if target not in TARGETS:  # before the name is made from it
            raise ValueError(f"render target {target[:40]!r}: choose one of {', '.join(TARGETS)}")
        if not actions:
            raise ValueError("nothing to render yet: play at least one chunk first")
        stem = f"render_{target}_{time.strftime('%Y%m%d_%H%M%S')}"
        out = (self.options.out_dir / f"{stem}.mp4").resolve()
        cmd = render_command(self.options.render, target, out.with_name(f"{stem}.actions.txt"),
                             Path(snap["image"]).resolve(), snap["prompt"], out)
        write_actions_file(out.with_name(f"{stem}.actions.txt"), actions)  # the keys, however long, in a file
        if not run:
            await self._send(ws, {"type": "render", "status": "command", "actions": actions,
                                  "command": printable(cmd)})
            return

        async def report(info: dict) -> None:
            self._last_render = info
            if self._socket is not None:  # whichever tab drives now
                await self._send(self._socket, dict(info, type="render"))

        await self.render.start(cmd, out, report)

    async def _send(self, ws, message) -> None:
        """Sends to the tab if it is still there; a closed tab is not an error (its chunk still finishes)."""
        if ws.closed:
            return
        try:
            if isinstance(message, (bytes, bytearray)):
                await ws.send_bytes(message)
            else:
                await ws.send_str(json.dumps(message))
        except (ConnectionError, RuntimeError):
            pass

    async def close(self) -> None:
        """Stops the render child and closes the page's socket, then waits for the socket's operations: a running
        chunk finishes (its frames go nowhere), the ones queued behind it are dropped."""
        await self.render.stop()
        if self._socket is not None:
            await self._socket.close(code=1001, message=b"server closing")
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)


def _paths(saved) -> list[str]:
    if isinstance(saved, (str, Path)):
        return [str(saved)]
    fields = getattr(saved, "__dataclass_fields__", None)
    values = [getattr(saved, f) for f in fields] if fields else list(saved)
    return [str(v) for v in values if isinstance(v, (str, Path))]


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__

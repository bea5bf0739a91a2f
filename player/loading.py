"""The player's page while the model loads: the socket is bound before the load (a taken port is reported at
once), so a browser opened early would otherwise wait on a connection nobody answers.

`LoadingServer` answers on that socket from a thread of its own while the door loads on its main thread (where
Ctrl-C stays immediate): every request that passes the guard gets a small "loading…" page (HTTP 503, reloaded every
2 s) saying what is being loaded. `stop()` hands the socket back; connections made meanwhile wait in its backlog
for the player.
"""
from __future__ import annotations

import asyncio
import html
import socket
import threading
import time
from typing import Optional

from aiohttp import web

from .guard import RequestGuard

RETRY_S = 2
PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{retry}">
<title>{title}: loading</title><style>body{{font:16px system-ui,sans-serif;background:#15171a;color:#e6e6e6;
padding:40px;text-align:center}}</style></head><body><h1>{title}</h1><p id="loading">loading&hellip; {status}</p>
<p>This page reloads itself; the player opens when the model is ready.</p></body></html>"""


class LoadingServer:
    def __init__(self, sock: socket.socket, guard: RequestGuard, title: str):
        self._sock = sock.dup()  # closed by this server's stop; the player's own socket stays open
        self._guard, self._title = guard, title
        self._t0 = time.monotonic()
        self.status = ""
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None

    def start(self) -> "LoadingServer":
        self._thread = threading.Thread(target=self._run, name="lingbot-world-loading-page", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._page)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, self._sock).start())
        except BaseException as e:  # noqa: BLE001 - handed to start()'s caller
            self._error = e
            self._ready.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._sock.close()

    async def _page(self, request: web.Request) -> web.Response:
        self._guard.check(request)
        status = f"{self.status} ({time.monotonic() - self._t0:.0f} s)" if self.status else \
            f"({time.monotonic() - self._t0:.0f} s)"
        body = PAGE.format(retry=RETRY_S, title=html.escape(self._title), status=html.escape(status))
        return web.Response(status=503, text=body, content_type="text/html",
                            headers={"Retry-After": str(RETRY_S), "Cache-Control": "no-store"})

    def stop(self) -> None:
        """Stops answering (idempotent); returns once the thread has closed its copy of the socket."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        self._thread = None

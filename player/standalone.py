"""The standalone player server: a socket bound before the model loads, the page, a clean exit.

`bind` runs first so a taken port or a wrong address is reported in one line before anything slow; while the model
loads, `loading.LoadingServer` answers on the socket; `serve` then runs the event loop until Ctrl-C / SIGTERM,
then stops a render child, closes the page's socket, lets a running chunk finish (the loop still running, so its
last frames and callbacks land), closes the session and ends every task before the loop closes.
"""
from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
import threading
import webbrowser
from typing import Callable

from aiohttp import web

from .driver import SessionDriver
from .guard import HostCheck, url_host
from .options import PlayerOptions
from .routes import Player
from .uploads import MAX_UPLOAD_BYTES


class PortTakenError(ValueError):
    """The port cannot be bound; the message names it and the flag to change."""


class HostAddressError(ValueError):
    """--host names no address of this machine; the message says so."""


def bind(host: str, port: int, flag: str = "--port") -> socket.socket:
    """A listening socket on host:port (port 0: any free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise HostAddressError(f"--host {host!r} is not an address of this machine ({e.strerror}); use 127.0.0.1 "
                               "(this machine only) or one of its own addresses") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(64)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            raise HostAddressError(f"--host {host}: not an address of this machine ({e.strerror}); use 127.0.0.1 "
                                   "(this machine only), 0.0.0.0 (every network) or one of its own addresses") from None
        if e.errno == errno.EACCES:
            raise PortTakenError(f"port {port} on {host} needs administrator rights ({e.strerror}); pick one above "
                                 f"1023 with {flag} N") from None
        raise PortTakenError(f"port {port} on {host} is already in use ({e.strerror}); pick another with {flag} N, "
                             "or stop the program using it") from None
    sock.setblocking(False)
    return sock


def host_check(host: str, sock: socket.socket) -> HostCheck:
    """The names the server bound by `bind(host, ...)` answers to (the Host and Origin checks)."""
    address, port = sock.getsockname()[:2]
    named = HostCheck.for_bind(host, port)
    return HostCheck(named.names | HostCheck.for_bind(address, port).names, port)


def page_url(options: PlayerOptions, sock: socket.socket) -> str:
    """The page's URL on this socket (an IPv6 address in brackets, a wildcard as this machine's loopback)."""
    host, port = sock.getsockname()[:2]
    return f"http://{url_host(host)}:{port}/?token={options.token}"


def can_open_browser() -> bool:
    """Only where a graphical browser can appear (a console browser would take over the terminal), never in CI."""
    if os.environ.get("CI"):
        return False
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def serve(driver: SessionDriver, options: PlayerOptions, sock: socket.socket, *, open_browser: bool = True,
          log: Callable[[str], None] = print) -> int:
    """Serves until Ctrl-C / SIGTERM / SIGHUP; returns the signal's number after the clean-up (the door turns it
    into its exit code). The loop's own signal handlers stop it: an exception raised by a Python signal handler
    inside asyncio's transports could be swallowed there."""
    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=MAX_UPLOAD_BYTES + (1 << 20))
    player = Player(driver, options)
    player.add_routes(app.router)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    stopped_by: list[int] = []
    with _signals_held(STOP_SIGNALS) as previous:
        try:
            if previous is not None:
                for s in STOP_SIGNALS:
                    loop.add_signal_handler(s, _stop, loop, stopped_by, s)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, sock).start())
            url = page_url(options, sock)
            log(f"player ready: {url}")
            log("press Ctrl-C to stop (the clip is saved only with the page's Save button)")
            if open_browser and can_open_browser():
                loop.run_in_executor(None, webbrowser.open, url)
            loop.run_forever()
        finally:
            for s in STOP_SIGNALS if previous is not None else ():
                loop.remove_signal_handler(s)
                signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
            loop.run_until_complete(player.close())  # waits for a running chunk, the loop still turning
            loop.run_until_complete(runner.cleanup())
            driver.close()
            _report_timings(player, options, log)
            _end_tasks(loop)
            loop.close()
    return stopped_by[0] if stopped_by else 0


def _end_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancels what is still pending (a heartbeat, a browser opener) and lets it finish before the loop closes:
    a task the loop never finished would be reported as destroyed while pending."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


def _report_timings(player: Player, options: PlayerOptions, log: Callable[[str], None]) -> None:
    log(player.timings.line())
    if options.timings_out is not None:
        try:
            log(f"timings written to {player.timings.write(options.timings_out)}")
        except OSError as e:
            log(f"warning: could not write the timings to {options.timings_out} ({e.strerror or e})")


def _stop(loop, stopped_by: list, signum: int) -> None:
    if not stopped_by:
        stopped_by.append(signum)
        loop.stop()


class _signals_held:
    """Saves the process's handlers of `signals` and puts them back afterwards (main thread only; elsewhere,
    e.g. embedded, nothing is touched and `previous` is None)."""

    def __init__(self, signals):
        self.signals = signals
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.getsignal(s) for s in self.signals}
        return self.previous

    def __exit__(self, *exc):
        for s, h in (self.previous or {}).items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        return False

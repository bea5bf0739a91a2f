"""Who may talk to a player: the run's token, and on the standalone server the Host and Origin of each request.

The token keeps other local users out. The Host check keeps out pages of other sites whose name an attacker points
at this machine (DNS rebinding: the browser then sends `Host: evil.example`); the Origin check keeps out WebSocket
upgrades and uploads that another site's page starts in the player's browser (cross-site WebSocket hijacking). Both
answer to the names the server was started for. A player mounted on another server (ComfyUI's) leaves the host and
origin to that server: `HostCheck` is None there.
"""
from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from aiohttp import web

TOKEN_HEADER = "X-LingBot-Token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine reaches a server bound there."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """The host as a URL writes it: an IPv6 address in brackets; a wildcard as this machine's loopback."""
    if host in WILDCARDS:
        host = "::1" if host == "::" else "127.0.0.1"
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class HostCheck:
    """The host names (lower case, no brackets) and the port a request may name in its Host and Origin headers."""

    names: frozenset
    port: int

    @classmethod
    def for_bind(cls, host: str, port: int) -> "HostCheck":
        """The names a server bound at host:port answers to: that host, this machine's loopback names when it is
        loopback or a wildcard, and for a wildcard every address and name of this machine."""
        names = {host.strip("[]").lower()}
        if host in WILDCARDS or is_loopback(host):
            names |= LOOPBACK_NAMES
        if host in WILDCARDS:
            names |= _machine_names()
        return cls(frozenset(n for n in names if n), port)

    def allows(self, authority: str) -> bool:
        """Whether `authority` ("name", "name:port", "[v6]:port") names this server."""
        name, port = _split_authority(authority)
        if name is None:
            return False
        return name in self.names and (port or 80) == self.port

    def shown(self) -> str:
        first = "127.0.0.1" if "127.0.0.1" in self.names else sorted(self.names)[0]
        return f"{url_host(first)}:{self.port}"


def _split_authority(authority: str) -> tuple[Optional[str], Optional[int]]:
    text = authority.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None, None
        name, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            return None, None
        port = rest[1:] if rest else ""
    elif text.count(":") == 1:
        name, port = text.split(":")
    elif ":" in text:
        return None, None  # an IPv6 address without brackets is no Host header
    else:
        name, port = text, ""
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None, None
    return name.lower().rstrip("."), int(port) if port else None


def _machine_names() -> set:
    """This machine's host names and interface addresses (what other machines may call it)."""
    names = set()
    for fn in (socket.gethostname, socket.getfqdn):
        try:
            names.add(fn().lower())
        except OSError:
            pass
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for a in addresses:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(a.address.split("%")[0].lower())
    except (ImportError, OSError):
        pass
    return names


class RequestGuard:
    """`check(request)` raises the HTTP error for a request that may not reach the player."""

    def __init__(self, token: str, hosts: Optional[HostCheck]):
        self.token, self.hosts = token, hosts

    def check(self, request: web.Request) -> None:
        if self.hosts is not None:
            host = request.headers.get("Host", "")
            if not self.hosts.allows(host):
                raise web.HTTPForbidden(text=f"403: this player answers to http://{self.hosts.shown()} only "
                                             f"(this request named host {host[:80]!r}); use the URL it printed\n")
            origin = request.headers.get("Origin")
            if origin is not None and not self._same_origin(origin):
                raise web.HTTPForbidden(text=f"403: a page of another site ({origin[:80]}) may not use this player; "
                                             "open the URL the player printed\n")
        given = request.query.get("token") or request.headers.get(TOKEN_HEADER) or ""
        if not secrets.compare_digest(given.encode(), self.token.encode()):
            raise web.HTTPForbidden(text="403: this player needs the token from the URL its server printed\n")

    def _same_origin(self, origin: str) -> bool:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and self.hosts.allows(parts.netloc) and not parts.path.strip("/")

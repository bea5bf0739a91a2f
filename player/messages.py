"""The page's socket messages, checked before anything acts on them: size, rate, and each operation's shape.

A message is one JSON object {"op": NAME, ...} with the fields its operation takes, of the types it takes (no
nested values). Anything else is refused with one line, and the socket carries on. A page sends a few messages a
second while it plays; a flood beyond MessageBudget's rate is dropped (one error line a second says how many),
so one socket cannot keep the server from answering others.
"""
from __future__ import annotations

import json
import math
import time
from typing import Callable, Optional

MAX_MESSAGE_BYTES = 64 * 1024
MAX_TEXT = 8192  # a prompt; an image name or target is far shorter
MAX_KEYS_TEXT = 1024  # one chunk's action string (12 frames)
RATE_PER_S = 40.0  # sustained messages a second (a playing page sends 2-3)
BURST = 80
MAX_WAITING_OPS = 16  # operations queued behind a running chunk

_TEXT = (str, type(None))
_NUMBER = (int, float, type(None))
OPS: dict[str, dict[str, tuple]] = {
    "start": {"image": _TEXT, "prompt": _TEXT},
    "step": {"keys": _TEXT},
    "rewind": {"chunks": (int,)},
    "save": {"state": (bool, type(None))},
    "render": {"target": _TEXT, "run": (bool, type(None))},
    "cancel_render": {},
    "timing": {"chunk": (int,), "request_to_arrival_s": _NUMBER, "request_to_screen_s": _NUMBER,
               "key_to_screen_s": _NUMBER, "fps": _NUMBER, "request_to_preview_s": _NUMBER,
               "key_to_preview_s": _NUMBER},
}
TEXT_LIMITS = {"keys": MAX_KEYS_TEXT}


class MessageError(ValueError):
    """A message the server does not act on; the text is the page's one line."""


def parse_message(text: str) -> dict:
    """The checked operation of one text message; MessageError naming what is wrong."""
    if len(text) > MAX_MESSAGE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES:
        raise MessageError(f"ignored a message of more than {MAX_MESSAGE_BYTES // 1024} KB")
    try:
        op = json.loads(text)
    except RecursionError:
        raise MessageError("ignored a message nested too deeply") from None
    except ValueError:
        raise MessageError("ignored a message that is not JSON") from None
    if not isinstance(op, dict):
        raise MessageError("ignored a message that is not a JSON object")
    name = op.get("op")
    if not isinstance(name, str) or name not in OPS:
        shown = name[:40] if isinstance(name, str) else name if name is None else type(name).__name__
        raise MessageError(f"unknown operation {shown!r}; the page sends one of {', '.join(OPS)}")
    fields = OPS[name]
    for key, value in op.items():
        if key == "op":
            continue
        if key not in fields:
            raise MessageError(f"{name}: unknown field {str(key)[:40]!r} (it takes {', '.join(fields) or 'none'})")
        allowed = fields[key]
        if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
            raise MessageError(f"{name}: {key!r} must be {_kinds(allowed)}, got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise MessageError(f"{name}: {key!r} must be a finite number")
        if isinstance(value, str) and len(value) > TEXT_LIMITS.get(key, MAX_TEXT):
            raise MessageError(f"{name}: {key!r} is longer than {TEXT_LIMITS.get(key, MAX_TEXT)} characters")
    return op


def _kinds(allowed: tuple) -> str:
    names = {str: "text", int: "a number" if float in allowed else "a whole number", float: "a number",
             bool: "true or false", type(None): "null"}
    return " or ".join(dict.fromkeys(names[t] for t in allowed))


class MessageBudget:
    """A token bucket per socket: `take()` is False for a message beyond the rate; `report()` is the line to send
    about dropped messages, at most once a second (None otherwise)."""

    def __init__(self, rate: float = RATE_PER_S, burst: int = BURST, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.last = clock()
        self.dropped = 0
        self._reported_at: Optional[float] = None

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        return False

    def report(self) -> Optional[str]:
        now = self.clock()
        if not self.dropped or (self._reported_at is not None and now - self._reported_at < 1.0):
            return None
        self._reported_at = now
        line = (f"ignored {self.dropped} message(s): more than {self.rate:.0f} a second; the page sends a few a second "
                f"while it plays")
        self.dropped = 0
        return line

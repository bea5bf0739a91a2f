"""The player's session driver (player/driver.py) without a model: calls run one at a time on its worker, and a
close that must not wait returns at once while the session still closes after the running call."""
from __future__ import annotations

import threading

from lingbot_world.player.driver import SessionDriver

WAIT_S = 60.0  # bounds a hung test only: every wait ends on an event


class _Session:
    def __init__(self):
        self.closed = threading.Event()
        self.calls: list[str] = []

    def close(self):
        self.calls.append("close")
        self.closed.set()


def test_close_without_waiting_closes_the_session_after_the_running_call():
    session = _Session()
    driver = SessionDriver(session)
    inside, release = threading.Event(), threading.Event()

    def chunk(s):
        inside.set()
        assert release.wait(WAIT_S)
        s.calls.append("chunk")

    running = threading.Thread(target=driver.call_now, args=(chunk,))
    running.start()
    assert inside.wait(WAIT_S)
    driver.close(wait=False)  # returns while the call still runs (the caller may hold what the call waits for)
    assert driver.closed and not session.closed.is_set()
    release.set()
    assert session.closed.wait(WAIT_S)
    running.join(WAIT_S)
    assert session.calls == ["chunk", "close"]
    driver.close()  # idempotent


def test_close_waits_for_the_running_call_by_default():
    session = _Session()
    driver = SessionDriver(session)
    driver.call_now(lambda s: s.calls.append("chunk"))
    driver.close()
    assert session.calls == ["chunk", "close"] and session.closed.is_set()

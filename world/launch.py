"""This process's place in a run: alone, or one rank of the processes torchrun started (parallel/group.py), and
the layouts over which ranks may share a video's work (parallel/layout.py). A door reads its flags into the mode,
the timeout and the device kind and starts the run here; what a run then does across its ranks is
parallel/ranks.py's, driven by the world's objects (world/base.py, world/first_part.py).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..parallel.group import DEFAULT_TIMEOUT_S, LaunchError, Session, env_world_size, launched_by_torchrun
from ..parallel.layout import MODES as LAYOUTS, plan_layout

__all__ = ["DEFAULT_TIMEOUT_S", "LAYOUTS", "LaunchError", "Session", "launched_by_torchrun", "refuse_layout_alone",
           "start"]


def start(layout: str, timeout_s: float, kind: Callable[[], str]) -> Session:
    """The session of this process: a single one without torchrun, else joined to the other ranks over the backend
    of kind() ("cuda" or "cpu"; asked only of a torchrun launch). A layout that needs several processes, asked of one (or "off" asked of several),
    raises ValueError; a group that cannot form raises LaunchError."""
    if not launched_by_torchrun():
        if layout in ("cfg", "ulysses"):
            plan_layout(layout, 1, 1)  # raises: it needs several processes
        return Session.single()
    if layout == "off":
        plan_layout("off", 2, 1)  # raises with the explanation
    return Session.start(kind(), timeout_s)


def refuse_layout_alone(layout: str, heads: Callable[[], Optional[int]], model: str, guidance: bool) -> None:
    """A layout that cannot work (4 heads over 3 ranks, say) raises ValueError BEFORE the processes join: every rank
    reaches the verdict from its own inputs and the model's head count, so no rank waits for another and there is no
    process group to tear down. (Refused after joining, a rank leaving the group could close its connections while
    gloo on another rank still finished the last collective's transfer, which aborted that process.) heads(): the
    model's head count, None when it is not known without building or loading anything (then the ranks' checks
    decide, after joining)."""
    if not launched_by_torchrun():
        return
    count = heads()
    if count is not None:
        plan_layout(layout, env_world_size(), count, model=model, guidance=guidance)

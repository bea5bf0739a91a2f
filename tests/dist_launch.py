"""Start N processes of a command as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), without its
agent, so a test can give each rank its own arguments, stop or kill one, and read each rank's output.
Loaded by file path by the parallel tests (tests/ is not a package)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """N processes, stdout/stderr in files under `folder`; `wait()` returns exit codes (kills all on timeout)."""

    def __init__(self, argv_per_rank: Sequence[Sequence[str]], folder: Path, env: Optional[dict] = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        port = str(free_port())
        world = len(argv_per_rank)
        self.procs: list[subprocess.Popen] = []
        for rank, argv in enumerate(argv_per_rank):
            e = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                 "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "OMP_NUM_THREADS": "1", **(env or {})}
            out = open(self.folder / f"rank{rank}.out", "w")
            err = open(self.folder / f"rank{rank}.err", "w")
            self.procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=out, stderr=err))
            out.close()
            err.close()

    def err(self, rank: int) -> str:
        return (self.folder / f"rank{rank}.err").read_text()

    def out(self, rank: int) -> str:
        return (self.folder / f"rank{rank}.out").read_text()

    def wait_for(self, rank: int, predicate: Callable[[str], bool], timeout: float) -> bool:
        """Poll rank's stderr until predicate(text) (True) or timeout / the process ended (False)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate(self.err(rank)):
                return True
            if self.procs[rank].poll() is not None:
                return predicate(self.err(rank))
            time.sleep(0.05)
        return False

    def wait(self, timeout: float) -> list[Optional[int]]:
        end = time.monotonic() + timeout
        codes: list[Optional[int]] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        if any(c is None for c in codes):
            self.kill()
        return codes

    def signal(self, rank: int, sig: int) -> None:
        self.procs[rank].send_signal(sig)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
            p.wait()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

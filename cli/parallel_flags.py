"""`generate --parallel`: the flags and the launch of this process's session (one process per GPU, started by
torchrun: `torchrun --nproc_per_node=2 -m lingbot_world.cli generate ... --parallel auto`).

Every rank runs the same command: the pre-flight (rank 0 first, then the others; bad input is one line on every
rank), the fingerprint check of the model files, the sampling. Only rank 0 encodes the text (one umT5 child for the
whole run) and the first frame, and sends them to the others; only rank 0 decodes and writes the video and prints
the summary. The other ranks log warnings only, prefixed with their rank. What the run does across the ranks (the
layout, the checks that they load and sample the same) is parallel/ranks.py's, run by the world's assembly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..world import launch
from ..world.launch import DEFAULT_TIMEOUT_S, LAYOUTS, Session
from .errors import USAGE_ERRORS, UsageError


def add_arguments(p) -> None:
    g = p.add_argument_group(
        "several GPUs (README 'Several GPUs')",
        "Start one process per GPU with torchrun: torchrun --nproc_per_node=2 -m lingbot_world.cli generate ...")
    g.add_argument("--parallel", choices=LAYOUTS, default="auto",
                   help="how the processes torchrun started share the work: cfg (the two guidance passes on two "
                        "GPUs; base model), ulysses (every forward's tokens split over the GPUs; base and Fast), "
                        "auto (cfg for the base model with guidance, ulysses otherwise; 4+ GPUs: cfg x ulysses), "
                        "off; ignored by a single process")
    g.add_argument("--parallel-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="how long a rank waits for the others in any exchange before giving up with an error (a rank "
                        "that crashed is noticed at once)")


@dataclass(frozen=True)
class ParallelFlags:
    """--parallel and --parallel-timeout, and --device (which decides the backend)."""

    mode: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    device: str = "auto"


class _RankPrefix(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.prefix = f"[rank {rank}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def start(flags: ParallelFlags, log: logging.Logger) -> Session:
    """The session of this process (world/launch.py: alone without torchrun, else joined to the others; the session
    holds this rank's device, which the caller's request takes: GenerateRequest.on_rank). Raises UsageError (every
    rank the same) for a launch that cannot work; the other ranks then log warnings only, prefixed with their rank."""
    try:
        session = launch.start(flags.mode, flags.timeout_s, lambda: _device_kind(flags.device))
    except (launch.LaunchError, ValueError) as e:
        raise UsageError(str(e)) from None
    if not launch.launched_by_torchrun():
        return session
    session.usage_errors = USAGE_ERRORS
    if not session.is_main:
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for h in root.handlers:
            h.addFilter(_RankPrefix(session.rank))
    log.info("parallel: %s, %s backend, %s on this rank", session.label, session.backend, session.device)
    return session


def refuse_layout_alone(mode: str, heads: Callable[[], Optional[int]], model: str, guidance: bool) -> None:
    """--parallel's layout refused before the processes join (world/launch.refuse_layout_alone says why)."""
    try:
        launch.refuse_layout_alone(mode, heads, model, guidance)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _device_kind(device: str) -> str:
    d = device.strip().lower()
    if d == "cpu":
        return "cpu"
    if d in ("cuda", "gpu"):
        return "cuda"
    if d == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    raise UsageError(f"--device {device}: with torchrun every process takes the GPU of its local rank; use --device "
                     "auto (or cuda; cpu for a test run) and choose the GPUs with CUDA_VISIBLE_DEVICES")

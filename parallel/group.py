"""Process groups from torchrun's environment, with a timeout on every collective.

torchrun starts one process per GPU and gives each RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the
rendezvous address (MASTER_ADDR/MASTER_PORT) in its environment. `Session.start` turns that into:
- the data group: NCCL between CUDA GPUs (process LOCAL_RANK drives cuda:LOCAL_RANK), gloo on the CPU;
- a gloo control group over every rank for small messages (agreement on errors, fingerprints, rank 0's text
  embeddings and conditioning), so a rank that fails a check tells the others at once instead of leaving them
  waiting in a collective;
- after the pre-flight, the layout's groups: the ranks splitting one pass's tokens (Ulysses) and the pairs holding
  the same shard of the two guidance passes (CFG).
Every group has the same timeout (--parallel-timeout): a collective that does not complete in time raises (gloo)
or makes NCCL's watchdog abort the process with its message, so a rank that hangs never leaves the others waiting
forever. A rank that exits closes its sockets, which gloo reports immediately; torchrun also stops the other
processes when one fails. NCCL's NVLink multicast settings come from the environment (NCCL_NVLS_ENABLE, ...) and
are left as they are.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from .layout import LAUNCH_HINT, Layout
from .messages import ParallelError, all_gather_json, broadcast_json, broadcast_tensors

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(ValueError):
    """The processes were started in a way that cannot work (one line saying what to change)."""


def env_world_size() -> int:
    """WORLD_SIZE as torchrun set it (1 when not launched by torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ENV_KEYS) and env_world_size() > 1


def _int_env(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set: start the processes with {LAUNCH_HINT}")
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not a number: start the processes with {LAUNCH_HINT}") from None


def rank_device(kind: str, local_rank: int, local_world: int) -> torch.device:
    """This process's device: cuda:LOCAL_RANK (one GPU per process), or the CPU. Refuses more processes per machine
    than GPUs with one line (every rank reaches the same verdict on its own, so none waits for another)."""
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError(f"{local_world} processes were started for GPUs but no CUDA GPU is available here; run one "
                          "process, or add --device cpu (slow; for testing)")
    count = torch.cuda.device_count()
    if local_world > count:
        raise LaunchError(f"{local_world} processes were started on this machine but it has {count} CUDA GPU(s): "
                          f"use --nproc_per_node={count}" + (" (or no torchrun, without --parallel)" if count == 1
                                                              else ""))
    return torch.device("cuda", local_rank)


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def _init(backend: str, device: torch.device, timeout_s: float) -> None:
    kw = {"backend": backend, "timeout": _timeout(timeout_s)}
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kw["device_id"] = device  # binds the communicator to this GPU (no guessing from the current device)
    dist.init_process_group(**kw)


@dataclass
class Session:
    """One process of a parallel run (or the only process: `Session.single()`, where every call is local)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: Optional[str] = None  # "nccl" | "gloo" | None (one process)
    timeout_s: float = DEFAULT_TIMEOUT_S
    layout: Layout = field(default_factory=lambda: Layout(1, 1, 1))
    control: object = None  # gloo group over every rank
    sp_group: object = None  # the ranks splitting this rank's pass (Ulysses); None = not split
    cfg_group: object = None  # this rank and the rank holding the same shard of the other pass; None = no CFG split
    # The exception kinds that are the user's input (a rank refusing them exits 2 on every rank); the door sets its
    # own (cli/errors.USAGE_ERRORS), as this layer knows no door.
    usage_errors: tuple = (ValueError, FileNotFoundError)
    _own_group: bool = False
    _checks: Optional[str] = None  # the phase of checks in progress (begin_checks)

    # ---- life cycle ---------------------------------------------------------------------------------------
    @classmethod
    def single(cls, device: Optional[torch.device] = None) -> "Session":
        return cls(device=torch.device(device) if device is not None else torch.device("cpu"))

    @classmethod
    def start(cls, device_kind: str = "cuda", timeout_s: float = DEFAULT_TIMEOUT_S) -> "Session":
        """Join the processes torchrun started. device_kind: "cuda" (NCCL, one GPU per process) or "cpu" (gloo).
        Raises LaunchError (the same on every rank) when the launch cannot work."""
        if not timeout_s > 0:
            raise LaunchError(f"--parallel-timeout {timeout_s}: use a positive number of seconds")
        rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
        local_rank = _int_env("LOCAL_RANK")
        local_world = _int_env("LOCAL_WORLD_SIZE", world)
        if not 0 <= rank < world or not 0 <= local_rank < local_world:
            raise LaunchError(f"RANK={rank} / LOCAL_RANK={local_rank} do not fit WORLD_SIZE={world} / "
                              f"LOCAL_WORLD_SIZE={local_world}: start the processes with {LAUNCH_HINT}")
        device = rank_device(device_kind, local_rank, local_world)
        backend = "gloo"
        if device.type == "cuda":
            if not dist.is_nccl_available():
                raise LaunchError("this PyTorch build has no NCCL (Windows and macOS builds have none), so GPUs cannot "
                                  "exchange tensors: run one process on one GPU, or use Linux with a CUDA build of "
                                  "PyTorch")
            torch.cuda.set_device(device)
            backend = "nccl"
        try:
            _init(backend, device, timeout_s)
            control = dist.new_group(backend="gloo", timeout=_timeout(timeout_s)) if backend != "gloo" else None
        except (RuntimeError, ValueError) as e:
            if dist.is_initialized():
                dist.destroy_process_group()
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ParallelError(f"could not connect to the other {world - 1} process(es) within "
                                f"{timeout_s:.0f} s ({first[:160]}); check that every process started") from e
        return cls(rank=rank, world=world, local_rank=local_rank, device=device, backend=backend,
                   timeout_s=timeout_s, layout=Layout(world, 1, 1), control=control, _own_group=True)

    def set_layout(self, layout: Layout) -> None:
        """Create the layout's groups (a collective: every rank calls it with the same layout)."""
        if layout.world != self.world:
            raise ValueError(f"layout for {layout.world} ranks in a world of {self.world}")
        self.layout = layout
        if not self.parallel:
            return
        for ranks in layout.sp_groups():
            g = None if len(ranks) == 1 else (dist.group.WORLD if len(ranks) == self.world else
                                             dist.new_group(ranks, timeout=_timeout(self.timeout_s)))
            if self.rank in ranks:
                self.sp_group = g
        for ranks in layout.cfg_groups():
            g = None if len(ranks) == 1 else (dist.group.WORLD if len(ranks) == self.world else
                                             dist.new_group(ranks, timeout=_timeout(self.timeout_s)))
            if self.rank in ranks:
                self.cfg_group = g

    def close(self, failed: bool = False) -> None:
        """Leave the process group: every group is destroyed and this session's references to them dropped, so
        their gloo threads are joined here. A group still alive when the interpreter exits aborts the process
        ("terminate called without an active exception"): its worker thread, releasing the tensors of the last
        collective, needs the GIL that the exiting interpreter no longer gives. After a failure NCCL is left to the
        process exit (destroying a communicator whose peer died can block); the gloo control group still goes."""
        if not self._own_group:
            return
        self._own_group = False
        if dist.is_initialized():
            try:
                if failed and self.backend == "nccl":
                    if self.control is not None:
                        dist.destroy_process_group(self.control)
                else:
                    dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - leaving after another rank died must not hide the real error
                pass
        self.control = self.sp_group = self.cfg_group = None
        gc.collect()  # a group kept by a reference cycle (an exception's frames) is freed now, not at exit

    # ---- who am I -----------------------------------------------------------------------------------------
    @property
    def parallel(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sp_degree(self) -> int:
        return self.layout.ulysses

    @property
    def label(self) -> str:
        return f"rank {self.rank}/{self.world}" if self.parallel else "single process"

    # ---- agreement ------------------------------------------------------------------------------------------
    def _statuses(self, status: Optional[dict], what: str) -> list[Optional[dict]]:
        return all_gather_json(status, self.control, what)

    def _raise_first(self, statuses: Sequence[Optional[dict]], own: Optional[BaseException]) -> None:
        if own is not None:
            raise own
        for st in statuses:
            if st is not None:
                raise _from_status(st)

    def begin_checks(self, what: str = "the pre-flight") -> None:
        """Start a phase of checks that runs on rank 0 first, then on the other ranks (rank 0 may build something
        they read, e.g. the demo checkpoint). End it with `end_checks()`; an exception raised in between must be
        passed to `report_failure` (the CLI does it for the whole command), so the failing rank's line is raised on
        every rank and nobody waits."""
        if not self.parallel:
            return
        self._checks = what
        if not self.is_main:
            st = broadcast_json(None, 0, self.control, what)
            if st is not None:
                self._checks = None
                raise _from_status(st)

    def end_checks(self) -> None:
        """Every rank passed the checks, or the first failure is raised here (on the ranks that passed)."""
        what, self._checks = self._checks, None
        if not self.parallel or what is None:
            return
        if self.is_main:
            broadcast_json(None, 0, self.control, what)
        self._raise_first(self._statuses(None, what), None)

    def report_failure(self, exc: BaseException) -> None:
        """Tell the other ranks that the checks in progress failed here (no-op outside a phase of checks)."""
        what, self._checks = self._checks, None
        if not self.parallel or what is None or not isinstance(exc, Exception):
            return
        status = _status(self.rank, exc, self.usage_errors)
        try:
            if self.is_main:
                broadcast_json(status, 0, self.control, what)  # the others raise it before starting their checks
            else:
                self._statuses(status, what)
        except ParallelError:
            pass  # the others are gone already; this rank's own error is the one to report

    @contextlib.contextmanager
    def main_first(self, what: str = "the pre-flight") -> Iterator[None]:
        """The with-block as a phase of checks (`begin_checks` ... `end_checks`): rank 0 first, then the others; an
        exception on any rank is raised on every rank (its own on the failing rank, that rank's line elsewhere)."""
        self.begin_checks(what)
        try:
            yield
        except Exception as e:
            self.report_failure(e)
            raise
        self.end_checks()

    @contextlib.contextmanager
    def all_ranks(self, what: str) -> Iterator[None]:
        """Run the with-block on every rank at once; an exception on any rank is raised on every rank."""
        if not self.parallel:
            yield
            return
        own = None
        try:
            yield
        except Exception as e:  # noqa: BLE001
            own = e
        statuses = self._statuses(None if own is None else _status(self.rank, own, self.usage_errors), what)
        self._raise_first(statuses, own)

    def from_main(self, make: Callable[[], Sequence[torch.Tensor]], what: str) -> list[torch.Tensor]:
        """Tensors made by rank 0 (text embeddings, the conditioning) on every rank, as CPU tensors on the other
        ranks; rank 0 keeps its own. A failure on rank 0 is raised on every rank."""
        if not self.parallel:
            return list(make())
        own, result = None, None
        if self.is_main:
            try:
                result = list(make())
            except Exception as e:  # noqa: BLE001
                own = e
        st = broadcast_json(None if own is None else _status(0, own, self.usage_errors), 0, self.control, what)
        if own is not None:
            raise own
        if st is not None:
            raise _from_status(st)
        got = broadcast_tensors(result, 0, self.control, what)
        return result if self.is_main else got

    def same_value(self, value, what: str):
        """Rank 0's JSON value (a random seed) on every rank."""
        if not self.parallel:
            return value
        return broadcast_json(value, 0, self.control, what)

    def gather_json(self, value, what: str) -> list:
        """Every rank's JSON value, in rank order (on every rank)."""
        if not self.parallel:
            return [value]
        return all_gather_json(value, self.control, what)


def _status(rank: int, exc: BaseException, usage_errors: tuple) -> dict:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return {"rank": rank, "usage": isinstance(exc, usage_errors), "message": first}


class RankFailed(RuntimeError):
    """Another rank failed at a runtime step; its line is the message."""


class RankRefused(ValueError):
    """Another rank refused its input (bad input: exit code 2 there, and here)."""


def _from_status(st: dict) -> BaseException:
    msg = st["message"]
    prefix = f"rank {st['rank']}: "
    if not msg.startswith("rank "):
        msg = prefix + msg
    return RankRefused(msg) if st.get("usage") else RankFailed(msg)

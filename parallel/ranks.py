"""`generate --parallel`: the flags and the glue between the CLI and parallel/ (one process per GPU, started by
torchrun: `torchrun --nproc_per_node=2 -m lingbot_world.cli generate ... --parallel auto`).

Every rank runs the same command: the pre-flight (rank 0 first, then the others; bad input is one line on every
rank), the fingerprint check of the model files, the sampling. Only rank 0 encodes the text (one umT5 child for the
whole run) and the first frame, and sends them to the others; only rank 0 decodes and writes the video and prints
the summary. The other ranks log warnings only, prefixed with their rank.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..parallel.group import DEFAULT_TIMEOUT_S, LaunchError, Session, launched_by_torchrun
from ..parallel.layout import MODES, Layout, plan_layout
from .errors import USAGE_ERRORS, UsageError
from .lora_run import LoraFlags


def add_arguments(p) -> None:
    g = p.add_argument_group(
        "several GPUs (README 'Several GPUs')",
        "Start one process per GPU with torchrun: torchrun --nproc_per_node=2 -m lingbot_world.cli generate ...")
    g.add_argument("--parallel", choices=MODES, default="auto",
                   help="how the processes torchrun started share the work: cfg (the two guidance passes on two "
                        "GPUs; base model), ulysses (every forward's tokens split over the GPUs; base and Fast), "
                        "auto (cfg for the base model with guidance, ulysses otherwise; 4+ GPUs: cfg x ulysses), "
                        "off; ignored by a single process")
    g.add_argument("--parallel-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="how long a rank waits for the others in any exchange before giving up with an error (a rank "
                        "that crashed is noticed at once)")


@dataclass(frozen=True)
class ParallelFlags:
    """--parallel and --parallel-timeout."""

    mode: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S


class _RankPrefix(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.prefix = f"[rank {rank}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def start(flags: ParallelFlags, device: str, log: logging.Logger) -> Session:
    """The session of this process: `Session.single()` without torchrun, else joined to the others (`device`:
    --device, which decides the backend; the session holds this rank's device, which the caller's request takes:
    GenerateRequest.on_rank). Raises UsageError (every rank the same) for a launch that cannot work."""
    if not launched_by_torchrun():
        if flags.mode in ("cfg", "ulysses"):
            plan_layout(flags.mode, 1, 1)  # raises: needs several processes
        return Session.single()
    if flags.mode == "off":
        plan_layout("off", 2, 1)  # raises with the explanation
    kind = _device_kind(device)
    try:
        session = Session.start(kind, flags.timeout_s)
        session.usage_errors = USAGE_ERRORS
    except LaunchError as e:
        raise UsageError(str(e)) from None
    if not session.is_main:
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for h in root.handlers:
            h.addFilter(_RankPrefix(session.rank))
    log.info("parallel: %s, %s backend, %s on this rank", session.label, session.backend, session.device)
    return session


def refuse_layout_alone(mode: str, heads: Callable[[], Optional[int]], model: str, guidance: bool) -> None:
    """A layout that cannot work (e.g. 4 heads over 3 ranks) refused BEFORE the processes join: every rank reaches
    the verdict from its own flags and the model's head count, so no rank waits for another and no process group
    exists to tear down. (Refused after joining, right behind the pre-flight's last collective, a rank leaving the
    group could close its connections while gloo on another rank still finished that collective's last transfer,
    which aborted that process.) heads(): the model's head count, None when it is not known without building or
    loading anything (then the pre-flight decides, after joining)."""
    if not launched_by_torchrun():
        return
    count = heads()
    if count is None:
        return
    from ..parallel.group import env_world_size

    try:
        plan_layout(mode, env_world_size(), count, model=model, guidance=guidance)
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


def plan(session: Session, mode: str, num_heads: int, model: str, guidance: bool, log: logging.Logger) -> Layout:
    """The layout of this launch for --parallel `mode` (no collective: the same on every rank, and so is a
    refusal)."""
    if not session.parallel:
        return session.layout
    try:
        layout = plan_layout(mode, session.world, num_heads, model=model, guidance=guidance)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if mode == "cfg" and not guidance:
        log.warning("--parallel cfg with guide scale 1: there is no unconditional pass, every rank computes the "
                    "same conditional one")
    return layout


def set_layout(session: Session, mode: str, num_heads: int, model: str, guidance: bool, log: logging.Logger) -> None:
    """Decide the layout and create its groups (a collective: every rank calls it, after the pre-flight)."""
    use(session, plan(session, mode, num_heads, model, guidance, log), log)


def use(session: Session, layout: Layout, log: logging.Logger) -> None:
    if session.parallel:
        session.set_layout(layout)
        log.info("parallel: %s", layout.describe())


def check_same_models(session: Session, paths: dict, log: logging.Logger,
                      loras: Optional[LoraFlags] = None) -> None:
    """Every rank must load the same model files (and the same --lora files and strengths, `loras`): compare
    their fingerprints (refused on every rank if not)."""
    if not session.parallel:
        return
    from ..parallel.fingerprint import expert_fingerprint, mismatch

    with session.all_ranks("comparing the model files"):
        mine = {name: expert_fingerprint(p) for name, p in paths.items()}
        mine["LoRA"] = _lora_fingerprint(loras or LoraFlags())
    every = session.gather_json(mine, "comparing the model files")
    for name in list(paths) + ["LoRA"]:
        line = mismatch([fp[name] for fp in every], f"{name} files")
        if line:
            raise UsageError(line)
    log.info("parallel: every rank loads the same model files")


def _lora_fingerprint(loras: LoraFlags) -> dict:
    """One fingerprint of every --lora/--lora-high/--lora-low file with its strength (the same on every rank)."""
    from ..parallel.fingerprint import model_fingerprint
    from .lora_run import parse_spec

    specs = [(flag, *parse_spec(spec)) for flag in ("lora", "lora_high", "lora_low") for spec in getattr(loras, flag)]
    names = ", ".join(f"--{flag.replace('_', '-')} {path.name}:{strength:g}" for flag, path, strength in specs)
    fp = model_fingerprint(".", {"specs": repr([(flag, strength) for flag, _, strength in specs])},
                           files=[path.expanduser() for _, path, _ in specs])
    fp["name"] = names or "no LoRA"
    return fp


def attach(session: Session, model: torch.nn.Module) -> torch.nn.Module:
    """Give a loaded model this rank's share of the tokens (Ulysses); a no-op without a sequence split."""
    if session.sp_degree > 1:
        from ..parallel.ulysses import SequenceParallel

        sp_rank = session.layout.sp_rank(session.rank)
        model.set_seq_parallel(SequenceParallel(session.sp_degree, sp_rank, session.sp_group, model.cfg.num_heads))
    return model


def velocity(session: Session):
    """The sampler's velocity for this rank (CFG-parallel), or None for the sampler's own."""
    if session.layout.cfg == 2:
        from ..parallel.cfg import CFGParallel

        return CFGParallel(session.layout.cfg_rank(session.rank), session.cfg_group)
    return None


def check_same_inputs(session: Session, tensors: dict, what: str = "the sampling inputs") -> None:
    """The inputs every rank samples from (noise, conditioning, text, camera) must be the same bytes: ranks that would
    make different videos are stopped before the first step."""
    if not session.parallel:
        return
    from ..parallel.fingerprint import tensor_digest

    mine = {k: None if t is None else tensor_digest(t) for k, t in tensors.items()}
    every = session.gather_json(mine, what)
    bad = sorted({k for other in every[1:] for k in mine if other[k] != every[0][k]})
    if bad:
        raise RuntimeError(f"the ranks would sample from different {', '.join(bad)}: were they started with different "
                           "arguments or files, or on GPUs of different kinds with --noise cuda (then use --noise cpu)?")

def agree_on_plans(session: Session, reason: str, cfg_batch: bool, log: logging.Logger) -> bool:
    """Log every rank's memory plan on rank 0 (GPUs of different sizes get different plans) and agree on batched CFG:
    batched only when every rank planned it, as the ranks of a sequence split exchange tensors of the same batch."""
    if not session.parallel:
        return cfg_batch
    every = session.gather_json({"plan": reason, "batch": bool(cfg_batch)}, "comparing memory plans")
    for r, p in enumerate(every[1:], start=1):
        log.info("memory plan of rank %d: %s", r, p["plan"])
    return all(p["batch"] for p in every)


def planned_cfg_mode(requested: str, parallel: bool, cfg_parallel: bool, log: logging.Logger) -> str:
    """The CFG mode to plan memory for: --cfg-mode, except where the layout decides (one line says so)."""
    if cfg_parallel:
        if requested not in ("auto", "sequential"):
            log.info("--cfg-mode %s does not apply: each rank runs one guidance pass", requested)
        return "sequential"
    if parallel and requested == "layered":
        # The ranks of a sequence split exchange tensors inside every forward; layered is not verified there.
        log.info("--cfg-mode layered runs as sequential with --parallel ulysses (each rank: two forwards per step)")
        return "sequential"
    return requested


def sampling_cfg_mode(planned: str, parallel: bool, cfg_parallel: bool, plan_cfg_mode: str, agreed_batch: bool) -> str:
    """The sampler's CFG mode: the planned one; `auto` takes the memory plan's (batch, layered or sequential) on one
    process, and across ranks batch only where every rank planned it (`agree_on_plans`), else sequential."""
    if cfg_parallel or (parallel and planned == "auto"):
        return "batch" if agreed_batch else "sequential"
    return plan_cfg_mode if planned == "auto" else planned

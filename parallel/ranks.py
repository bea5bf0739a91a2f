"""What a run does across the ranks of a torchrun launch (one process per GPU): the layout, the checks that every
rank loads and samples the same, the memory plans they agree on, and each rank's share of the work.

The door starts the session (cli/parallel_flags.py: `generate --parallel`); the world's assembly (world/base.py,
world/first_part.py) runs these on it. Every rank runs the same code: a refusal here is the same on every rank.
Only rank 0 encodes the text and the first frame and sends them to the others, and only rank 0 decodes and writes
the video (parallel/group.py's `from_main`).
"""
from __future__ import annotations

import logging
from typing import Sequence

import torch

from .group import Session
from .layout import Layout, plan_layout


def plan(session: Session, mode: str, num_heads: int, model: str, guidance: bool, log: logging.Logger) -> Layout:
    """The layout of this launch for --parallel `mode` (no collective: the same on every rank, and so is a
    refusal: a ValueError naming the layout)."""
    if not session.parallel:
        return session.layout
    layout = plan_layout(mode, session.world, num_heads, model=model, guidance=guidance)
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


def check_same_models(session: Session, paths: dict, log: logging.Logger, loras: Sequence = ()) -> None:
    """Every rank must load the same model files (and the same LoRA files and strengths: `loras`, (flag, path,
    strength) items): compare their fingerprints (refused on every rank if not)."""
    if not session.parallel:
        return
    from .fingerprint import expert_fingerprint, mismatch

    with session.all_ranks("comparing the model files"):
        mine = {name: expert_fingerprint(p) for name, p in paths.items()}
        mine["LoRA"] = _lora_fingerprint(loras)
    every = session.gather_json(mine, "comparing the model files")
    for name in list(paths) + ["LoRA"]:
        line = mismatch([fp[name] for fp in every], f"{name} files")
        if line:
            raise ValueError(line)
    log.info("parallel: every rank loads the same model files")


def _lora_fingerprint(loras: Sequence) -> dict:
    """One fingerprint of every LoRA file with its strength (the same on every rank)."""
    from .fingerprint import model_fingerprint

    names = ", ".join(f"{flag} {path.name}:{strength:g}" for flag, path, strength in loras)
    fp = model_fingerprint(".", {"specs": repr([(flag, strength) for flag, _, strength in loras])},
                           files=[path.expanduser() for _, path, _ in loras])
    fp["name"] = names or "no LoRA"
    return fp


def attach(session: Session, model: torch.nn.Module) -> torch.nn.Module:
    """Give a loaded model this rank's share of the tokens (Ulysses); a no-op without a sequence split."""
    if session.sp_degree > 1:
        from .ulysses import SequenceParallel

        sp_rank = session.layout.sp_rank(session.rank)
        model.set_seq_parallel(SequenceParallel(session.sp_degree, sp_rank, session.sp_group, model.cfg.num_heads))
    return model


def velocity(session: Session):
    """The sampler's velocity for this rank (CFG-parallel), or None for the sampler's own."""
    if session.layout.cfg == 2:
        from .cfg import CFGParallel

        return CFGParallel(session.layout.cfg_rank(session.rank), session.cfg_group)
    return None


def check_same_inputs(session: Session, tensors: dict, what: str = "the sampling inputs") -> None:
    """The inputs every rank samples from (noise, conditioning, text, camera) must be the same bytes: ranks that would
    make different videos are stopped before the first step."""
    if not session.parallel:
        return
    from .fingerprint import tensor_digest

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

"""The text stage of a world's start-up (the CLI's, base and causal models): the prompts' encoding starts first, and the steps that load the models run beside it
where VRAM allows (memory/overlap.py decides), so the encoder's seconds hide behind the VAE encode and the DiT
load instead of adding to them. One process only; under torchrun rank 0 encodes first, as before.

`plan(...)` decides (where the child runs, what runs beside it, which steps run together, whether the K/V
cache's host memory may be allocated meanwhile) without starting anything; `TextPlan.start()` starts the child.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..memory.overlap import OverlapPlan, Step, plan_overlap
from .settings import TextSettings

ENCODE_STEP = "the image's VAE encode"


def vae_encode_step(vae_cfg, height: int, width: int, frames: int, tiled: bool, keeps_vae: bool) -> Step:
    """The image's VAE encode as a step: weights + working memory while it runs; the weights stay on the GPU
    afterwards only when the VAE is kept there (the Fast model's chunk-by-chunk decode)."""
    from ..wan.vae.footprint import vae_weight_bytes, vae_work_bytes

    weights = vae_weight_bytes(vae_cfg)
    return Step(ENCODE_STEP, weights + vae_work_bytes(vae_cfg, height, width, frames, tiled, 256),
                weights if keeps_vae else 0)


class TextStage:
    """before(step) before each planned step; embeddings() where the text is needed; stop() in a finally."""

    def __init__(self, plan: OverlapPlan, job=None, done: Optional[list] = None):
        self.plan = plan
        self._job = job  # text_encoder.background.BackgroundEncoding, or None when `done` holds the result
        self._done = done
        self.waited_s = 0.0
        self.background = job is not None

    def before(self, step: str) -> None:
        """A step that was not admitted beside the encoder waits for it."""
        if not self.plan.runs_beside(step):
            self.embeddings()

    @property
    def done(self) -> bool:
        return self._done is not None or (self._job is not None and not self._job.running)

    def embeddings(self) -> list[torch.Tensor]:
        if self._done is None:
            t = time.perf_counter()
            self._done = self._job.result()
            self.waited_s = time.perf_counter() - t
            self._job = None
        return self._done

    def stop(self) -> None:
        if self._job is not None:
            self._job.stop()
            self._job = None


@dataclass
class TextPlan:
    """Where and when the prompts are encoded, and what runs meanwhile (`overlap`); nothing started yet."""

    overlap: OverlapPlan
    how: str  # "done" (cache hit or another rank's text), "first" (before the steps), "background"
    t5_device: str
    encode: Callable[..., list]  # encode(t5_device, cancel_check=None) -> embeddings
    session: object

    @property
    def background(self) -> bool:
        return self.how == "background"

    def start(self, log) -> TextStage:
        """Encode now ("done", "first": returns when the text is there) or start the child in the background."""
        if self.how == "done":
            if self.overlap.together or self.overlap.host_early:
                log.info("start-up: %s", self.overlap.reason)
            return TextStage(self.overlap, done=self.session.from_main(self.encode, "the text encoding"))
        if self.how == "first":
            log.info("text encoder first: %s", self.overlap.reason)
            return TextStage(self.overlap, done=self.encode(self.t5_device))
        from ..text_encoder.background import BackgroundEncoding

        log.info("text encoder on %s in the background; %s", self.t5_device, self.overlap.reason)
        return TextStage(self.overlap,
                         job=BackgroundEncoding(lambda cancel_check: self.encode(self.t5_device, cancel_check)))


def plan(text: TextSettings, files, prompts: Sequence[str], device: torch.device, steps: Sequence[Step], session, *,
         host_bytes: int = 0, ram_free: Optional[int] = None) -> TextPlan:
    """Encode `prompts` (files.t5 / files.tokenizer, the CLI's --t5-* and cache flags): at once, or in the
    background when the encoder runs on this process's GPU and at least the first step fits beside it.
    host_bytes / ram_free: the K/V cache's pinned host memory, allocated meanwhile when RAM allows."""
    from ..text_encoder.encode import all_prompts_cached, encode_prompts, estimate_child_ram_bytes

    def encode(t5_device: str = text.device, cancel_check=None):
        return encode_prompts(files.t5, files.tokenizer, list(prompts), device=t5_device, cache_dir=text.cache_dir,
                              use_cache=text.use_cache, timeout=text.timeout, cancel_check=cancel_check)

    allow = text.overlap and not session.parallel
    free = _free_vram(device)
    if session.parallel or (text.use_cache and all_prompts_cached(
            files.t5, files.tokenizer, list(prompts), cache_dir=text.cache_dir)):
        overlap = plan_overlap(free, 0, steps, allow=allow, host_bytes=host_bytes, ram_free=ram_free)
        return TextPlan(_reason(overlap, "prompts encoded first"), "done", text.device, encode, session)
    t5_device, child_bytes = _child_device(text.device, files.t5, device, free)
    child_ram = estimate_child_ram_bytes(files.t5, t5_device) if host_bytes else 0
    if child_bytes <= 0:  # an encoder in host RAM beside the models' RAM is not planned for: one after the other
        overlap = plan_overlap(free, 0, steps, allow=allow, host_bytes=host_bytes, ram_free=ram_free,
                               child_ram=child_ram)
        return TextPlan(_reason(overlap, f"the text encoder runs {_on(t5_device)} first"), "first", t5_device, encode,
                        session)
    overlap = plan_overlap(free, child_bytes, steps, allow=allow, host_bytes=host_bytes, ram_free=ram_free,
                           child_ram=child_ram)
    return TextPlan(overlap, "background" if overlap.beside else "first", t5_device, encode, session)


def start(text: TextSettings, files, prompts: Sequence[str], device: torch.device, steps: Sequence[Step], session, log,
          **kw) -> TextStage:
    """plan(...).start(log)."""
    return plan(text, files, prompts, device, steps, session, **kw).start(log)


def _reason(overlap: OverlapPlan, first: str) -> OverlapPlan:
    """No child beside the steps: keep what the planner decided about them, say why the text comes first."""
    from dataclasses import replace

    return replace(overlap, beside=(), reason=f"{first}; {overlap.reason}")


def _free_vram(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    from ..memory.estimates import free_vram_bytes

    return free_vram_bytes(device)


def _on(t5_device: str) -> str:
    """Where the encoder child runs, in words: 'auto' is its own choice (the GPU when the weights fit there)."""
    if t5_device == "auto":
        return "on the GPU if it fits there, else on the CPU" if torch.cuda.is_available() else "on the CPU"
    return "on the CPU" if t5_device == "cpu" else f"on {t5_device}"


def _child_device(requested: str, t5_path, device: torch.device, free: Optional[int]) -> tuple[str, int]:
    """(the child's device, the VRAM it takes on this process's GPU). 'auto' is decided here, before anything
    loads beside the child (it would otherwise see the parent's models and pick the CPU)."""
    if device.type != "cuda" or requested == "cpu":
        return requested, 0
    from ..text_encoder.encode import estimate_child_vram_bytes

    need = estimate_child_vram_bytes(t5_path)
    if requested == "auto" and (free or 0) < need:
        return "cpu", 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}", need

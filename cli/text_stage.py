"""The CLI's text stage: the prompts' encoding starts first, and the steps that load the models run beside it
where VRAM allows (memory/overlap.py decides), so the encoder's seconds hide behind the VAE encode and the DiT
load instead of adding to them. One process only; under torchrun rank 0 encodes first, as before."""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from ..memory.overlap import OverlapPlan, Step, plan_text_overlap

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


def start(args, files, prompts: Sequence[str], device: torch.device, steps: Sequence[Step], session, log) -> TextStage:
    """Encode `prompts` (files.t5 / files.tokenizer, the CLI's --t5-* and cache flags): at once, or in the
    background when the encoder runs on this process's GPU and at least the first step fits beside it."""
    from ..text_encoder.encode import all_prompts_cached, encode_prompts

    def encode(t5_device: str = args.t5_device, cancel_check=None):
        return encode_prompts(files.t5, files.tokenizer, list(prompts), device=t5_device, cache_dir=args.cache_dir,
                              use_cache=not args.no_text_cache, timeout=args.t5_timeout, cancel_check=cancel_check)

    if session.parallel or (not args.no_text_cache and all_prompts_cached(
            files.t5, files.tokenizer, list(prompts), cache_dir=args.cache_dir)):
        done = session.from_main(encode, "the text encoding")
        return TextStage(OverlapPlan((), "prompts encoded first"), done=done)
    t5_device, child_bytes, free = _child_device(args.t5_device, files.t5, device)
    if child_bytes <= 0:  # an encoder in host RAM beside the models' RAM is not planned for: one after the other
        return TextStage(OverlapPlan((), f"the text encoder runs on {t5_device} first"), done=encode(t5_device))
    plan = plan_text_overlap(free, child_bytes, steps)
    if not plan.beside:
        log.info("text encoder first: %s", plan.reason)
        return TextStage(plan, done=encode(t5_device))
    from ..text_encoder.background import BackgroundEncoding

    log.info("text encoder on %s in the background; %s", t5_device, plan.reason)
    return TextStage(plan, job=BackgroundEncoding(lambda cancel_check: encode(t5_device, cancel_check)))


def _child_device(requested: str, t5_path, device: torch.device) -> tuple[str, int, int]:
    """(the child's device, the VRAM it takes on this process's GPU, this GPU's free VRAM). 'auto' is decided
    here, before anything loads beside the child (it would otherwise see the parent's models and pick the CPU)."""
    if device.type != "cuda" or requested == "cpu":
        return requested, 0, 0
    from ..memory.placement import free_vram_bytes
    from ..text_encoder.encode import estimate_child_vram_bytes

    free = free_vram_bytes(device)
    need = estimate_child_vram_bytes(t5_path)
    if requested == "auto" and free < need:
        return "cpu", 0, free
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}", need, free

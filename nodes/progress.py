"""ComfyUI progress bar and latent previews for the sampler and the expert loads.

Every `ProgressBar.update_absolute` also runs ComfyUI's interrupt check, so each step (and each slice of
an expert load) is a cancel point. Previews use ComfyUI's own previewer with the Wan 2.1 latent-to-RGB
factors on the first frame of the current x0 estimate (normalised latent space, as ComfyUI's samplers).
"""
from __future__ import annotations

import logging
from typing import Callable

from ..wan.sampling.sampler import StepInfo

log = logging.getLogger(__name__)


class SamplingProgress:
    """`callback(StepInfo)` for `wan.sampler.sample`: progress + preview per step."""

    def __init__(self, total_steps: int, device):
        import comfy.latent_formats
        import comfy.utils
        import latent_preview

        self.pbar = comfy.utils.ProgressBar(total_steps)
        self.previewer = latent_preview.get_previewer(device, comfy.latent_formats.Wan21())
        self.preview_failed = False

    def __call__(self, info: StepInfo) -> None:
        preview = None
        if self.previewer is not None and not self.preview_failed:
            try:
                preview = self.previewer.decode_latent_to_preview_image("JPEG", info.x0.float())
            except Exception as e:  # a preview must never stop a generation
                self.preview_failed = True
                log.warning("LingBot-World: latent preview disabled for this run: %s", e)
        self.pbar.update_absolute(info.index + 1, info.total, preview)

    def finish(self, total: int) -> None:
        self.pbar.update_absolute(total, total)


def load_progress() -> Callable[[str], Callable[[int, int], None]]:
    """Factory for the provider: a per-expert (done_bytes, total_bytes) callback driving a 0..100 bar."""
    import comfy.utils

    def for_expert(name: str) -> Callable[[int, int], None]:
        pbar = comfy.utils.ProgressBar(100)
        last = [-1]

        def update(done: int, total: int) -> None:
            pct = int(100 * done / total) if total else 100
            if pct != last[0]:  # one UI message per percent, not per tensor
                last[0] = pct
                pbar.update_absolute(pct, 100)

        return update

    return for_expert

"""What the running node shows: ComfyUI's progress bar, latent previews, and a line of text on the node.

Every `ProgressBar.update_absolute` also runs ComfyUI's interrupt check, so each step (and each slice of
an expert load, each stage of the text encoder) is a cancel point. Previews use ComfyUI's own previewer with
the Wan 2.1 latent-to-RGB factors on the current x0 estimate (normalised latent space, as ComfyUI's samplers).
Text goes through ComfyUI's progress-text message (`PromptServer.send_progress_text`, which core's Get Image
Size node uses too); the frontend shows it under the node's widgets.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

log = logging.getLogger(__name__)


class SamplingProgress:
    """`callback(StepInfo)` for `wan.sampler.sample`: progress + a preview of the whole clip per step, with ComfyUI's
    previewer (`--preview-method`, `--preview-size`), or Latent2RGB when ComfyUI's previews are off: LingBot samplers
    preview unless their `previews` switch is off. Any sampler loop can use it: call it with a StepInfo, or
    `preview(x0)` / `pbar` directly."""

    def __init__(self, total_steps: int, device, previews: bool = True):
        import comfy.latent_formats
        import comfy.utils
        import latent_preview

        from .previews import ClipPreview, preview_decoder

        self.pbar = comfy.utils.ProgressBar(total_steps)
        decode = preview_decoder(latent_preview, device, comfy.latent_formats.Wan21(), previews)
        self.max_side = getattr(latent_preview, "MAX_PREVIEW_RESOLUTION", 512)  # --preview-size
        self.clip = ClipPreview(decode, self.max_side) if decode is not None else None

    def preview(self, x0) -> Optional[tuple]:
        """ComfyUI's preview tuple for x0 [B, C, T, h, w] (every latent frame), or None (previews off or failed)."""
        if self.clip is None:
            return None
        try:
            return ("JPEG", self.clip(x0.float()), self.max_side)
        except Exception as e:  # a preview must never stop a generation
            self.clip = None
            log.warning("LingBot-World: latent preview disabled for this run: %s", e)
            return None

    def __call__(self, info) -> None:  # a sampler's StepInfo
        self.pbar.update_absolute(info.index + 1, info.total, self.preview(info.x0))

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


def show_on_node(text: str) -> None:
    """Show `text` under the node that is running now (replacing what it showed before). Never raises: outside a
    running prompt (tests, scripts) it only logs."""
    try:
        from comfy_execution.utils import get_executing_context
        from server import PromptServer

        server = PromptServer.instance
        context = get_executing_context()
        node_id = context.node_id if context is not None else server.last_node_id
        if node_id is None:
            return
        server.send_progress_text(text, node_id, server.client_id)
    except Exception as e:  # no server, or an older ComfyUI without progress text
        log.debug("LingBot-World: node text not shown (%s): %s", e, text)


def count(n: int, word: str, plural: str = "") -> str:
    """"1 chunk", "7 chunks": a number and its noun as the node text says it."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


class TextEncodeProgress:
    """`progress(stage, done, total)` for `encode_prompts`: the text encoder's stages on the bar and the node.

    The bar runs 0..100: the child starting (0-5), its weights loading (5-90, by bytes), the prompts (90-100).
    """

    SPANS = {"start": (0, 5), "load": (5, 90), "encode": (90, 100)}

    def __init__(self, prompts: int):
        import comfy.utils

        self.pbar = comfy.utils.ProgressBar(100)
        self.prompts = prompts
        self.stage = None
        self.value = -1

    def __call__(self, stage: str, done: int, total: int) -> None:
        lo, hi = self.SPANS.get(stage, (0, 100))
        value = lo + (hi - lo) * done // total if total > 0 else lo
        if (stage, total) != self.stage:  # a new stage, or the load's size once the child knows it
            self.stage = (stage, total)
            show_on_node(self.describe(stage, total))
        if value != self.value:  # one UI message per percent, not per tensor
            self.value = value
            self.pbar.update_absolute(value, 100)

    def describe(self, stage: str, total: int) -> str:
        if stage == "start":
            return "umT5: starting the encoder process..."
        if stage == "load":
            return "umT5: loading the encoder weights" + (f" ({_size(total)})..." if total > 1 else "...")
        if stage == "encode":
            return f"umT5: encoding {total} prompt{'s' if total != 1 else ''}..."
        return f"umT5: {stage}"

    def finish(self, summary: str) -> None:
        if self.value != 100:
            self.value = 100
            self.pbar.update_absolute(100, 100)
        show_on_node(summary)

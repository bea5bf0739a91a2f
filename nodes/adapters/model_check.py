"""Model choices checked before a prompt runs: the pack's own message instead of ComfyUI's "Value not in list".

A node that declares `VALIDATE_INPUTS(cls, <widget>, ...)` takes over ComfyUI's check of those widgets (0.3.64 and
later), so a missing expert folder, text encoder, VAE or LoRA is refused when the prompt is queued, with one line that
names the widget, the file or folder, where it goes and where to get it. A wrong kind of model (the Fast model as a
high-noise expert, a base expert as the Fast model) is refused the same way: the check reads only headers and
config files. Demo entries (`lingbot-demo/...`) pass: they are built when the node runs.

Each check returns True or the message (ComfyUI's contract for VALIDATE_INPUTS).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Union

from . import comfy_paths, demo_models
from .node_errors import in_node_words

log = logging.getLogger(__name__)

Verdict = Union[bool, str]


def _first(*verdicts: Verdict) -> Verdict:
    return next((v for v in verdicts if v is not True), True)


def expert(widget: str, name: Optional[str], want: str = "base") -> Verdict:
    """An expert choice: installed (or a demo entry) and the right kind ("base": a high/low-noise expert, "fast")."""
    if name is None:  # driven by a link: checked when the node runs
        return True
    if demo_models.is_demo_entry(name):
        return True
    try:
        path = comfy_paths.resolve_expert(name, widget, build_demo=False)
    except FileNotFoundError as e:
        return str(e)
    return expert_kind(widget, path, want)


def expert_kind(widget: str, path: Path, want: str) -> Verdict:
    from ...world.detect import check_model_kind, detect_format

    try:
        check_model_kind(detect_format(path), want)
    except (ValueError, OSError) as e:
        return f"{widget}: {in_node_words(str(e))}"
    return True


def fast_model(cls, fast_model=None) -> Verdict:
    """VALIDATE_INPUTS for LingBot Fast Model Loader."""
    return expert("fast_model", fast_model, want="fast")


def expert_pair(high: Optional[str], low: Optional[str]) -> Verdict:
    """Both experts' problems in one message (ComfyUI shows a VALIDATE_INPUTS message under each input it checks)."""
    problems = [v for v in (expert("high_noise_expert", high), expert("low_noise_expert", low)) if v is not True]
    if len(problems) == 2 and problems[0].count(". ") and _same_advice(*problems):
        head = problems[1].split(". ", 1)[0]  # the second expert's "... was not found in: ...", the advice once
        return f"{problems[0]} Also {head[0].lower()}{head[1:]}."
    verdict = _first(*problems) if problems else True
    if verdict is True and high is not None and high == low:
        return (f"high_noise_expert and low_noise_expert are both '{high}': pick the low_noise_model folder for "
                "low_noise_expert")
    return verdict


def _same_advice(a: str, b: str) -> bool:
    return a.split(". ", 1)[1:] == b.split(". ", 1)[1:]


def model_file(widget: str, name: Optional[str], resolve) -> Verdict:
    """A file choice (text encoder, VAE, LoRA) through its comfy_paths resolver, without building a demo."""
    if name is None or demo_models.is_demo_entry(name):
        return True
    try:
        resolve(name)
    except FileNotFoundError as e:
        return f"{widget}: {e}"
    return True


def text_encoder(name: Optional[str]) -> Verdict:
    return model_file("text_encoder", name, lambda n: comfy_paths.resolve_text_encoder(n, build_demo=False))


def tokenizer(name: Optional[str]) -> Verdict:
    return model_file("tokenizer", name, comfy_paths.resolve_tokenizer)


def vae(name: Optional[str]) -> Verdict:
    return model_file("vae_name", name, lambda n: comfy_paths.resolve_vae(n, build_demo=False))


def lora(name: Optional[str]) -> Verdict:
    return model_file("lora_name", name, comfy_paths.resolve_lora)


def swapped_experts_note(high: Union[str, Path], low: Union[str, Path]) -> Optional[str]:
    """A warning when the folder chosen as high-noise expert is named low-noise and the other way round (or either
    one alone), naming both folders; None when the names agree or say nothing."""
    def says(path, which: str) -> bool:
        return f"{which}_noise" in Path(path).as_posix().lower()

    wrong_high = says(high, "low") and not says(high, "high")
    wrong_low = says(low, "high") and not says(low, "low")
    if not (wrong_high or wrong_low):
        return None
    if wrong_high and wrong_low:
        return (f"The experts look swapped: high_noise_expert is {high} and low_noise_expert is {low}. Swap the two "
                "choices, or the video will be noise.")
    which, path, other = ("high", high, low) if wrong_high else ("low", low, high)
    return (f"The {which}-noise expert {path} is named for the other phase (the other expert is {other}): check "
            f"{which}_noise_expert.")

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

from ...world import hub
from . import comfy_paths, demo_models, model_fetch
from .node_errors import in_node_words

log = logging.getLogger(__name__)

Verdict = Union[bool, str]


def _first(*verdicts: Verdict) -> Verdict:
    return next((v for v in verdicts if v is not True), True)


def expert(widget: str, name: Optional[str], want: str = "base", download: Optional[bool] = False) -> Verdict:
    """An expert choice: installed (or a demo entry, or a download the node's switch allows, or a stored copy's name
    whose release folder is installed) and the right kind ("base": a high/low-noise expert, "fast")."""
    if name is None:  # driven by a link: checked when the node runs
        return True
    if demo_models.is_demo_entry(name):
        return True

    def find(n: str) -> Path:
        return comfy_paths.resolve_expert(n, widget, build_demo=False)

    try:
        path = find(name)
    except FileNotFoundError as e:
        source = model_fetch.source_for(name, find)
        if source is not None:  # the copy is made from it on the first load
            return expert_kind(widget, source, want)
        part = hub.part_for(name)
        if part is None:
            return _not_found(widget, name, want, str(e))
        if part.entry.causal != (want == "fast"):
            return (f"{widget}: {name} is the {part.what()}, " + (
                "not a Fast (causal) model: pick it in LingBot Expert Loader" if want == "fast" else
                "a causal model: pick it in LingBot Fast Model Loader"))
        return True if download else model_fetch.missing_message(widget, name, False)
    return expert_kind(widget, path, want)


def _not_found(widget: str, name: str, want: str, message: str) -> str:
    """A missing choice no download provides; the Fast loader's line names the Fast models' folders."""
    if want != "fast":
        return message
    offers = ", ".join(hub.release_names("fast"))
    return (f"{widget}: '{name}' was not found in {comfy_paths.expert_roots()[0] if comfy_paths.expert_roots() else '(no folders)'}. "
            f"The Fast model is a folder of the release's DiT (config.json and its *.safetensors shards, or their "
            f"NF4 / FP8 / INT8 copy): pick one of {offers} and turn on the node's download switch, or put the "
            f"folder there and refresh the page (press R).")


def expert_kind(widget: str, path: Path, want: str) -> Verdict:
    from ...world.detect import check_model_kind, detect_format

    try:
        check_model_kind(detect_format(path), want)
    except (ValueError, OSError) as e:
        return f"{widget}: {in_node_words(str(e))}"
    return True


def fast_model(cls, fast_model=None, download=None) -> Verdict:
    """VALIDATE_INPUTS for LingBot Fast Model Loader."""
    return expert("fast_model", fast_model, want="fast", download=bool(download))


def expert_pair(high: Optional[str], low: Optional[str], download: Optional[bool] = False) -> Verdict:
    """Both experts' problems in one message (ComfyUI shows a VALIDATE_INPUTS message under each input it checks)."""
    download = bool(download)
    problems = [v for v in (expert("high_noise_expert", high, download=download),
                            expert("low_noise_expert", low, download=download)) if v is not True]
    offers = [hub.part_for(n) for n in (high, low) if n is not None]
    if len(problems) == 2 and len(offers) == 2 and None not in offers and offers[0].entry is offers[1].entry:
        part = offers[0]
        root = model_fetch._root()
        where = root / part.folder if root is not None else part.folder
        return (f"high_noise_expert, low_noise_expert: the {part.entry.title} experts are not installed ({high}, "
                f"{low}): the folders {', '.join(p.patterns[0] for p in offers)} from {part.source()} into {where}. "
                f"Turn on this node's download switch and press Run to fetch only those folders (a stopped download "
                f"resumes); {part.entry.licence.line()}.")
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


def model_file(widget: str, name: Optional[str], resolve, download: Optional[bool] = False) -> Verdict:
    """A file choice (text encoder, VAE, LoRA) through its comfy_paths resolver, without building a demo; a
    release file a download provides passes with the node's download switch on."""
    if name is None or demo_models.is_demo_entry(name):
        return True
    try:
        resolve(name)
    except FileNotFoundError as e:
        if hub.part_for(name) is not None:
            return True if download else model_fetch.missing_message(widget, name, False)
        return f"{widget}: {e}"
    return True


def text_encoder(name: Optional[str], download: Optional[bool] = False) -> Verdict:
    return model_file("text_encoder", name, lambda n: comfy_paths.resolve_text_encoder(n, build_demo=False), download)


def tokenizer(name: Optional[str]) -> Verdict:
    return model_file("tokenizer", name, comfy_paths.resolve_tokenizer)


def vae(name: Optional[str], download: Optional[bool] = False) -> Verdict:
    return model_file("vae_name", name, lambda n: comfy_paths.resolve_vae(n, build_demo=False), download)


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

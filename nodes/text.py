"""Text encoding in a short-lived child process (umT5-XXL never enters ComfyUI's process)."""
from __future__ import annotations

import logging

import torch

from ..world.text import (DEFAULT_NEGATIVE_PROMPT, EMBEDDING_DTYPE, TEXT_LENGTH, TextEncoderStopped, all_cached,
                          encode_prompts, estimate_child_vram_bytes)
from .adapters import comfy_paths
from .adapters.model_fetch import DOWNLOAD
from .adapters.conditioning import to_conditioning
from .adapters.payloads import CATEGORY, TEXT, TextEmbeds
from .adapters.progress import TextEncodeProgress
from .adapters.ui_hints import short_labels

log = logging.getLogger(__name__)

DEVICES = ("auto", "cuda", "cpu")


class FreeMemoryRequested(RuntimeError):
    """The user asked ComfyUI to free memory while the text encoder was running."""


def encode_summary(stats: dict) -> str:
    """The line left on the node after encoding: where the prompts came from and how long the encoder took."""
    worker = stats.get("worker") or {}
    hits, encoded = stats.get("cache_hits", 0), stats.get("encoded", 0)
    cached = f"{hits} from the cache" if hits else ""
    if not encoded:
        return "umT5: both prompts from the cache (no encoder run)" if hits >= 2 else f"umT5: {cached or 'done'}"
    ran = (f"umT5 on {worker.get('device', '?')}: {encoded} prompt{'s' if encoded != 1 else ''} encoded in "
           f"{worker.get('total_s', 0.0):.1f} s (loading {worker.get('load_s', 0.0):.1f} s)")
    return f"{ran}; {cached}" if cached else ran


def child_device(choice: str, cpu_mode: bool) -> str:
    """ComfyUI started with --cpu keeps the child on the CPU too, unless the user forces cuda."""
    if choice not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {choice!r}")
    return "cpu" if choice == "auto" and cpu_mode else choice


def free_memory_requested() -> bool:
    """True while a /free request (Unload models / Free memory buttons) waits for the current prompt to end (ComfyUI
    handles it after the prompt: one made while idle waits for the next prompt)."""
    try:
        import server

        flags = server.PromptServer.instance.prompt_queue.get_flags(reset=False)
    except Exception:  # no server (tests, scripts)
        return False
    return bool(flags.get("free_memory") or flags.get("unload_models"))


class LingBotTextEncode:
    """Positive and negative prompt -> umT5 embeddings, computed in a child process and cached on disk."""

    @classmethod
    def INPUT_TYPES(cls):
        encoders = comfy_paths.list_text_encoders()
        from ..loaders.model_folders import pick_default

        from .adapters.comfy_paths import is_installed

        there = [n for n in encoders if is_installed(n)]  # not a download offered before it is made
        default = pick_default(there, "umt5", avoid=("demo",)) or pick_default(there, "t5", avoid=("demo",))
        enc_opts = {"default": default} if default else {}
        return {
            "required": {
                "text_encoder": (encoders, {**enc_opts, **short_labels(), "tooltip": (
                    "umT5-XXL encoder: umt5_xxl_fp16 / fp8_e4m3fn_scaled .safetensors (Comfy-Org repackaged, in "
                    "models/text_encoders) or the release's models_t5_umt5-xxl-enc-bf16.pth. It runs in a separate "
                    "process that exits after encoding, so its 11 GB never stay in ComfyUI. "
                    "lingbot-world-base-cam/models_t5_umt5-xxl-enc-bf16.pth (with its tokenizer) is downloaded "
                    "from the release with the download switch on.")}),
                "tokenizer": (comfy_paths.list_tokenizers(), {"default": comfy_paths.AUTO_TOKENIZER, **short_labels(), "advanced": True,
                                                               "tooltip": (
                    "auto: the tokenizer stored inside Comfy-Org's umt5 .safetensors, or a google/umt5-xxl/ or "
                    "tokenizer/ folder next to the encoder file. Or pick a folder with tokenizer.json / spiece.model.")}),
                "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": (
                    "What happens in the video. The camera motion comes from the camera input, not from the text.")}),
                "negative_prompt": ("STRING", {"multiline": True, "default": DEFAULT_NEGATIVE_PROMPT, "tooltip": (
                    "What to avoid. Defaults to LingBot-World's own negative prompt; leaving it empty uses that too.")}),
                "device": (list(DEVICES), {"default": "auto", "advanced": True, "tooltip": (
                    "Where the child process runs the encoder. auto: the GPU if it has room after ComfyUI frees "
                    "memory for it (about 10 GB), else the CPU (slow, needs about 12 GB RAM).")}),
                "cache": ("BOOLEAN", {"default": True, "advanced": True, "tooltip": (
                    "Keep embeddings on disk (ComfyUI user folder, lingbot_world/text_cache): a repeated prompt "
                    "never starts the encoder again.")}),
            },
            "optional": {"download": DOWNLOAD},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, text_encoder=None, tokenizer=None, download=None):
        from .adapters import model_check

        return model_check._first(model_check.text_encoder(text_encoder, bool(download)),
                                  model_check.tokenizer(tokenizer))

    RETURN_TYPES = (TEXT, "CONDITIONING", "CONDITIONING")
    RETURN_NAMES = ("text", "positive", "negative")
    OUTPUT_TOOLTIPS = ("Prompt and negative prompt embeddings for LingBot Sampler",
                       "The prompt as native CONDITIONING (KSampler on LingBot MODELs, LingBot Image To Video (native))",
                       "The negative prompt as native CONDITIONING")
    FUNCTION = "encode"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Encodes the prompts with umT5-XXL in a child process (stopped on cancel and on Free memory), for "
                   "LingBot Sampler and as native CONDITIONING.")

    def encode(self, text_encoder: str, tokenizer: str, prompt: str, negative_prompt: str, device: str = "auto",
               cache: bool = True, download: bool = False):
        import comfy.model_management as mm

        from .adapters.model_fetch import resolve
        from .adapters.patchers import TextEncoderSlot, unload_patcher

        encoder = resolve(text_encoder, "text_encoder", comfy_paths.resolve_text_encoder, bool(download))
        tok = comfy_paths.resolve_tokenizer(tokenizer)
        negative = negative_prompt if negative_prompt.strip() else DEFAULT_NEGATIVE_PROMPT
        texts = [prompt, negative]
        dev = child_device(device, mm.cpu_mode())
        cache_dir = comfy_paths.text_cache_dir()

        slot = None
        if dev != "cpu" and not mm.cpu_mode() and not (cache and all_cached(encoder, tok, texts, cache_dir)):
            # Make room on the GPU the way ComfyUI does for its own models, and be unloadable meanwhile.
            slot = TextEncoderSlot(estimate_child_vram_bytes(encoder, EMBEDDING_DTYPE), mm.get_torch_device(),
                                   torch.device("cpu"))
            mm.load_models_gpu([slot], force_full_load=True)

        # A /free posted while ComfyUI was idle waits for the next prompt to end: it is not a request to stop this
        # one. Only a /free that arrives while the child runs stops it.
        freed_before = free_memory_requested()

        def free_requested_now() -> bool:
            return not freed_before and free_memory_requested()

        def cancel() -> bool:
            return mm.processing_interrupted() or free_requested_now()

        progress = TextEncodeProgress(len(set(texts)))
        stats: dict = {}
        try:
            positive_emb, negative_emb = encode_prompts(encoder, tok, texts, device=dev, dtype=EMBEDDING_DTYPE,
                                                        cache_dir=cache_dir, use_cache=cache, cancel_check=cancel,
                                                        stats=stats, progress=progress)
        except TextEncoderStopped:
            mm.throw_exception_if_processing_interrupted()  # a cancel: ComfyUI reports it as interrupted
            if free_requested_now():
                raise FreeMemoryRequested(
                    "text encoding was stopped because ComfyUI was asked to free memory; queue the prompt again"
                ) from None
            raise
        finally:
            if slot is not None:
                unload_patcher(slot)
        progress.finish(encode_summary(stats))
        return (TextEmbeds(positive_emb, negative_emb, prompt, negative), to_conditioning(positive_emb, TEXT_LENGTH),
                to_conditioning(negative_emb, TEXT_LENGTH))

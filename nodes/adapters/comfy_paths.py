"""ComfyUI model folders for the pack: registration, combo lists and name -> path resolution.

Layout (all keys can be extended from `extra_model_paths.yaml`):
- `lingbot_world` (models/lingbot_world): whole checkpoints as downloaded, e.g. the community NF4 repo
  `lingbot-world-base-cam-nf4/{high,low}_noise_model_bnb_nf4/`, `models_t5_umt5-xxl-enc-bf16.pth`,
  `Wan2.1_VAE.pth`, `tokenizer/`;
- `diffusion_models`: expert folders or single-file LingBot experts also work from there;
- `text_encoders` / `vae`: ComfyUI's own umt5 / Wan VAE files (Comfy-Org repackaged).
- `vae_approx`: ComfyUI's preview decoders; LingBot Play's `tiny_vae` lists them (taew2_1, lighttaew2_1).

INPUT_TYPES calls the list_* functions on every UI refresh: they never raise (a broken folder logs and
yields an empty list) and only list directories and read small headers.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Optional

from ...loaders import model_folders as mf
from ...world import hub
from . import demo_models

log = logging.getLogger(__name__)

FOLDER_KEY = "lingbot_world"
AUTO_TOKENIZER = "auto"
TINY_VAE_FOLDER = "vae_approx"  # ComfyUI's folder of TAESD / TAEHV preview decoders
TINY_VAE_SUFFIXES = (".safetensors", ".pth", ".pt")
NO_TINY_VAE = "none"
NF4_REPO = "huggingface.co/cahlen/lingbot-world-base-cam-nf4"
EXPERT_FILES = ("an expert is a FOLDER, not one file: the NF4 one holds config.json, model.safetensors and "
                "quantization_meta.json; the release's holds config.json and diffusion_pytorch_model-*.safetensors")
DOWNLOAD_HINT = (
    f"Download the NF4 experts from {NF4_REPO} (the Act model: robbyant/lingbot-world-base-act; the Fast model: "
    "robbyant/lingbot-world-fast) into ComfyUI/models/lingbot_world/, keeping their folders, then refresh the page "
    "(press R). Or pick a lingbot-demo entry: the tiny CPU demo is built on first use."
)


class ModelFileNotFound(FileNotFoundError):
    """A model name from the workflow does not exist in any registered folder."""


def _fp():
    import folder_paths  # ComfyUI's module; imported here so the pack imports without ComfyUI

    return folder_paths


def register_model_folders() -> None:
    """Add `lingbot_world` -> models/lingbot_world without dropping paths a user's yaml already added."""
    fp = _fp()
    default = os.path.join(fp.models_dir, FOLDER_KEY)
    fp.add_model_folder_path(FOLDER_KEY, default, is_default=False)
    try:
        os.makedirs(default, exist_ok=True)  # so users see where the files go
    except OSError as e:
        log.debug("could not create %s: %s", default, e)


def _paths(key: str) -> list[str]:
    try:
        return _fp().get_folder_paths(key)
    except KeyError:
        return []


def lingbot_roots() -> list[str]:
    return _paths(FOLDER_KEY)


def expert_roots() -> list[str]:
    return lingbot_roots() + _paths("diffusion_models")


def _safe(fn: Callable[[], list[str]], what: str) -> list[str]:
    try:
        return fn()
    except Exception:  # INPUT_TYPES must never fail: the node would vanish from the UI
        log.exception("LingBot-World: listing %s failed", what)
        return []


def _unique(*lists: list[str]) -> list[str]:
    return list(dict.fromkeys(n for lst in lists for n in lst))


def list_experts() -> list[str]:
    def scan() -> list[str]:
        roots = expert_roots()
        return _unique(mf.scan_expert_dirs(roots), mf.scan_expert_files(roots), demo_models.demo_entries("experts"),
                       demo_models.demo_entries("fast"), hub.release_names("experts"), hub.release_names("fast"))

    return _safe(scan, "experts")


def list_text_encoders() -> list[str]:
    return _safe(lambda: _unique(_fp().get_filename_list("text_encoders"), mf.scan_t5_files(lingbot_roots()),
                                 demo_models.demo_entries("text_encoder"), hub.release_names("text_encoder")),
                 "text encoders")


def list_tokenizers() -> list[str]:
    return [AUTO_TOKENIZER] + _safe(lambda: mf.scan_tokenizer_dirs(_paths("text_encoders") + lingbot_roots()),
                                    "tokenizers")


def list_vaes() -> list[str]:
    return _safe(lambda: _unique(_fp().get_filename_list("vae"), mf.scan_vae_files(lingbot_roots()),
                                 demo_models.demo_entries("vae"), hub.release_names("vae")), "VAEs")


def list_loras() -> list[str]:
    """ComfyUI's loras folder; pickled .pt/.ckpt LoRAs are listed by ComfyUI too but refused when loaded."""
    return _safe(lambda: [n for n in _fp().get_filename_list("loras") if n.lower().endswith(".safetensors")], "LoRAs")


def resolve_lora(name: str) -> Path:
    full = _fp().get_full_path("loras", name)
    if full is None:
        raise _not_found("LoRA", name, _paths("loras"), "Put the LoRA (.safetensors) in ComfyUI/models/loras/ and "
                         "refresh the page (press R), or bypass this LoRA loader (Ctrl+B).")
    return Path(full)


def list_tiny_vaes() -> list[str]:
    """"none", then the files of ComfyUI's vae_approx folder a tiny decoder can be read from (taew2_1,
    lighttaew2_1; the folder's other TAESD files are listed too and refused by the loader when chosen)."""
    def scan() -> list[str]:
        try:
            names = _fp().get_filename_list(TINY_VAE_FOLDER)
        except KeyError:  # a ComfyUI without the folder
            return []
        return [n for n in names if n.lower().endswith(TINY_VAE_SUFFIXES)]

    return [NO_TINY_VAE] + _safe(scan, "tiny VAEs")


def tiny_vae_folder() -> Path:
    """The vae_approx folder a downloaded tiny decoder goes into (ComfyUI's first)."""
    roots = _paths(TINY_VAE_FOLDER)
    if not roots:
        raise ModelFileNotFound("ComfyUI has no vae_approx model folder to put a tiny decoder in")
    return Path(roots[0])


def resolve_tiny_vae(name: str) -> Path:
    full = _fp().get_full_path(TINY_VAE_FOLDER, name)
    if full is None:
        raise _not_found("tiny VAE", name, _paths(TINY_VAE_FOLDER),
                         "Put taew2_1.safetensors (TAEHV) or lighttaew2_1.safetensors (lightx2v) in "
                         "ComfyUI/models/vae_approx/ and refresh the page (press R), or choose none.")
    return Path(full)


def _not_found(kind: str, name: str, roots: list[str], hint: str) -> ModelFileNotFound:
    """One line: what is missing, where it was looked for (the first folder, where it goes, and how many others)."""
    if not roots:
        where = "(no folders registered)"
    else:
        where = roots[0] + (f" and {len(roots) - 1} other model folder{'s' if len(roots) > 2 else ''}"
                            if len(roots) > 1 else "")
    return ModelFileNotFound(f"{kind} '{name}' was not found in: {where}. {hint}")


def _demo(name: str, build: bool = True) -> Optional[Path]:
    """A demo entry, built on first use in the first lingbot_world folder (build=False: its future path, for
    validation, which must stay quick)."""
    if not build:
        roots = lingbot_roots()
        return Path(roots[0]) / name if roots and demo_models.is_demo_entry(name) else None
    return demo_models.ensure_demo(name, lingbot_roots())


def expert_missing(name: str, which: str = "expert") -> ModelFileNotFound:
    return _not_found(which, name, expert_roots(), f"Put it there; {EXPERT_FILES}. {DOWNLOAD_HINT}")


def resolve_expert(name: str, which: str = "expert", build_demo: bool = True) -> Path:
    p = mf.resolve_in_roots(expert_roots(), name) or _demo(name, build_demo)
    if p is None:
        raise expert_missing(name, which)
    return p


def _resolve_model_file(folder_key: str, name: str, what: str, hint: str, build_demo: bool = True) -> Path:
    """A file from a ComfyUI model folder, or else from the lingbot_world folders."""
    full = _fp().get_full_path(folder_key, name)
    if full is not None:
        return Path(full)
    p = mf.resolve_in_roots(lingbot_roots(), name, want_dir=False) or _demo(name, build_demo)
    if p is None:
        raise _not_found(what, name, _paths(folder_key) + lingbot_roots(), hint)
    return p


def resolve_text_encoder(name: str, build_demo: bool = True) -> Path:
    return _resolve_model_file(
        "text_encoders", name, "text encoder",
        "Put umt5_xxl_fp16.safetensors (from huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged, "
        "split_files/text_encoders) in ComfyUI/models/text_encoders/, or the release's "
        "models_t5_umt5-xxl-enc-bf16.pth in ComfyUI/models/lingbot_world/, then refresh the page (press R).", build_demo)


def resolve_tokenizer(name: str) -> Optional[Path]:
    """None for "auto" (the tokenizer inside / beside the encoder file), else the chosen folder."""
    if name == AUTO_TOKENIZER:
        return None
    roots = _paths("text_encoders") + lingbot_roots()
    p = mf.resolve_in_roots(roots, name, want_dir=True)
    if p is None:
        raise _not_found("tokenizer folder", name, roots, "Choose 'auto' or a folder with tokenizer.json / spiece.model.")
    return p


def resolve_vae(name: str, build_demo: bool = True) -> Path:
    return _resolve_model_file(
        "vae", name, "VAE",
        "Put wan_2.1_vae.safetensors (from huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged, split_files/vae) in "
        "ComfyUI/models/vae/, or the release's Wan2.1_VAE.pth in ComfyUI/models/lingbot_world/, then refresh the "
        "page (press R).", build_demo)


def list_trajectories() -> list[str]:
    """Camera trajectory folders (poses.npy + intrinsics.npy) under ComfyUI's input folder."""
    return _safe(lambda: mf.scan_trajectory_dirs([_fp().get_input_directory()]), "camera trajectories")


def _resolve_input_folder(name: str, what: str, holding: str) -> Path:
    """A folder in ComfyUI's input folder, or one line saying what it must hold and where."""
    root = _fp().get_input_directory()
    p = mf.resolve_in_roots([root], name, want_dir=True)
    if p is None:
        raise ModelFileNotFound(f"{what} '{name}' was not found in {root}: put a folder holding {holding}, then "
                                "refresh the page (press R)")
    return p


def resolve_trajectory(name: str) -> Path:
    return _resolve_input_folder(name, "camera trajectory folder", "poses.npy and intrinsics.npy there (or upload "
                                 "the two files on the node)")


def list_key_folders() -> list[str]:
    """Key-file folders (wasd_action.npy / ijkl_action.npy, or the Act files) under ComfyUI's input folder."""
    return _safe(lambda: mf.scan_key_dirs([_fp().get_input_directory()]), "key-file folders")


def resolve_key_folder(name: str) -> Path:
    return _resolve_input_folder(name, "key-file folder", "wasd_action.npy / ijkl_action.npy (or action.npy + "
                                 "poses.npy + intrinsics.npy) there")


def resolve_input_path(path: str, what: str) -> Path:
    """An absolute path, or one relative to ComfyUI's input folder."""
    text = path.strip().strip('"').strip("'")
    if not text:
        raise ValueError(f"{what}: no path given; enter a folder or file inside ComfyUI/input or an absolute path")
    p = Path(text).expanduser()
    if p.is_absolute():
        return p
    return Path(_fp().get_input_directory()) / p


def text_cache_dir() -> Path:
    """Prompt-embedding cache under ComfyUI's user directory (survives restarts, per user install)."""
    return Path(_fp().get_user_directory()) / "lingbot_world" / "text_cache"


def output_directory() -> Path:
    return Path(_fp().get_output_directory())


def is_installed(name: str) -> bool:
    """False for a release name listed as a download offer that is not on disk yet."""
    if name not in set(hub.release_names("experts") + hub.release_names("fast") + hub.release_names("text_encoder") +
                       hub.release_names("vae")):
        return True
    return mf.resolve_in_roots(expert_roots(), name) is not None


def _combo(names: list[str], *hints: str, avoid: tuple = ()) -> tuple:
    from ...loaders.model_folders import pick_default

    opts: dict = {}
    there = [n for n in names if is_installed(n)]  # not a download offered before it is made
    installed = [n for n in there if not demo_models.is_demo_entry(n)]  # a real install first, the demo last
    default = pick_default(installed, *hints, avoid=avoid) or pick_default(there, *hints, avoid=tuple(avoid) + ("act",))
    if default is not None:
        opts["default"] = default
    return names, opts


def _expert_combo(names: list[str], *hints: str) -> tuple:
    """An expert combo whose default is a Cam expert when Act experts are installed too (a folder with the word
    'act', like the release's lingbot-world-base-act): a new graph starts from the camera workflows, and an Act
    expert refuses a camera input. An Act-only install still gets its Act experts."""
    return _combo(names, *hints, avoid=("act",))

"""Find the pieces of a LingBot-World checkpoint folder (official release or the community NF4 package).

The causal models' folders are their registry entries' (world/models.py, world/files.py); what every download
shares (the umT5 encoder, its tokenizer, the VAE) is found here.

Official (`robbyant/lingbot-world-base-cam`): high_noise_model/, low_noise_model/,
models_t5_umt5-xxl-enc-bf16.pth, Wan2.1_VAE.pth, google/umt5-xxl/.
Community NF4 (`cahlen/lingbot-world-base-cam-nf4`): high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/,
the same T5 and VAE files, tokenizer/.
When both expert flavours are present the NF4 folders win (they are what fits a consumer GPU).
Fast (`robbyant/lingbot-world-fast`, placed as `lingbot_world_fast/` inside the base-cam folder, or its NF4 copy
`lingbot_world_fast_bnb_nf4/`, or its FP8 / INT8 copy `lingbot_world_fast_fp8/` / `lingbot_world_fast_int8/` from
`lingbot-world convert-fp8` / `convert-int8`, read with `--weights fp8` / `--weights int8`): one causal model; it reuses the base package's T5, tokenizer and VAE.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


EXPERT_DIRS = {
    "high": ("high_noise_model_bnb_nf4", "high_noise_model"),
    "low": ("low_noise_model_bnb_nf4", "low_noise_model"),
}
T5_FILES = ("models_t5_umt5-xxl-enc-bf16.pth", "umt5_xxl_fp16.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
VAE_FILES = ("Wan2.1_VAE.pth", "wan_2.1_vae.safetensors")
TOKENIZER_DIRS = ("tokenizer", "google/umt5-xxl")
FAST_DIRS = ("lingbot_world_fast_bnb_nf4", "lingbot_world_fast")  # v1 Fast (the base package may hold it)


@dataclass
class CheckpointFiles:
    root: Path
    high: Path
    low: Path
    t5: Path
    vae: Path
    tokenizer: Optional[Path]  # None: read the tokenizer embedded in the T5 safetensors


def _first(root: Path, names, what: str, is_dir: bool) -> Path:
    for n in names:
        p = root / n
        if (p.is_dir() if is_dir else p.is_file()):
            return p
    raise FileNotFoundError(
        f"{root}: no {what} found (looked for {', '.join(names)}). Download the LingBot-World files into this "
        f"folder (see README 'Model files')."
    )


def find_checkpoint_files(root) -> CheckpointFiles:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder {root} does not exist")
    fast = next((root / d for d in FAST_DIRS if (root / d).is_dir()), None)
    if fast is not None and not any((root / d).is_dir() for d in EXPERT_DIRS["high"] + EXPERT_DIRS["low"]):
        raise FileNotFoundError(f"{root} holds only the Fast model ({fast.name}/), not the two base experts: "
                                "run it with --model fast")
    high = _first(root, EXPERT_DIRS["high"], "high-noise expert folder", True)
    low = _first(root, EXPERT_DIRS["low"], "low-noise expert folder", True)
    t5, vae, tok = _shared_files(root)
    return CheckpointFiles(root, high, low, t5, vae, tok)


def _shared_in(root: Path) -> Optional[tuple[Path, Path, Optional[Path]]]:
    """The T5, VAE and tokenizer of one folder, None when it lacks the T5 or the VAE."""
    t5 = next((root / n for n in T5_FILES if (root / n).is_file()), None)
    vae = next((root / n for n in VAE_FILES if (root / n).is_file()), None)
    if t5 is None or vae is None:
        return None
    tok = next((root / d for d in TOKENIZER_DIRS if (root / d).is_dir()), None)
    if tok is None and t5.suffix != ".safetensors":
        raise FileNotFoundError(
            f"{root}: no tokenizer folder (looked for {', '.join(TOKENIZER_DIRS)}); the .pth encoder carries no "
            f"tokenizer, so download google/umt5-xxl/ (or tokenizer/) beside it"
        )
    return t5, vae, tok


def _shared_files(root: Path) -> tuple[Path, Path, Optional[Path]]:
    """T5, VAE and tokenizer of a release folder (shared by the base experts and the causal models)."""
    t5 = _first(root, T5_FILES, "umT5-XXL encoder file", False)
    vae = _first(root, VAE_FILES, "Wan2.1 VAE file", False)
    return _shared_in(root) or (t5, vae, None)


def shared_files(root: Path, assets: Optional[Path] = None,
                 found_in: Optional[Path] = None) -> tuple[Path, Path, Optional[Path]]:
    """The umT5 encoder, VAE and tokenizer for a model in `root`: in `root` itself, else in `assets` (a LingBot-World
    download that has them: every release ships the same three), else in a folder beside `root` that has them (the
    v2 1.3B's download holds its DiT only). found_in: the DiT's folder, for the message."""
    for folder in ([root] + ([Path(assets).expanduser()] if assets is not None else [])):
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: not a folder (it should hold the umT5 encoder, tokenizer and VAE)")
        got = _shared_in(folder)
        if got is not None:
            return got
    if assets is None and root.parent != root:
        for sibling in sorted(p for p in root.parent.iterdir() if p.is_dir() and p != root):
            try:
                got = _shared_in(sibling)
            except (FileNotFoundError, PermissionError):
                continue
            if got is not None:
                return got
    where = f"{root}" + (f" or {assets}" if assets is not None else f" or a folder beside it in {root.parent}")
    raise FileNotFoundError(
        f"no umT5 encoder ({' / '.join(T5_FILES[:2])}) and Wan2.1 VAE ({' / '.join(VAE_FILES)}) found in {where}"
        f"{f' for the model in {found_in}' if found_in is not None else ''}: every LingBot-World download has them "
        "(e.g. robbyant/lingbot-world-v2-14b-causal-fast or lingbot-world-base-cam); put them beside the model or "
        "name that download with --assets-dir")

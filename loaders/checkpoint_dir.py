"""Find the pieces of a LingBot-World checkpoint folder (official release or the community NF4 package).

Official (`robbyant/lingbot-world-base-cam`): high_noise_model/, low_noise_model/,
models_t5_umt5-xxl-enc-bf16.pth, Wan2.1_VAE.pth, google/umt5-xxl/.
Community NF4 (`cahlen/lingbot-world-base-cam-nf4`): high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/,
the same T5 and VAE files, tokenizer/.
When both expert flavours are present the NF4 folders win (they are what fits a consumer GPU).
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
    high = _first(root, EXPERT_DIRS["high"], "high-noise expert folder", True)
    low = _first(root, EXPERT_DIRS["low"], "low-noise expert folder", True)
    t5 = _first(root, T5_FILES, "umT5-XXL encoder file", False)
    vae = _first(root, VAE_FILES, "Wan2.1 VAE file", False)
    tok = next((root / d for d in TOKENIZER_DIRS if (root / d).is_dir()), None)
    if tok is None and t5.suffix != ".safetensors":
        raise FileNotFoundError(
            f"{root}: no tokenizer folder (looked for {', '.join(TOKENIZER_DIRS)}); the .pth encoder carries no "
            f"tokenizer, so download google/umt5-xxl/ (or tokenizer/) beside it"
        )
    return CheckpointFiles(root, high, low, t5, vae, tok)

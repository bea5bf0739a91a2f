"""Find the pieces of a LingBot-World checkpoint folder (official release or the community NF4 package).

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

from ..quant.lowp_kinds import LOWP_WEIGHTS

EXPERT_DIRS = {
    "high": ("high_noise_model_bnb_nf4", "high_noise_model"),
    "low": ("low_noise_model_bnb_nf4", "low_noise_model"),
}
T5_FILES = ("models_t5_umt5-xxl-enc-bf16.pth", "umt5_xxl_fp16.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
VAE_FILES = ("Wan2.1_VAE.pth", "wan_2.1_vae.safetensors")
TOKENIZER_DIRS = ("tokenizer", "google/umt5-xxl")
FAST_DIRS = ("lingbot_world_fast_bnb_nf4", "lingbot_world_fast")
# --weights fp8 / int8: that stored copy, else the official float folder (quantized while loading); never NF4
FAST_LOWP_DIRS = {kind: f"lingbot_world_fast_{kind}" for kind in LOWP_WEIGHTS}


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


@dataclass
class FastCheckpointFiles:
    root: Path
    fast: Path
    t5: Path
    vae: Path
    tokenizer: Optional[Path]


def _shared_files(root: Path) -> tuple[Path, Path, Optional[Path]]:
    """T5, VAE and tokenizer of a release folder (shared by the base experts and the Fast model)."""
    t5 = _first(root, T5_FILES, "umT5-XXL encoder file", False)
    vae = _first(root, VAE_FILES, "Wan2.1 VAE file", False)
    tok = next((root / d for d in TOKENIZER_DIRS if (root / d).is_dir()), None)
    if tok is None and t5.suffix != ".safetensors":
        raise FileNotFoundError(
            f"{root}: no tokenizer folder (looked for {', '.join(TOKENIZER_DIRS)}); the .pth encoder carries no "
            f"tokenizer, so download google/umt5-xxl/ (or tokenizer/) beside it"
        )
    return t5, vae, tok


def find_fast_checkpoint_files(root, weights: str = "nf4") -> FastCheckpointFiles:
    """The Fast model folder and the base package's T5 / VAE / tokenizer from the same release folder.

    The NF4 copy wins over the official folder when both are there; weights "fp8" / "int8" look for that stored
    copy, then the official folder. The Fast model may also sit one level up (the release's own layout puts
    `lingbot_world_fast/` inside `lingbot-world-base-cam/`, so `root` may be either).
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder {root} does not exist")
    lowp_dir = FAST_LOWP_DIRS.get(weights)
    dirs = (lowp_dir, FAST_DIRS[1]) if lowp_dir else FAST_DIRS
    fast = next((root / d for d in dirs if (root / d).is_dir()), None)
    if fast is None and root.name in (*FAST_DIRS, *FAST_LOWP_DIRS.values()):  # --ckpt-dir pointed at the Fast folder itself
        fast, root = root, root.parent
    try:
        t5, vae, tok = _shared_files(root)
    except FileNotFoundError as e:
        if fast is None:
            raise FileNotFoundError(f"{root}: no Fast model folder ({' or '.join(FAST_DIRS)}) and {e}") from None
        raise
    if fast is None and lowp_dir:
        raise FileNotFoundError(
            f"{root}: no {weights.upper()} Fast model folder (looked for {', '.join(dirs)}); make it with "
            f"`lingbot-world convert-{weights} {root / FAST_DIRS[1]} {root / lowp_dir}` (or from {FAST_DIRS[0]}/, "
            "with the NF4 error kept), or use --weights nf4")
    if fast is None:
        raise FileNotFoundError(
            f"{root}: no Fast model folder (looked for {', '.join(FAST_DIRS)}). Download robbyant/lingbot-world-fast "
            f"into {root / 'lingbot_world_fast'}; the T5 ({t5.name}), VAE ({vae.name}) and tokenizer of this folder "
            "were found and are reused.")
    return FastCheckpointFiles(root, fast, t5, vae, tok)

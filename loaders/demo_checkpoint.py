"""A tiny random-weight LingBot-World checkpoint in the real on-disk formats, for the demo and tests.

It has the community NF4 layout (two `*_bnb_nf4/` experts with config.json and quantization_meta.json; Cam
experts by default, Act experts with `control="act"`, in a folder of their own as in the release; the causal
models' demos are added by world/demos.py: v1 Fast inside the Cam folder, as the release puts it there),
the release's T5 `.pth` (Wan naming, bf16), a SentencePiece tokenizer folder (trained here on a few
sentences, umT5's special ids) and the release's VAE `.pth` — so the demo drives exactly the code paths a
real download does, only with tiny sizes. Its output is noise: the weights are random.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Optional

import torch

from ..wan.dit.model import DiTConfig
from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
from ..wan.text.umt5 import UMT5Config, UMT5Encoder
from ..wan.vae.model import VAEConfig, WanVAE
from .atomic import atomic_dir
from .checkpoint_dir import FAST_DIRS, CheckpointFiles, find_checkpoint_files

DEMO_VERSION = 1
MANIFEST = "lingbot_demo.json"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEMO_IMAGE = ASSETS / "demo_image.jpg"
DEMO_PROMPT = (
    "The video presents a soaring journey through a fantasy jungle. The ancient gothic castle approaches "
    "steadily, its stone details becoming clearer against the backdrop of floating islands."
)


DEMO_CONTROLS = ("camera", "act")
CONTROL_IN = {"camera": 1536, "act": 1792}  # patch_embedding_wancamctrl input width (6 or 7 channels x 256)


def demo_configs(control: str = "camera") -> tuple[DiTConfig, UMT5Config, VAEConfig]:
    if control not in DEMO_CONTROLS:
        raise ValueError(f"demo control {control!r}: choose one of {', '.join(DEMO_CONTROLS)}")
    t5 = UMT5Config.tiny(vocab_size=384)
    return DiTConfig.tiny(text_dim=t5.dim, control_in=CONTROL_IN[control]), t5, VAEConfig.tiny()


def default_demo_dir(control: str = "camera") -> Path:
    base = os.environ.get("LINGBOT_WORLD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lingbot-world"
    )
    return Path(base) / (f"demo-v{DEMO_VERSION}" + ("" if control == "camera" else f"-{control}"))


def _train_tokenizer(out: Path, vocab_size: int) -> None:
    """A small unigram SentencePiece model with umT5's conventions (pad 0, eos 1, unk 2, no bos)."""
    import sentencepiece as spm

    corpus = [DEMO_PROMPT, DEFAULT_NEGATIVE_PROMPT] + [
        "A camera moves forward through a misty forest at dawn.",
        "An urban street with people walking, cars and neon signs at night.",
        "Stonehenge under a cloudy sky, the camera orbits slowly around the stones.",
        "A castle on a hill, waterfalls, floating islands, birds flying over the jungle.",
        "镜头缓慢向前推进，穿过古老的城堡和茂密的丛林。",
    ] * 4
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "spiece.model").write_bytes(model.getvalue())


# what every demo shares with the causal models' demos (world/demos.py links them beside a model that needs them)
DEMO_SHARED_FILES = ("models_t5_umt5-xxl-enc-bf16.pth", "google", "Wan2.1_VAE.pth", MANIFEST)
DEMO_ENTRIES = frozenset({"high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4", *DEMO_SHARED_FILES, FAST_DIRS[0],
                          *(f"{FAST_DIRS[1]}_{kind}" for kind in ("fp8", "int8"))})


class _BuiltElsewhere(Exception):
    """Another process finished the same demo folder first (ours is discarded)."""


def build_demo_checkpoint(root: Optional[Path] = None, seed: int = 0, control: str = "camera") -> CheckpointFiles:
    """Create (once) and return the demo checkpoint folder. Safe to call repeatedly: a complete folder is reused.

    control: "camera" (Base Cam experts, plus the Fast model) or "act" (Base Act experts, 7-channel control); the
    text encoder, tokenizer and VAE are the same files in both.
    The folder is built under a temp name and renamed when complete (loaders/atomic.py), so a killed build
    never leaves a folder that looks usable; its leftovers are removed by the next build. A folder holding
    only demo files but no manifest (a partial build of an older version) is rebuilt.
    """
    demo_configs(control)  # validates `control`
    root = Path(root).expanduser() if root is not None else default_demo_dir(control)
    if (root / MANIFEST).is_file():
        files = find_checkpoint_files(root)
        made = json.loads((root / MANIFEST).read_text()).get("control", "camera")
        if made != control:
            raise FileExistsError(f"{root} holds the {made} demo, not the {control} one; choose another demo folder")
        return files
    if root.exists():
        if not root.is_dir():
            raise FileExistsError(f"{root} exists and is not a folder; choose another demo folder")
        foreign = sorted(p.name for p in root.iterdir() if p.name not in DEMO_ENTRIES)
        if foreign:
            raise FileExistsError(f"{root} exists and is not a demo checkpoint (it holds {', '.join(foreign[:3])}); "
                                  "choose another demo folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_dir(root, replace=True) as tmp:
            _write_demo(tmp, seed, control)
            if (root / MANIFEST).is_file():
                raise _BuiltElsewhere
    except _BuiltElsewhere:
        pass
    return find_checkpoint_files(root)


def _write_demo(tmp: Path, seed: int, control: str) -> None:
    from .nf4_writer import make_random_nf4_expert  # bitsandbytes: imported only to build (seconds)

    dit_cfg, t5_cfg, vae_cfg = demo_configs(control)
    expert_seed = seed + (0 if control == "camera" else 100)
    for i, name in enumerate(("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4")):
        make_random_nf4_expert(dit_cfg, tmp / name, device="cpu", seed=expert_seed + i)

    g = torch.Generator().manual_seed(seed + 10)
    with torch.device("meta"):
        t5 = UMT5Encoder(t5_cfg)
    t5_sd = {k: (torch.randn(v.shape, generator=g) * (0.5 if k.endswith("norm1.weight") else 0.2)).to(torch.bfloat16)
             for k, v in t5.state_dict().items()}
    torch.save(t5_sd, tmp / "models_t5_umt5-xxl-enc-bf16.pth")
    _train_tokenizer(tmp / "google" / "umt5-xxl", t5_cfg.vocab_size)

    torch.manual_seed(seed + 20)
    vae = WanVAE(vae_cfg)
    torch.save({k: v.clone() for k, v in vae.state_dict().items()}, tmp / "Wan2.1_VAE.pth")

    (tmp / MANIFEST).write_text(json.dumps({
        "demo_version": DEMO_VERSION,
        "note": "random weights: the output is noise",
        "control": control,
        "dit": dit_cfg.to_json(),
        "t5": {k: getattr(t5_cfg, k) for k in ("vocab_size", "dim", "num_heads", "head_dim", "ffn_dim", "num_layers")},
        "vae": {"dim": vae_cfg.dim, "dim_mult": list(vae_cfg.dim_mult), "num_res_blocks": vae_cfg.num_res_blocks},
    }, indent=2))


def demo_vae_config(root: Path) -> Optional[VAEConfig]:
    """The VAE config recorded in a demo folder's manifest (None for a real checkpoint)."""
    m = Path(root) / MANIFEST
    if not m.is_file():
        return None
    v = json.loads(m.read_text())["vae"]
    return VAEConfig.tiny(dim=v["dim"], dim_mult=tuple(v["dim_mult"]), num_res_blocks=v["num_res_blocks"])


DEMO_TINY_WIDTHS = (8, 6, 5, 4)


def write_random_tiny_vae(path: Path, widths: tuple = DEMO_TINY_WIDTHS, seed: int = 0,
                          dtype: torch.dtype = torch.float16) -> Path:
    """A tiny decoder file in taew2_1's format (`decoder.<index>.…` keys, fp16 as released) with random weights
    scaled so activations stay in range: the demo's and the benchmarks' stand-in (widths (256, 128, 64, 64) for the
    real size). Written atomically."""
    from safetensors.torch import save_file

    from ..wan.vae.tiny import TinyConfig, TinyDecoder
    from .atomic import atomic_path

    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in TinyDecoder(TinyConfig(widths=tuple(widths))).state_dict().items()}
    tensors = {}
    for k, s in shapes.items():
        fan_in = s[1] * s[2] * s[3] if len(s) == 4 else 1
        scale = (1.0 / fan_in) ** 0.5 if len(s) == 4 else 0.05
        tensors[k] = (torch.randn(s, generator=g) * scale).to(dtype).contiguous()
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))
    return path

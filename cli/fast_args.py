"""The causal models' flags of `lingbot-world generate` (its parser only: nothing here runs a model). The model
names, their recipes and licences come from the registry (world/models.py)."""
from __future__ import annotations

from pathlib import Path

from ..wan.sampling.fast_state import FAST_MODES
from .request_base import Given
from ..world.models import causal_models

BASE = "base"  # the two v1 base experts (Cam or Act, told from their weights)
STREAM_DECODE = ("auto", "on", "off")


def model_choices() -> tuple[str, ...]:
    """--model's names: base, then every causal model of the registry and its short aliases."""
    names = [BASE]
    for e in causal_models():
        names += [e.name, *e.aliases]
    return tuple(names)


def _model_help() -> str:
    lines = [f"{BASE}: the two v1 experts, flow-UniPC with CFG (default)"]
    for e in causal_models():
        alias = f" (or {', '.join(e.aliases)})" if e.aliases else ""
        lines.append(f"{e.name}{alias}: {e.title}, {e.recipe.describe()}, no CFG; {e.licence.line()}")
    return ". ".join(lines)


def add_arguments(p) -> None:
    """The Fast model's flags (generate.py's parser); the inputs, size, frames, seed, noise, device, weights, T5,
    VAE and output flags are shared with the base model."""
    p.add_argument("--model", choices=model_choices(), default=BASE, help=_model_help())
    g = p.add_argument_group(
        "causal models (--model fast, v2-14b, v2-1.3b)",
        "--steps, --guide-scale, --boundary, --solver, --cfg-mode, --memory-mode, --camera-cache and --negative-prompt "
        "do not apply: "
        "a causal model always runs its distilled steps per chunk without guidance.")
    g.add_argument("--fast-model", type=Path, default=None,
                   help="override: the causal model's DiT folder/file (default: its NF4 copy or its release folder in "
                        "--ckpt-dir, e.g. lingbot_world_fast_bnb_nf4/ or transformers/)")
    g.add_argument("--assets-dir", type=Path, default=None, metavar="DIR",
                   help="a LingBot-World download holding the umT5 encoder, tokenizer and VAE, when --ckpt-dir lacks "
                        "them (the v2 1.3B ships its DiT only; default: --ckpt-dir, then the folders beside it)")
    g.add_argument("--kv-cache", choices=("auto", "gpu", "host"), default="auto",
                   help="where the K/V cache lives: gpu (the reference's layout; 26.8 GB at 480x832x81), host "
                        "(pinned RAM, each layer streamed to the GPU one layer ahead), auto (GPU when it fits)")
    g.add_argument("--kv-layers-on-gpu", type=int, default=None,
                   help="host cache: layers whose K/V stay on the GPU (default: as many as fit)")
    g.add_argument("--max-attention", type=int, default=None, metavar="TOKENS",
                   help="each chunk attends to the latest TOKENS cached tokens only (the reference's "
                        "--max_attention_size; same output as the reference with that flag, in bounded memory). "
                        "1560 tokens = one latent frame at 480x832")
    g.add_argument("--window", type=int, default=None, metavar="LATENT_FRAMES",
                   help="keep only the latest LATENT_FRAMES latent frames (4 video frames each) in the cache, for long "
                        "videos in bounded memory; 0: the whole video. Default: the model's release (v1 Fast caches "
                        "the whole video; v2 keeps 18 with a sink of 6)")
    g.add_argument("--sink", type=int, default=None, metavar="LATENT_FRAMES",
                   help="with a window: the first LATENT_FRAMES latent frames are never evicted (default: the "
                        "model's, v1 Fast 0, v2 6)")
    _add_continuation_arguments(g)
    g.add_argument("--stream-decode", choices=STREAM_DECODE, default="auto",
                   help="decode each chunk as soon as it is done and append it to the output (partial output when "
                        "interrupted): on, off (decode at the end), auto (on when the VAE fits beside the model)")
    g.add_argument("--tiny-vae", type=Path, default=None, metavar="PATH",
                   help="decode with a tiny decoder instead of the VAE: TAEHV's taew2_1.safetensors or lightx2v's "
                        "lighttaew2_1.safetensors (ComfyUI's models/vae_approx). Preview quality, a fraction of the "
                        "VAE's decode time and about 1 GB instead of 6-7 GB of VRAM (more of the K/V cache stays on "
                        "the card); always decodes chunk by chunk")


def _add_continuation_arguments(g) -> None:
    g.add_argument("--rule", choices=FAST_MODES, default="reference", action=Given,
                   help="reference (default): the first part is the released pipeline's run (noise for the whole "
                        "part up front, camera normalised over the whole part); continuations follow the "
                        "continuable rule. continuable: every part, the first too, follows rules that never look "
                        "ahead, so a chain of continuations equals one run of the concatenated keys (README 'Continue "
                        "a Fast run')")
    g.add_argument("--save-state", type=Path, default=None, metavar="PATH",
                   help="after the run, save the video's state (K/V cache, generator, camera, ...) to PATH (a "
                        "safetensors file; 26.8 GB for 81 frames at 480x832 without --max-attention: the size is "
                        "printed before the run) to continue it later with --continue-from")
    g.add_argument("--continue-from", type=Path, default=None, metavar="PATH",
                   help="continue the video saved in PATH with new keys (--actions), a new camera (--camera) or "
                        "neither (the camera stands still); --frames counts the new frames (12 per chunk; default "
                        "as long as the keys, one chunk without keys). --out gets the new part's video")
    g.add_argument("--whole-video", type=Path, default=None, metavar="PATH",
                   help="with --continue-from: also write the whole video so far to PATH")

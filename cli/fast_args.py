"""The Fast model's flags of `lingbot-world generate` (its parser only: nothing here runs a model)."""
from __future__ import annotations

from pathlib import Path

from ..wan.sampling.fast_state import FAST_MODES

MODELS = ("base", "fast")
STREAM_DECODE = ("auto", "on", "off")


def add_arguments(p) -> None:
    """The Fast model's flags (generate.py's parser); the inputs, size, frames, seed, noise, device, weights, T5,
    VAE and output flags are shared with the base model."""
    p.add_argument("--model", choices=MODELS, default="base",
                   help="base: the two experts, 70 steps with CFG (default). fast: LingBot-World-Fast, causal, "
                        "4 steps per chunk of 3 latent frames, no CFG (needs lingbot_world_fast/ in --ckpt-dir)")
    g = p.add_argument_group(
        "fast model (--model fast)",
        "--steps, --guide-scale, --boundary, --solver, --cfg-mode, --memory-mode, --camera-cache and --negative-prompt "
        "do not apply: "
        "the Fast model always runs its 4 distilled steps per chunk without guidance.")
    g.add_argument("--fast-model", type=Path, default=None,
                   help="override: the Fast model folder/file (default: lingbot_world_fast_bnb_nf4/ or "
                        "lingbot_world_fast/ in --ckpt-dir)")
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
                   help="NON-REFERENCE: keep only the latest LATENT_FRAMES latent frames (4 video frames each) in the "
                        "cache, for long videos in bounded memory (the released pipeline caches the whole video)")
    g.add_argument("--sink", type=int, default=0, metavar="LATENT_FRAMES",
                   help="NON-REFERENCE, with --window: the first LATENT_FRAMES latent frames are never evicted")
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
    g.add_argument("--rule", choices=FAST_MODES, default="reference",
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

"""`lingbot-world generate`: one image-to-video run without ComfyUI, by the base models (the two v1 experts,
cli/generate_base.py) or a causal model of the registry (`--model fast|v2-14b|v2-1.3b`, and `--continue-from`:
cli/generate_causal.py).

Here: the command's flags and the dispatch. Same library calls the ComfyUI nodes make: T5 in a child process
(cached), camera -> Plücker, VAE encode of the first frame, sampling with a memory policy, VAE decode, mp4 (or PNG
frames).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from ..world.settings import CAMERA_CACHE_CHOICES, CFG_MODES, DEFAULT_POSE_PRECISION, FAST_MODES, POSE_PRECISIONS
from . import parallel_flags
from .outputs import PICTURE_NEXT_TO_VIDEO
from .progress import cli_logging
from .requests import BASE, Given, GenerateRequest, add_speed_args, model_choices

log = logging.getLogger("lingbot_world.generate")

MEMORY_MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")
STREAM_DECODE = ("auto", "on", "off")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="image + camera + prompt -> video",
        description="Generate a LingBot-World video. `--demo` runs the whole pipeline on a tiny random-weight "
        "checkpoint on the CPU (the output is noise) to check an installation. Flags, the image, the output path "
        "and every checkpoint file are checked before any model is loaded.",
    )
    src = p.add_argument_group("inputs")
    src.add_argument("--ckpt-dir", type=Path, help="checkpoint folder (official release or community NF4 package)")
    src.add_argument("--demo", nargs="?", const="camera", default=None, choices=("camera", "act"),
                     help="build/use the tiny random-weight demo checkpoint; with it every other input defaults to "
                          "the demo's (image, prompt, camera, 64*112, 17 frames (three chunks with a causal model), CPU, "
                          "lingbot_demo.mp4, or lingbot_demo_<model>.mp4 for a causal model); "
                          "'--demo act' uses tiny Act experts and the release's Act example (examples/05)")
    src.add_argument("--demo-dir", type=Path, default=None,
                     help="where the demo checkpoint is built and cached (default: ~/.cache/lingbot-world/demo-v1, "
                          "or $LINGBOT_WORLD_CACHE/demo-v1)")
    src.add_argument("--image", type=Path, action=Given,
                     help="first frame: PNG (8/16-bit), JPEG, WebP...; EXIF rotation is applied and alpha ignored, "
                          "like ComfyUI's LoadImage (required unless --demo)")
    src.add_argument("--camera", default=None,
                     help="trajectory folder with poses.npy + intrinsics.npy, or a preset such as "
                          "'dolly_in' or 'dolly_in+pan_right' (default: no camera)")
    src.add_argument("--camera-speed", type=float, default=1.0, help="speed multiplier for presets")
    src.add_argument("--per-frame-intrinsics", action="store_true",
                     help="use every latent frame's intrinsics (zoom); the reference uses the first frame's only")
    src.add_argument("--prompt", default=None, help="text prompt (required unless --demo)")
    src.add_argument("--negative-prompt", default=None, help="negative prompt (default: the model's own)")
    src.add_argument("--high", type=Path, help="override: high-noise expert folder/file")
    src.add_argument("--low", type=Path, help="override: low-noise expert folder/file")
    src.add_argument("--t5", type=Path, help="override: umT5 encoder file")
    src.add_argument("--tokenizer", type=Path,
                     help="override: tokenizer folder/file (default: found beside the encoder or inside it)")
    src.add_argument("--vae", type=Path, help="override: VAE file")

    gen = p.add_argument_group("generation")
    gen.add_argument("--size", default="480*832", action=Given,
                     help="max area as H*W, e.g. 480*832 or 720*1280 (aspect follows the image)")
    gen.add_argument("--frames", type=int, default=None,
                     help="frame count, 4n+1 (16 fps; default 81, or as long as --actions)")
    gen.add_argument("--steps", type=int, default=None, help="sampling steps (default 70; 20 for the Act model)")
    gen.add_argument("--shift", type=float, default=10.0, help="flow-matching timestep shift")
    gen.add_argument("--boundary", type=float, default=0.947, help="high-noise expert while t >= boundary*1000")
    gen.add_argument("--guide-scale", type=float, nargs="+", default=[5.0],
                     help="one value for both experts, or two: LOW HIGH (the reference's order)")
    gen.add_argument("--seed", type=int, default=42, action=Given, help="0 .. 2**64-1; negative = random")
    gen.add_argument("--noise", choices=("auto", "cuda", "cpu"), default="auto", action=Given,
                     help="noise generator: cuda = reference-exact on a GPU, cpu = same on every machine, "
                          "auto = cuda when computing on a GPU")
    gen.add_argument("--solver", choices=("unipc", "dpm++"), default="unipc",
                     help="sampler: flow UniPC (the reference's) or flow DPM++")
    gen.add_argument("--cfg-mode", choices=CFG_MODES, default="auto",
                     help="classifier-free guidance: batch = both passes in one batch (fastest, most memory); "
                          "layered = one after the other inside each block, sharing the camera layers and each "
                          "layer's weight preparation (one more fp32 residual stream than sequential, same result "
                          "as sequential); sequential = two forwards (least memory); auto picks from free memory")

    dev = p.add_argument_group("device and memory")
    dev.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto: cuda when available)")
    dev.add_argument("--weights", choices=("nf4", "bf16", "fp8", "int8"), default="nf4",
                     help="keep the experts in NF4, or dequantize them to bf16 (more memory); fp8 / int8 (--model "
                          "fast only): the Fast model's stored e4m3 / int8 weights (made once by `lingbot-world "
                          "convert-fp8` / `convert-int8`), its GEMMs in FP8 on Ada/Hopper GPUs (sm89+) / in INT8 "
                          "on Ampere and newer (sm80+); on the CPU FP8 is emulated, INT8 runs torch's int8 matmul")
    dev.add_argument("--memory-mode", choices=MEMORY_MODES, default="auto",
                     help="where the experts live (README 'Memory modes'); auto picks from free VRAM/RAM")
    dev.add_argument("--blocks-on-gpu", type=int, default=None,
                     help="block_swap: blocks kept on the GPU (default: as many as fit)")
    dev.add_argument("--t5-device", choices=("auto", "cuda", "cpu"), default="auto",
                     help="where the text encoder child runs; auto = cuda when it fits in free VRAM")
    dev.add_argument("--t5-timeout", type=float, default=None,
                     help="seconds before the text encoder child is stopped (default: no limit)")
    dev.add_argument("--no-text-cache", action="store_true", help="always run the text encoder (no cache)")
    dev.add_argument("--cache-dir", type=Path, default=None,
                     help="prompt-embedding cache folder (default: ~/.cache/lingbot-world/text)")
    dev.add_argument("--vae-tiled", action="store_true", help="tile VAE encode/decode (bounded VRAM)")
    dev.add_argument("--camera-cache", choices=CAMERA_CACHE_CHOICES, default="auto",
                     help="the camera layers' output is the same at every step: host = keep every block's in pinned "
                          "RAM (26 GB at 480p 81 frames), streamed one block ahead (one block on the GPU); device = "
                          "keep it on the GPU; auto = host for as many blocks as free RAM allows; off = compute it at "
                          "every forward (the same video either way)")
    dev.add_argument("--overlap", choices=("auto", "off"), default="auto",
                     help="auto: the start-up runs side by side where memory allows (the heavy imports, the text "
                          "encoder, the image's VAE encode, the Fast model's load, the K/V cache's host memory); "
                          "off: one step after the other (the same video)")
    add_speed_args(p)
    parallel_flags.add_arguments(p)

    _add_lora_arguments(p)

    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None,
                     help="output .mp4, .webm or .gif, or a folder name without extension for PNG frames "
                          "(default: lingbot_<prompt>_<time>.mp4); written atomically, checked before the run")
    out.add_argument("--fps", type=int, default=16, help="frames per second of the output video")
    out.add_argument("--quiet", action="store_true", help="only warnings and the final summary")
    _add_key_arguments(p)
    _add_causal_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """The one reader of `generate`'s namespace: everything below takes the typed request."""
    request = GenerateRequest.from_args(args)
    with cli_logging(request.quiet):
        fast = request.model != BASE  # a causal model of the registry
        guidance = not fast and not (request.guide_scale[0] == 1.0 and request.guide_scale[-1] == 1.0)
        parallel_flags.refuse_layout_alone(request.parallel, lambda: _heads_without_building(request),
                                           "fast" if fast else "base", guidance)
        if fast:
            from .generate_causal import run as run_causal

            return run_causal(request)
        from .generate_base import run as run_base

        return run_base(request)


def _heads_without_building(request: GenerateRequest) -> Optional[int]:
    """The attention heads of the model this run would load, where they are known without building or loading
    anything (the demo's configuration, a checkpoint's config.json); None otherwise."""
    from ..world.files import heads_without_building
    from ..world.settings import ModelSource

    causal = request.model != BASE
    source = ModelSource(model=request.model if causal else ("v1-base-act" if request.demo == "act" else None),
                         ckpt_dir=request.ckpt_dir, demo=bool(request.demo), high=request.high)
    return heads_without_building(source, request.weights)


def _add_lora_arguments(p) -> None:
    g = p.add_argument_group("LoRA (Wan 2.1/2.2 14B LoRAs, .safetensors)")
    g.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on both experts (repeat to stack; strength default 1)")
    g.add_argument("--lora-high", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on the high-noise expert only")
    g.add_argument("--lora-low", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="a LoRA on the low-noise expert only")


def _add_key_arguments(p) -> None:
    g = p.add_argument_group(
        "keys and actions", "steer with keys: every model takes --actions (the Act model needs it for its control)")
    g.add_argument("--actions", default=None, metavar="KEYS_OR_PATH",
                   help="an action string, e.g. 'w-10,a-10,d-10,iw-15,none-10' (KEYS-FRAMES segments; keys w a s d move, "
                        "i k look up/down, j l turn; 'none' = no key; padded to 4n+1 frames), or key files: a folder "
                        "with wasd_action.npy / ijkl_action.npy (Cam, Fast) or action.npy + poses.npy (Act), or one "
                        "[N, 4] .npy key file. Without --frames the video is as long as the keys.")
    g.add_argument("--trajectory-picture", nargs="?", const=PICTURE_NEXT_TO_VIDEO, default=None, type=str,
                   metavar="PNG", help="write a picture of the camera path (with the key timeline for --actions); "
                   "without a file name it goes next to the video")
    g.add_argument("--camera-precision", choices=POSE_PRECISIONS, default=DEFAULT_POSE_PRECISION,
                   help="arithmetic of the relative camera poses: float32 reproduces the reference (default), "
                        "float64 is exact (differs from the reference's float32 noise far from the world origin)")


def _model_help() -> str:
    from ..world.models import causal_models

    lines = [f"{BASE}: the two v1 experts, flow-UniPC with CFG (default)"]
    for e in causal_models():
        alias = f" (or {', '.join(e.aliases)})" if e.aliases else ""
        lines.append(f"{e.name}{alias}: {e.title}, {e.recipe.describe()}, no CFG; {e.licence.line()}")
    return ". ".join(lines)


def _add_causal_arguments(p) -> None:
    """The causal models' flags; the inputs, size, frames, seed, noise, device, weights, T5, VAE and output flags are
    shared with the base model."""
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

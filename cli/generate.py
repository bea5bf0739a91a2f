"""`lingbot-world generate`: one camera-controlled image-to-video run, without ComfyUI.

Same library calls the ComfyUI nodes make: T5 in a child process (cached), camera -> Plücker, VAE encode
of the first frame, dual-expert sampling with a memory policy, VAE decode, mp4 (or PNG frames).
"""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Optional

import torch

from ..memory.placement import read_expert_config
from .lora_run import add_lora_arguments, lora_loader, read_cli_loras
from .progress import ProgressLine, RunStats
from .video_out import write_video

log = logging.getLogger("lingbot_world.generate")

MEMORY_MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="image + camera + prompt -> video",
        description="Generate a LingBot-World video. `--demo` runs the whole pipeline on a tiny random-weight "
        "checkpoint on the CPU (the output is noise) to check an installation.",
    )
    src = p.add_argument_group("inputs")
    src.add_argument("--ckpt-dir", type=Path, help="checkpoint folder (official release or community NF4 package)")
    src.add_argument("--demo", action="store_true", help="build/use the tiny random-weight demo checkpoint (CPU)")
    src.add_argument("--demo-dir", type=Path, default=None, help="where the demo checkpoint is cached")
    src.add_argument("--image", type=Path, help="first frame (default: the bundled demo image with --demo)")
    src.add_argument("--camera", default=None,
                     help="trajectory folder with poses.npy + intrinsics.npy, or a preset such as "
                          "'dolly_in' or 'dolly_in+pan_right' (default: no camera)")
    src.add_argument("--camera-speed", type=float, default=1.0, help="speed multiplier for presets")
    src.add_argument("--per-frame-intrinsics", action="store_true",
                     help="use every latent frame's intrinsics (zoom); the reference uses the first frame's only")
    src.add_argument("--prompt", default=None, help="text prompt")
    src.add_argument("--negative-prompt", default=None, help="negative prompt (default: the model's)")
    src.add_argument("--high", type=Path, help="override: high-noise expert folder/file")
    src.add_argument("--low", type=Path, help="override: low-noise expert folder/file")
    src.add_argument("--t5", type=Path, help="override: umT5 encoder file")
    src.add_argument("--tokenizer", type=Path, help="override: tokenizer folder/file")
    src.add_argument("--vae", type=Path, help="override: VAE file")

    gen = p.add_argument_group("generation")
    gen.add_argument("--size", default="480*832", help="max area as H*W: 480*832 or 720*1280 (aspect follows the image)")
    gen.add_argument("--frames", type=int, default=81, help="frame count, 4n+1 (16 fps)")
    gen.add_argument("--steps", type=int, default=70)
    gen.add_argument("--shift", type=float, default=10.0)
    gen.add_argument("--boundary", type=float, default=0.947, help="high-noise expert while t >= boundary*1000")
    gen.add_argument("--guide-scale", type=float, nargs="+", default=[5.0],
                     help="one value for both experts, or two: LOW HIGH (the reference's order)")
    gen.add_argument("--seed", type=int, default=42, help="negative = random")
    gen.add_argument("--noise", choices=("auto", "cuda", "cpu"), default="auto",
                     help="noise generator: cuda = reference-exact on a GPU, cpu = same on every machine")
    gen.add_argument("--solver", choices=("unipc", "dpm++"), default="unipc")
    gen.add_argument("--cfg-mode", choices=("auto", "batch", "sequential"), default="auto")

    dev = p.add_argument_group("device and memory")
    dev.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda if available)")
    dev.add_argument("--weights", choices=("nf4", "bf16"), default="nf4")
    dev.add_argument("--memory-mode", choices=MEMORY_MODES, default="auto")
    dev.add_argument("--blocks-on-gpu", type=int, default=None, help="block_swap: blocks kept on the GPU")
    dev.add_argument("--t5-device", choices=("auto", "cuda", "cpu"), default="auto")
    dev.add_argument("--t5-timeout", type=float, default=None, help="seconds before the T5 child is stopped")
    dev.add_argument("--no-text-cache", action="store_true", help="always run the text encoder")
    dev.add_argument("--cache-dir", type=Path, default=None, help="prompt-embedding cache folder")
    dev.add_argument("--vae-tiled", action="store_true", help="tile VAE encode/decode (bounded VRAM)")
    dev.add_argument("--attention", choices=("sdpa", "sage", "flash"), default="sdpa")

    add_lora_arguments(p)

    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None, help="output .mp4 (or a folder for PNG frames)")
    out.add_argument("--fps", type=int, default=16)
    out.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return dev


def _demo_defaults(args) -> None:
    from ..loaders.demo_checkpoint import DEMO_IMAGE, DEMO_PROMPT

    args.image = args.image or DEMO_IMAGE
    args.prompt = args.prompt or DEMO_PROMPT
    args.camera = args.camera or "dolly_in+pan_right"
    if args.size == "480*832":
        args.size = "64*112"
    if args.frames == 81:
        args.frames = 17
    if args.device == "auto":
        args.device = "cpu"
    if args.out is None:
        args.out = Path("lingbot_demo.mp4")


def _files(args):
    from ..loaders.checkpoint_dir import CheckpointFiles, find_checkpoint_files
    from ..loaders.demo_checkpoint import build_demo_checkpoint

    if args.demo:
        files = build_demo_checkpoint(args.demo_dir)
    elif args.ckpt_dir is not None:
        files = find_checkpoint_files(args.ckpt_dir)
    else:
        missing = [n for n in ("high", "low", "t5", "vae") if getattr(args, n) is None]
        if missing:
            raise SystemExit("give --ckpt-dir (or --demo), or all of --high --low --t5 --vae")
        return CheckpointFiles(Path("."), args.high, args.low, args.t5, args.vae, args.tokenizer)
    for n in ("high", "low", "t5", "vae", "tokenizer"):
        if getattr(args, n) is not None:
            setattr(files, n, getattr(args, n))
    return files


def load_image(path: Path) -> torch.Tensor:
    """RGB image -> [3, H, W] float32 in [-1, 1] (the reference's to_tensor, *2-1)."""
    import numpy as np
    from PIL import Image

    if not Path(path).is_file():
        raise SystemExit(f"image {path} does not exist")
    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous() * 2 - 1


def _camera(spec: Optional[str], speed: float, frames: int):
    """(CameraPath, is_zoom_preset) from a folder / poses.npy, or a preset name ('+'-combinations allowed)."""
    from ..loaders.camera_files import load_camera
    from ..wan.control.camera_presets import PRESETS, parse_preset, preset_camera

    if not spec:
        return None, False
    if Path(spec).expanduser().exists():
        return load_camera(Path(spec).expanduser()), False
    # zoom lives in the intrinsics, so zoom presets follow them per frame (as the camera preset node does)
    return preset_camera(spec, frames=frames, speed=speed), any(PRESETS[n].zoom for n in parse_preset(spec))


def run(args) -> int:
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    from ..text_encoder.encode import encode_prompts
    from ..loaders.vae_files import load_vae
    from ..wan.dit.attention import set_backend
    from ..wan.control.camera import camera_condition
    from ..wan.dit.model import pad_context
    from ..wan.i2v import build_i2v_condition
    from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
    from ..wan.sampling.sampler import SamplingSettings, make_noise, sample
    from ..wan.sizes import check_frames, latent_size, max_area_for, target_size

    if args.demo:
        _demo_defaults(args)
    if args.image is None or args.prompt is None:
        raise SystemExit("--image and --prompt are required (or use --demo)")
    stats = RunStats()
    device = _resolve_device(args.device)
    set_backend(args.attention)
    files = _files(args)
    loras = read_cli_loras(args, read_expert_config(files.high))  # a bad LoRA stops here, before any work
    stats.mark("setup")

    # Sizes: max area from --size, aspect ratio from the image (spec §5.2).
    image = load_image(args.image)
    height, width = target_size(image.shape[1], image.shape[2], max_area_for(args.size))
    frames = check_frames(args.frames)
    cam_path, zoom_preset = _camera(args.camera, args.camera_speed, frames)
    camera = None
    if cam_path is not None:
        cond = camera_condition(cam_path.poses, cam_path.intrinsics, height, width, frames,
                                per_frame_intrinsics=args.per_frame_intrinsics or zoom_preset)
        if cond.message:
            log.warning("camera: %s", cond.message)
        frames, camera = cond.frames, cond.plucker
    lat_h, lat_w = latent_size(height, width)
    log.info("size %dx%d, %d frames (latent %dx%d x %d), camera: %s", height, width, frames, lat_h, lat_w,
             (frames - 1) // 4 + 1, args.camera or "none")
    stats.mark("camera")

    # Text: child process (or the cache); nothing of T5 stays in this process.
    negative = args.negative_prompt if args.negative_prompt else DEFAULT_NEGATIVE_PROMPT
    pos, neg = encode_prompts(
        files.t5, files.tokenizer, [args.prompt, negative], device=args.t5_device,
        cache_dir=args.cache_dir, use_cache=not args.no_text_cache, timeout=args.t5_timeout,
    )
    stats.mark("text")

    # I2V conditioning on the compute device; the VAE leaves the GPU while the experts run.
    from ..loaders.demo_checkpoint import demo_vae_config

    vae = load_vae(files.vae, device, config=demo_vae_config(files.root))
    with torch.inference_mode():
        y = build_i2v_condition(vae, image, height, width, frames, tiled=args.vae_tiled)
    vae.to("cpu")
    _empty_cache(device)
    stats.mark("vae_encode")

    settings = SamplingSettings(
        steps=args.steps, shift=args.shift, boundary=args.boundary, solver=args.solver, cfg_mode=args.cfg_mode,
        guide_low=args.guide_scale[0], guide_high=args.guide_scale[-1],
    )
    if len(args.guide_scale) > 2:
        raise SystemExit("--guide-scale takes one value or two (LOW HIGH)")
    seed = args.seed if args.seed >= 0 else random.randrange(2**31)
    noise_source = args.noise if args.noise != "auto" else ("cuda" if device.type == "cuda" else "cpu")
    noise = make_noise((1, 16, y.shape[2], lat_h, lat_w), seed, noise_source, device=device)
    provider = _provider(args, files, device, frames, height, width, camera is not None,
                         loader=lora_loader(loras, {"high": files.high, "low": files.low}))
    if settings.cfg_mode == "auto":
        settings.cfg_mode = provider.plan.cfg_mode
    bar = ProgressLine(settings.steps, enabled=not args.quiet)
    try:
        with torch.inference_mode():
            latent = sample(
                provider, noise, pad_context([pos], 512).to(device), pad_context([neg], 512).to(device), y,
                camera, settings, device=device, callback=bar.update,
            )
    finally:
        bar.close()
        close = getattr(provider, "close", None)
        if close is not None:
            close()
        del provider
        _empty_cache(device)
    stats.mark("sampling")

    vae.to(device)
    with torch.inference_mode():
        video = vae.decode(latent, tiled=args.vae_tiled)[0]  # [3, F, H, W] in [-1, 1]
    del vae
    stats.mark("vae_decode")
    out = write_video(video, args.out or _default_name(args.prompt), args.fps)
    stats.mark("write")
    print(stats.summary(out, seed=seed, device=device))
    return 0


def _provider(args, files, device, frames, height, width, with_camera: bool, loader=None):
    from ..memory.placement import make_provider

    return make_provider(
        args.memory_mode, files.high, files.low, device, weights=args.weights, blocks_on_gpu=args.blocks_on_gpu,
        video=(frames, height, width), cfg_mode=args.cfg_mode, camera=with_camera, log=log, loader=loader,
    )


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _default_name(prompt: str) -> Path:
    stem = "".join(c if c.isalnum() else "_" for c in prompt[:50]).strip("_") or "video"
    return Path(f"lingbot_{stem}_{time.strftime('%Y%m%d_%H%M%S')}.mp4")

"""`lingbot-world generate`: one camera-controlled image-to-video run, without ComfyUI.

Same library calls the ComfyUI nodes make: T5 in a child process (cached), camera -> Plücker, VAE encode
of the first frame, dual-expert sampling with a memory policy, VAE decode, mp4 (or PNG frames).
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Optional

import torch

from . import actions_arg
from . import fast_args, fast_run
from . import parallel_flags
from .generate_request import GenerateRequest
from .lora_run import add_lora_arguments, lora_loader
from .preflight import prepare
from .progress import ProgressLine, RunStats, cli_logging
from .request_base import Given
from .speed_flags import add_speed_args, report_compile
from .video_out import write_video
from ..memory.camera_cache import CAMERA_CACHE_CHOICES
from ..wan.sampling.sampler import CFG_MODES

log = logging.getLogger("lingbot_world.generate")

MEMORY_MODES = ("auto", "resident", "swap", "swap_pinned", "block_swap")


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

    add_lora_arguments(p)

    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None,
                     help="output .mp4, .webm or .gif, or a folder name without extension for PNG frames "
                          "(default: lingbot_<prompt>_<time>.mp4); written atomically, checked before the run")
    out.add_argument("--fps", type=int, default=16, help="frames per second of the output video")
    out.add_argument("--quiet", action="store_true", help="only warnings and the final summary")
    actions_arg.add_arguments(p)
    fast_args.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """The one reader of `generate`'s namespace: everything below takes the typed request."""
    request = GenerateRequest.from_args(args)
    with cli_logging(request.quiet):
        fast = request.model != "base"  # a causal model of the registry
        guidance = not fast and not (request.guide_scale[0] == 1.0 and request.guide_scale[-1] == 1.0)
        parallel_flags.refuse_layout_alone(request.parallel, lambda: _heads_without_building(request),
                                           "fast" if fast else "base", guidance)
        if fast:
            return fast_run.run(request)
        return _run(request)


def _heads_without_building(request: GenerateRequest) -> Optional[int]:
    """The attention heads of the model this run would load, where they are known without building or loading
    anything (the demo's configuration, a checkpoint's config.json); None otherwise."""
    try:
        causal = request.model != "base"
        if request.demo and causal:
            from ..world.demos import demo_config
            from ..world.models import model

            return demo_config(model(request.model)).num_heads
        if request.demo:
            from ..loaders.demo_checkpoint import demo_configs

            return demo_configs(request.demo)[0].num_heads
        if request.ckpt_dir is None and request.high is None:
            return None
        from ..memory.placement import read_expert_config

        if causal:
            from ..world.files import find_in_folder

            return read_expert_config(find_in_folder(Path(request.ckpt_dir), request.model, request.weights).dit
                                      ).num_heads
        if request.high is not None:
            return read_expert_config(request.high).num_heads
        from ..loaders.checkpoint_dir import find_checkpoint_files

        return read_expert_config(find_checkpoint_files(request.ckpt_dir).high).num_heads
    except Exception:  # noqa: BLE001 - a missing or damaged file is the pre-flight's to report, in its words
        return None


def _run(request: GenerateRequest) -> int:
    if request.demo:
        request = request.with_demo_defaults()
    stats = RunStats()
    # one process, or one rank of a torchrun launch (the request takes its device)
    session = parallel_flags.start(request.parallel_flags, request.device, log)
    request = request.on_rank(session)
    failed = True
    try:
        code = _generate(request, session, stats)
        failed = False
        return code
    finally:
        session.close(failed)


def _generate(request: GenerateRequest, session, stats: RunStats) -> int:
    from ..loaders.vae_files import load_vae
    from ..wan.dit.model import pad_context
    from ..wan.i2v import build_i2v_condition
    from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
    from ..wan.sampling.sampler import SamplingSettings, make_noise, sample
    from ..wan.sizes import latent_size

    # Everything that can be checked in seconds is checked before anything that takes minutes (on every rank;
    # rank 0 first, as it may build the demo checkpoint the others read).
    with session.main_first("the pre-flight"):
        pre = prepare(request, log)
    device, files, frames, height, width, camera = pre.device, pre.files, pre.frames, pre.height, pre.width, pre.camera
    speed = pre.speed
    guidance = not (request.guide_scale[0] == 1.0 and request.guide_scale[-1] == 1.0)
    parallel_flags.set_layout(session, request.parallel, pre.num_heads, "base", guidance, log)
    parallel_flags.check_same_models(session, {"high-noise expert": files.high, "low-noise expert": files.low}, log,
                                     request.loras)
    if pre.camera_note:
        log.warning("camera: %s", pre.camera_note)
    lat_h, lat_w = latent_size(height, width)
    log.info("size %dx%d, %d frames (latent %dx%d x %d), camera: %s", height, width, frames, lat_h, lat_w,
             (frames - 1) // 4 + 1, request.camera or "none")
    stats.mark("checks")

    # Text: child process (or the cache); nothing of T5 stays in this process. Several ranks: rank 0 encodes.
    # The image's VAE encode runs beside the encoder when both fit in VRAM; the experts load after it.
    from ..wan.vae.model import VAEConfig
    from ..world import text_stage

    negative = request.negative_prompt if request.negative_prompt else DEFAULT_NEGATIVE_PROMPT
    vae_step = text_stage.vae_encode_step(pre.vae_config or VAEConfig(), height, width, frames, request.vae_tiled,
                                          keeps_vae=False)
    text = text_stage.start(request.text, files, [request.prompt, negative], device, [vae_step], session, log)
    if not text.background:
        stats.mark("text")

    # I2V conditioning on the compute device; the VAE leaves the GPU while the experts run (rank 0 only).
    vae = None

    def encode_image():
        nonlocal vae
        vae = load_vae(files.vae, device, config=pre.vae_config)
        with torch.inference_mode():
            cond = build_i2v_condition(vae, pre.image, height, width, frames, tiled=request.vae_tiled)
        vae.to("cpu")
        _empty_cache(device)
        return [cond]

    try:
        text.before(text_stage.ENCODE_STEP)
        (y,) = session.from_main(encode_image, "the first frame's encoding")
        stats.mark("vae_encode")
        pos, neg = text.embeddings()
        if text.background:
            stats.mark("waiting for the text encoder")
    finally:
        text.stop()

    settings = SamplingSettings(
        steps=pre.steps, shift=request.shift, boundary=request.boundary, solver=request.solver,
        cfg_mode=request.cfg_mode, guide_low=request.guide_scale[0], guide_high=request.guide_scale[-1],
    )
    seed = session.same_value(request.seed if request.seed >= 0 else random.randrange(2**31), "the seed")
    noise = make_noise((1, 16, y.shape[2], lat_h, lat_w), seed, pre.noise, device=device)
    velocity = parallel_flags.velocity(session)
    cfg_mode = parallel_flags.planned_cfg_mode(request.cfg_mode, session.parallel, velocity is not None, log)
    parallel_flags.check_same_inputs(session, {"noise": noise, "conditioning": y, "text": pos, "negative text": neg,
                                               "camera": camera})
    provider = _provider(request, files, device, frames, height, width, camera is not None, speed, session, cfg_mode,
                         loader=lora_loader(pre.loras, {"high": files.high, "low": files.low}))
    batch = parallel_flags.agree_on_plans(session, provider.plan.reason, provider.plan.cfg_batch, log)
    settings.cfg_mode = parallel_flags.sampling_cfg_mode(cfg_mode, session.parallel, velocity is not None,
                                                         provider.plan.cfg_mode, batch)
    camera_cache = _camera_cache(request, files, device, (frames, height, width), camera is not None and velocity is None,
                                 settings, provider.plan, session)
    bar = ProgressLine(settings.steps, enabled=not request.quiet)
    try:
        with torch.inference_mode():
            latent = sample(
                provider, noise, pad_context([pos], 512).to(device), pad_context([neg], 512).to(device), y,
                camera, settings, device=device, callback=bar.update, velocity=velocity, camera_cache=camera_cache,
            )
    finally:
        if camera_cache is not None:
            camera_cache.close()
        bar.close()
        close = getattr(provider, "close", None)
        if close is not None:
            close()
        del provider
        _empty_cache(device)
    stats.mark("sampling")
    report_compile(speed, log)
    if not session.is_main:
        return 0  # rank 0 decodes and writes the video

    from ..speed.vae_norm import decoder_norm_silu

    vae.to(device)
    with torch.inference_mode():  # [3, F, H, W] in [-1, 1]
        video = vae.decode(latent, tiled=request.vae_tiled, norm_silu=decoder_norm_silu(device))[0]
    del vae
    stats.mark("vae_decode")
    out = write_video(video, pre.output, request.fps)
    stats.mark("write")
    print(stats.summary(out, seed=seed, device=device))
    return 0


def _provider(request: GenerateRequest, files, device, frames, height, width, with_camera: bool, speed=None, session=None,
              cfg_mode=None, loader=None):
    from ..memory.placement import make_provider
    from ..speed.options import apply_speed

    def prepare_model(model):
        if speed is not None:
            apply_speed(model, speed)
        if session is not None:
            parallel_flags.attach(session, model)  # this rank's share of the tokens (Ulysses)

    return make_provider(
        request.memory_mode, files.high, files.low, device, weights=request.weights,
        blocks_on_gpu=request.blocks_on_gpu, video=(frames, height, width), cfg_mode=cfg_mode or request.cfg_mode, camera=with_camera, log=log,
        loader=loader, prepare=prepare_model, seq_parallel=1 if session is None else session.sp_degree,
    )


def _camera_cache(request: GenerateRequest, files, device, video, with_camera: bool, settings, plan, session):
    """The camera FiLM cache the memory plan leaves room for (memory/camera_cache.py), logged in one line."""
    from ..memory.camera_cache import camera_cache_for_run
    from ..memory.placement import read_expert_config
    from ..quant.nf4_format import default_compute_dtype

    cdt = torch.bfloat16 if request.weights == "bf16" else default_compute_dtype(device)
    return camera_cache_for_run(
        request.camera_cache, video, read_expert_config(files.high), plan, camera=with_camera, steps=settings.steps,
        cfg_mode=settings.cfg_mode, device=device, compute_bytes=torch.empty(0, dtype=cdt).element_size(),
        seq_parallel=1 if session is None else session.sp_degree, log=lambda line: log.info("camera cache: %s", line))


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

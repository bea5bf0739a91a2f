"""`lingbot-world generate --model fast`: the Fast model, chunk by chunk, with its K/V cache placed for the card.

Same inputs as the base model (image, camera, prompt, size, frames, seed), the base package's T5 / VAE /
tokenizer from the same release folder, and the release's defaults (480x832, 81 frames, shift 10, 4 steps per
chunk of 3 latent frames, no CFG). Every check that can fail runs before the text encoder starts: the Fast model's
kind and tensors (headers only), the frame count, the camera, the cache plan against free VRAM and RAM. Each
finished chunk is decoded right away (streaming decode) and appended to the output, so an interrupted run still
leaves the frames made so far.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from .errors import UsageError

log = logging.getLogger("lingbot_world.generate")

MODELS = ("base", "fast")
STREAM_DECODE = ("auto", "on", "off")
DEMO_FAST_FRAMES = 33  # three chunks of the tiny demo


LOAD_STEP = "the Fast model's load"


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
    from . import fast_continue

    fast_continue.add_arguments(g)
    g.add_argument("--stream-decode", choices=STREAM_DECODE, default="auto",
                   help="decode each chunk as soon as it is done and append it to the output (partial output when "
                        "interrupted): on, off (decode at the end), auto (on when the VAE fits beside the model)")


def run(args) -> int:
    """Entry point from generate.run() for --model fast (one process, or one rank of a torchrun launch)."""
    from . import parallel_flags

    if args.demo and args.continue_from is None:  # a continuation takes its inputs from the state
        requested_frames = args.frames
        from .generate import _demo_defaults

        _demo_defaults(args)
        if requested_frames is None and not args.actions:
            args.frames = DEMO_FAST_FRAMES
    session = parallel_flags.start(args, log)
    from .heavy_imports import BackgroundImports

    # bitsandbytes (seconds) imports on a thread while this one checks, starts the text encoder and encodes the
    # image; waited for before the load (one process only: under torchrun the ranks set up collectives meanwhile).
    from .progress import RunStats

    stats = RunStats()
    imports = BackgroundImports(background=getattr(args, "overlap", "auto") != "off" and not session.parallel)
    stats.mark("imports (torch._dynamo)")  # on this thread, first (cli/heavy_imports.py says why)
    failed = True
    try:
        code = _run(args, session, imports, stats)
        failed = False
        return code
    except Exception as e:
        session.report_failure(e)  # a check that failed here is raised on every rank
        raise
    finally:
        session.close(failed)


def _run(args, session, imports, stats) -> int:
    from ..loaders.expert_format import check_model_kind, detect_format
    from ..loaders.expert_loader import check_expert_keys
    from ..wan.sampling.fast_sampler import CHUNK_FRAMES
    from ..wan.sampling.fast_state import plan_first_part
    from ..wan.sizes import latent_size, max_area_for, target_size
    from ..loaders.image_files import load_image
    from . import parallel_flags
    from .generate import _empty_cache
    from .preflight import noise_source, resolve_device
    from .speed_flags import fast_speed_plan, log_speed_plan, report_compile
    from .video_out import plan_output
    from . import fast_continue

    if args.continue_from is not None:
        if session.parallel:
            raise UsageError("--continue-from runs in one process: start it without torchrun (a saved state holds "
                             "every head of the K/V cache)")
        imports.wait()  # a continuation's checks import bitsandbytes' modules on this thread: not beside them
        return fast_continue.run(args)
    if args.save_state and session.parallel:
        raise UsageError("--save-state runs in one process: start it without torchrun (a saved state holds every "
                         "head of the K/V cache)")
    _warn_base_only_flags(args)
    if args.image is None or args.prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    if args.camera and args.actions:
        raise UsageError("give either --camera (a trajectory) or --actions (keys), not both")
    session.begin_checks()  # several ranks: rank 0 first (it may build the demo checkpoint the others read)
    device = resolve_device(args.device)
    noise = noise_source(args.noise, device)
    target = plan_output(args.out if args.out is not None else _default_name(args.prompt))
    files = _fast_files(args, imports)
    fmt = detect_format(files.fast)
    note = check_model_kind(fmt, "fast")
    if note:
        log.warning("%s", note)
    check_expert_keys(fmt, args.weights)  # missing or mis-shaped tensors are named here, before any work
    cfg = fmt.config

    decoded = load_image(args.image)
    for image_note in decoded.notes:
        log.info("image %s: %s", args.image, image_note)
    image = decoded.pixels
    height, width = target_size(image.shape[1], image.shape[2], max_area_for(args.size))
    lat_h, lat_w = latent_size(height, width)
    seed = args.seed if args.seed >= 0 else random.randrange(2**31)
    settings = fast_continue.settings_for(args, fmt, device, height, width, seed, noise)
    source = fast_continue.camera_source(args, args.frames)
    part = plan_first_part(source, args.frames, settings)
    if part.note:
        log.warning("frames: %s", part.note)
    fast_continue.write_picture(args, part, source, target)
    frames = part.frames
    layout = settings.layout(part.latent_frames)
    if layout.note:
        log.warning("K/V cache: %s", layout.note)
    control = source.label or ("none" if source.kind == "none" else source.kind)
    save = fast_continue.SaveState.plan(args, settings, cfg, part.latent_frames)
    # refuses an impossible --compile/--compute/--attention before loading; a compiler check waits for the imports
    speed = fast_speed_plan(args, device, part.chunks, before_compiler_check=imports.wait)
    log_speed_plan(speed, log)
    if session.is_main:
        print(f"Fast model: {height}x{width}, {frames} frames ({part.latent_frames} latent frames, {part.chunks} "
              f"chunks of {CHUNK_FRAMES}), camera: {control}" + (f", rule: {settings.mode}" if args.save_state else ""),
              flush=True)
    split = parallel_flags.plan(session, args, cfg.num_heads, "fast", False, log)

    plan, stream_vae = _plan(args, cfg, layout, device, height, width, part.camera is not None, files, split.ulysses)
    log.info("memory plan: %s", plan.reason)
    session.end_checks()
    parallel_flags.use(session, split, log)
    parallel_flags.agree_on_plans(session, plan.reason, False, log)
    parallel_flags.check_same_models(session, {"Fast model": files.fast}, log)
    stats.mark("setup")

    from ..loaders.demo_checkpoint import demo_vae_config
    from ..loaders.vae_files import load_vae
    from ..memory.kv_placement import FastPlacement
    from ..memory.overlap import Step
    from ..wan.i2v import ConditionTrack, build_i2v_condition
    from ..wan.vae.model import VAEConfig
    from . import text_stage

    model_bytes = int(plan.estimates.get("model_bytes", 0))
    # The load may run at the same time as the encode (a thread) when the whole model is resident: block swap
    # sets up its own streams and pinned ring, kept on the main thread.
    steps = [text_stage.vae_encode_step(demo_vae_config(files.root) or VAEConfig(), height, width, frames,
                                        args.vae_tiled, keeps_vae=stream_vae),
             Step(LOAD_STEP, model_bytes + int(plan.estimates.get("block_bytes", 0)), model_bytes,
                  with_previous=plan.blocks_on_gpu is None)]
    host_bytes = plan.streamed_layers * int(plan.estimates.get("cache_layer_bytes", 0)) if plan.cache == "host" else 0
    text_plan = text_stage.plan(args, files, [args.prompt], device, steps, session, host_bytes=host_bytes,
                                ram_free=plan.estimates.get("ram_free"))
    placement = FastPlacement(plan, device, log.info)
    load = text = None
    try:
        if text_plan.overlap.host_early:  # pinned host memory from now on, beside the text, encode and load
            placement.start_host_memory(cfg, _compute_dtype(args, device))
        text = text_plan.start(log)
        if not text.background:
            stats.mark("text")
        vae = None
        condition = None

        def encode_image():  # rank 0 only when there are several: the others receive y
            nonlocal vae, condition
            vae = load_vae(files.vae, device, config=demo_vae_config(files.root))
            with torch.inference_mode():
                if save is not None:  # the conditioning of later frames too (a continuation needs them), in one encode
                    condition = ConditionTrack.build(vae, image, height, width, tiled=args.vae_tiled)
                    cond = condition.frames(0, part.latent_frames)
                else:
                    cond = build_i2v_condition(vae, image, height, width, frames, tiled=args.vae_tiled)
            if not stream_vae:
                vae.to("cpu")
            _empty_cache(device)
            return [cond]

        load = _model_load(args, files, placement, device, speed, session, imports)
        text.before(text_stage.ENCODE_STEP)
        if text.plan.runs_with_previous(LOAD_STEP) and (imports.background or not imports.modules):
            load.start()  # beside the encode (both were admitted on the same side of the text encoder)
        y, = session.from_main(encode_image, "the first frame's encoding")
        stats.mark("vae_encode")

        from ..wan.dit.model import pad_context
        from ..wan.sampling.fast_sampler import draw, make_generator
        from ..wan.sampling.fast_state import finish_part, start_part

        seed = session.same_value(seed, "the seed")  # a random seed is rank 0's
        settings = replace(settings, seed=seed)
        noise_probe = draw(make_generator(seed, settings.noise_source), (256,), device)
        parallel_flags.check_same_inputs(session, {"noise": noise_probe, "conditioning": y,
                                                   "text": text.embeddings()[0] if session.parallel else None,
                                                   "camera": part.camera})

        def wait_for_text():  # before the cache takes the VRAM the encoder holds
            if text.background:
                text.embeddings()
                stats.mark("waiting for the text encoder")

        def make_run(model, cache, **kw):
            pos, = text.embeddings()
            return start_part(model, part, settings, y.cpu(), pad_context([pos], model.cfg.text_len).to(device),
                              cache, None, device=device, final_context=save is not None, **kw)

        def after(run, placement):
            if save is not None:
                pos, = text.embeddings()
                state = finish_part(run, part, settings, None, context=pos, prompt=args.prompt, label=control)
                state.condition = condition
                save.write(state, placement)

        latent, written = _sample(args, placement, load, device, make_run, vae if stream_vae else None, target,
                                  stats, speed, after=after, keep_cache=save is not None, session=session,
                                  imports=imports, before_load=lambda: text.before(LOAD_STEP),
                                  before_cache=wait_for_text)
    finally:
        if load is not None:
            load.close()
        if text is not None:
            text.stop()
        placement.close()
    report_compile(speed, log)
    if not session.is_main:
        return 0  # rank 0 decodes and writes the video
    if written is None:
        vae.to(device)
        with torch.inference_mode():
            video = vae.decode(latent, tiled=args.vae_tiled)[0]
        del vae
        stats.mark("vae_decode")
        from .video_out import write_video

        written = write_video(video, target, args.fps)
        stats.mark("write")
    print(f"Fast model: generated {frames} frames (requested {args.frames if args.frames is not None else 'as the keys'})")
    if save is not None:
        save.report()
    print(stats.summary(written, seed=seed, device=device))
    return 0


def check_base_experts(files) -> None:
    """The base path's refusal of the Fast model given as a high/low-noise expert (headers only)."""
    from ..loaders.expert_format import check_model_kind, detect_format

    for path in (files.high, files.low):
        note = check_model_kind(detect_format(path), "base")
        if note:
            log.warning("%s", note)


def _warn_base_only_flags(args) -> None:
    ignored = [flag for flag, value, default in (
        ("--steps", args.steps, None), ("--guide-scale", args.guide_scale, [5.0]), ("--boundary", args.boundary, 0.947),
        ("--solver", args.solver, "unipc"), ("--cfg-mode", args.cfg_mode, "auto"),
        ("--memory-mode", args.memory_mode, "auto"), ("--negative-prompt", args.negative_prompt, None),
        ("--camera-cache", args.camera_cache, "auto"))
        if value != default]
    if ignored:
        log.warning("--model fast ignores %s (4 distilled steps per chunk, no guidance)", ", ".join(ignored))
    if args.shift != 10.0:
        log.warning("--shift %.3g: the Fast model was distilled at shift 10; other values change its timesteps",
                    args.shift)


def _fast_files(args, imports=None):
    from ..loaders.checkpoint_dir import FastCheckpointFiles, find_fast_checkpoint_files
    from ..loaders.demo_checkpoint import build_demo_fast_checkpoint, demo_fast_ready

    if args.demo:
        if imports is not None and not demo_fast_ready(args.demo_dir):
            imports.wait()  # building it quantizes with bitsandbytes: not beside the background import
        files = build_demo_fast_checkpoint(args.demo_dir)
    elif args.ckpt_dir is not None:
        if args.fast_model is not None:
            from ..loaders.checkpoint_dir import _shared_files

            t5, vae, tok = _shared_files(Path(args.ckpt_dir).expanduser())
            files = FastCheckpointFiles(Path(args.ckpt_dir), args.fast_model, t5, vae, tok)
        else:
            files = find_fast_checkpoint_files(args.ckpt_dir)
    else:
        missing = [f"--{n.replace('_', '-')}" for n in ("fast_model", "t5", "vae") if getattr(args, n) is None]
        if missing:
            raise UsageError(f"give --ckpt-dir (or --demo), or {' '.join(missing)}")
        return FastCheckpointFiles(Path("."), args.fast_model, args.t5, args.vae, args.tokenizer)
    for n, attr in (("fast", "fast_model"), ("t5", "t5"), ("vae", "vae"), ("tokenizer", "tokenizer")):
        if getattr(args, attr) is not None:
            setattr(files, n, getattr(args, attr))
    return files


def _plan(args, cfg, layout, device, height, width, with_camera: bool, files, seq_parallel: int = 1):
    """The memory plan, and whether the VAE streams chunk by chunk beside the model (--stream-decode)."""
    from ..loaders.demo_checkpoint import demo_vae_config
    from ..memory.kv_placement import FastMemoryError, plan_fast_memory
    from ..memory.placement import available_ram_bytes, free_vram_bytes
    from ..wan.vae.model import VAEConfig
    from ..wan.vae.streaming import streaming_decode_bytes

    cuda = device.type == "cuda"
    vram = free_vram_bytes(device) if cuda else None  # None: the CPU computes, no device budget
    ram = available_ram_bytes()
    cdt = _compute_dtype(args, device)
    kw = dict(weights=args.weights, cache=args.kv_cache, cache_layers_on_gpu=args.kv_layers_on_gpu,
              camera=with_camera, compute_bytes=torch.empty(0, dtype=cdt).element_size(), seq_parallel=seq_parallel)
    try:
        plan = plan_fast_memory(height, width, cfg, layout, vram, ram, **kw)
        stream = args.stream_decode == "on" or not cuda and args.stream_decode == "auto"
        if cuda and args.stream_decode != "off":
            vae_cfg = demo_vae_config(files.root) or VAEConfig()
            extra = streaming_decode_bytes(vae_cfg, height, width)
            with_vae = plan_fast_memory(height, width, cfg, layout, vram, ram, extra_vram=extra, **kw)
            if args.stream_decode == "on" or (with_vae.fits and with_vae.blocks_on_gpu is None):
                plan, stream = with_vae, True
            else:
                log.info("streaming decode off: the VAE (%.1f GB while streaming) does not fit beside the model; "
                         "the video is decoded after sampling", extra / 1e9)
    except FastMemoryError as e:
        raise UsageError(str(e)) from None
    if not plan.fits:
        log.warning("the plan may not fit in VRAM: %s", plan.reason)
    return plan, stream


def _model_load(args, files, placement, device, speed, session=None, imports=None):
    """The Fast model's load as a ModelLoad (cli/model_load.py): run in turn by `_sample`, or started on a thread
    beside the image's VAE encode. It waits for the background imports first (the model needs bitsandbytes)."""
    from .model_load import ModelLoad

    def load(progress):
        return placement.load_model(files.fast, args.weights, progress=progress)

    return ModelLoad(load, device, before=imports.wait if imports is not None else None)


def _sample(args, placement, load, device, make_run, vae, target, stats, speed, *, restore=None, z_before=None,
            after=None, keep_cache=True, session=None, imports=None, before_load=None, before_cache=None):
    """Load (or join the load), place the cache, run the part's chunks; returns (latent, written path or None when
    the video is decoded later).

    placement: the FastPlacement of the memory plan (its host memory may be allocating already); the caller closes
    it too (idempotent). load: the model's ModelLoad (`_model_load`), maybe started already beside the VAE encode.
    make_run(model, cache, **kw) -> FastRun. restore: fill(i, k, v) + restore_counters(cache) of a saved cache
    (a continued video). z_before: the video's latent so far (the streaming decoder starts from its last frames,
    so the part's frames are exactly those of one whole decode). after(run, placement): called after the last chunk,
    before the cache is freed (saving the state). keep_cache=False: the cache is freed as soon as the last chunk is
    done with it (its host memory on a thread, beside the last decode and the frames' writing). session: a
    torchrun launch's (parallel.group.Session). imports: the background imports (their wait is its own stage).
    before_load() / before_cache(): called just before the model / the K/V cache takes its VRAM (the text stage
    waits there for an encoder that could not run beside them)."""
    from ..speed.options import apply_speed
    from ..wan.sampling.sampler import Cancelled
    from ..wan.vae.streaming import StreamingDecoder, warm_up
    from .progress import ProgressLine
    from .generate import _empty_cache
    from .video_out import VideoWriter

    decoder = StreamingDecoder(vae, tiled=args.vae_tiled) if vae is not None else None
    writer: Optional[VideoWriter] = VideoWriter(target, args.fps) if decoder is not None else None
    run = None
    bar = None
    t_decode = 0.0
    try:
        if before_load is not None:
            before_load()
        if load.background:
            model = load.result()
            _empty_cache(torch.device(device))  # what the load's stream cached: the main stream cannot reuse it
            stats.note("load (beside the VAE encode)", load.seconds)
            stats.mark("waiting for the load")
        else:
            if imports is not None and imports.modules:
                imports.wait()
                stats.mark("waiting for the imports" if imports.background else "imports")
            model = load.result()
            stats.mark("load")
        if imports is not None and imports.background:
            stats.note("imports (in the background)", imports.seconds)
        model = apply_speed(model, speed)
        if session is not None:
            from . import parallel_flags

            parallel_flags.attach(session, model)  # this rank's tokens; its cache holds this rank's heads
        log.info("Fast model loaded in %.1f s", load.seconds)
        if before_cache is not None:
            before_cache()
        cache = placement.make_cache(fill=None if restore is None else restore.fill)
        if restore is not None:
            restore.restore_counters(cache)
        if placement.host_memory_s is not None:
            stats.note("K/V host memory (in the background)", placement.host_memory_s)
        stats.mark("K/V cache")
        if decoder is not None and z_before is not None:
            with torch.inference_mode():
                warm_up(decoder, z_before.to(device))

        def on_chunk(index: int, x0: torch.Tensor) -> None:
            nonlocal t_decode
            if not keep_cache and index == run.chunks - 1:
                placement.release_cache()  # done with it: freed while this chunk is decoded and written
            if decoder is None:
                return
            t = time.perf_counter()
            with torch.inference_mode():
                writer.append(decoder.decode(x0)[0])
            t_decode += time.perf_counter() - t

        # y and the camera stay in host memory: each chunk's slice goes to the device when it runs (the camera of
        # a long video is GBs: 2.3 GB for 957 frames at 480p)
        run = make_run(model, cache, on_chunk=on_chunk)
        bar = ProgressLine(run.chunks * run.schedule.steps, enabled=not args.quiet)
        run.callback = lambda info: bar.update(replace(info, expert=f"chunk {info.chunk + 1}/{info.chunks}"))
        with torch.inference_mode():
            latent = run.run()
        stats.mark("sampling")
        if after is not None:
            after(run, placement.placement)
        if decoder is not None:
            stats.note("of which streaming decode", t_decode)
        written = writer.close() if writer is not None else None
        writer = None
        del model, cache
        placement.close()  # the model; the cache's host memory was being freed meanwhile
        stats.mark("finish (last frames written and memory freed)")
        return latent, written
    except Cancelled:
        raise KeyboardInterrupt from None
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:  # stopped early: keep what was decoded, never an empty file
            done = 0 if run is None else run.chunk
            total = "?" if run is None else run.chunks
            if writer.frames:
                print(f"stopped after {done} of {total} chunks: the {writer.frames} frames decoded so far are in "
                      f"{writer.close()}", flush=True)
            else:
                writer.abort()
                print(f"stopped after {done} of {total} chunks; nothing written", flush=True)
        if decoder is not None:
            decoder.close()
        load.close()
        placement.close()
        _empty_cache(torch.device(device))


def _compute_dtype(args, device: torch.device) -> torch.dtype:
    """The Fast model's compute dtype, which its K/V cache has too."""
    from ..quant.nf4_format import default_compute_dtype

    return torch.bfloat16 if args.weights == "bf16" else default_compute_dtype(device)


def _default_name(prompt: str) -> Path:
    from .preflight import default_output_name

    p = default_output_name(prompt)
    return p.with_name(p.name.replace("lingbot_", "lingbot_fast_", 1))

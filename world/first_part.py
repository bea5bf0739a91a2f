"""`lingbot-world generate --model fast|v2-14b|v2-1.3b`: a causal model's first part of a video, through the
world assembly (world/assembly.py) and the World session.

Same inputs as the base model (image, camera or keys, prompt, size, frames, seed), the umT5 / VAE / tokenizer of
the same download, and the model's release defaults (its registry entry: chunk, steps, shift, window). Every check
that can fail runs before the text encoder starts: the model's kind and tensors (headers only), LoRA files, the
frame count, the camera, the cache plan against free VRAM and RAM. The start-up overlaps what it can (bitsandbytes'
import, the text encoder, the image's VAE encode and the model's load; world/text_stage.py, world/model_load.py);
then the World session (world/session.py) runs the chunks, and each finished chunk is decoded and appended to the
output (streaming decode), so an interrupted run keeps its frames. A continuation (`--continue-from`) is
cli/fast_continue.py.
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace
from pathlib import Path

import torch

from ..memory.kv_placement import FastMemoryError
from ..wan.sizes import max_area_for, target_size
from . import fast_continue, fast_parts, fast_request, parallel_flags
from .errors import UsageError
from .generate_request import GenerateRequest

log = logging.getLogger("lingbot_world.generate")

LOAD_STEP = "the model's load"  # the start-up step the text encoder may run beside


def run(request: GenerateRequest) -> int:
    """Entry point from generate.run() for --model fast (one process, or one rank of a torchrun launch)."""
    fast_request.check_flags(request)  # no I/O: the flags' ranges and what applies to the Fast model
    if request.continue_from is None and request.demo:  # a continuation takes its inputs from the state
        request = with_fast_demo_defaults(request)
    session = parallel_flags.start(request.parallel_flags, request.device, log)
    request = request.on_rank(session)
    from .heavy_imports import BackgroundImports
    from .progress import RunStats

    # bitsandbytes (seconds) imports on a thread while this one checks, starts the text encoder and encodes the
    # image; waited for before the load (one process only: under torchrun the ranks set up collectives meanwhile).
    stats = RunStats()
    imports = BackgroundImports(background=request.overlap != "off" and not session.parallel)
    stats.mark("imports (torch._dynamo)")  # on this thread, first (cli/heavy_imports.py says why)
    failed = True
    try:
        if request.continue_from is not None:
            if session.parallel:
                raise UsageError("--continue-from runs in one process: start it without torchrun (a saved state "
                                 "holds every head of the K/V cache)")
            imports.wait()  # a continuation's checks import bitsandbytes' modules on this thread: not beside them
            code = fast_continue.run(request)
        else:
            code = _first_part(request, session, imports, stats)
        failed = False
        return code
    except Exception as e:
        session.report_failure(e)  # a check that failed here is raised on every rank
        raise
    finally:
        session.close(failed)


def with_fast_demo_defaults(request: GenerateRequest) -> GenerateRequest:
    """The demo's defaults, with the model's demo length (three chunks) when neither --frames nor keys set it, and
    its own output name (no demo replaces another's video)."""
    from ..world.models import model

    demo = request.with_demo_defaults()
    entry = model(request.model)
    if request.frames is None and not demo.actions:
        demo = replace(demo, frames=entry.demo.frames)
    if request.out is None:
        demo = replace(demo, out=Path(entry.demo.out))
    return demo


def _first_part(request: GenerateRequest, session, imports, stats) -> int:
    from ..memory.overlap import Step
    from ..world import assembly
    from ..world.demos import demo_ready
    from ..world.files import WorldFiles
    from ..world.models import model
    from ..world.session import FixedCondition, WorldSession
    from .preflight import noise_source, resolve_device
    from .speed_flags import fast_speed_plan, log_speed_plan, report_compile
    from .video_out import plan_output

    if request.save_state and session.parallel:
        raise UsageError("--save-state runs in one process: start it without torchrun (a saved state holds every "
                         "head of the K/V cache)")
    fast_parts.warn_base_only_flags(request)
    if request.image is None or request.prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    if request.camera and request.actions:
        raise UsageError("give either --camera (a trajectory) or --actions (keys), not both")
    session.begin_checks()  # several ranks: rank 0 first (it may build the demo checkpoint the others read)
    device = resolve_device(request.device)
    request = replace(request, noise=noise_source(request.noise, device))
    target = plan_output(request.out if request.out is not None else fast_parts.default_name(request.prompt))
    settings = fast_parts.world_settings(request, loras=fast_parts.fast_lora_specs(request.loras))
    assembly.check_weights_mode(settings.weights, device)
    if request.tiny_vae is not None:
        fast_parts.check_tiny_vae(request.tiny_vae)  # one line naming the flag, before the model's files
    source = fast_parts.model_source(request)
    if source.demo and not demo_ready(model(source.model), source.demo_dir, settings.weights):
        imports.wait()  # building the demo quantizes with bitsandbytes: not beside the background import
    files = WorldFiles.find(source, settings.weights)
    checked = assembly.check(files, settings, device)  # missing or mis-shaped tensors, LoRAs, the tiny decoder
    cfg, entry = checked.config, checked.entry

    image = assembly.load_start_image(request.image)
    height, width = target_size(image.shape[1], image.shape[2], max_area_for(request.size))
    fast_request.check_video_fits(request, height, width)
    seed = request.seed if request.seed >= 0 else random.randrange(2**31)
    keep = request.save_state is not None
    probe = assembly.video_settings(checked, settings, device, height, width, keep=False, seed=seed)
    camera, frames = fast_parts.camera_source(request, request.frames)  # key files: 81 frames without --frames
    from ..wan.sampling.fast_state import plan_first_part

    part = plan_first_part(camera, frames, probe)
    # refuses an impossible --compile/--compute/--attention before loading; a compiler check waits for the imports
    speed = fast_speed_plan(request.speed_flags, device, part.chunks, before_compiler_check=imports.wait)
    log_speed_plan(speed, log)
    settings = replace(settings, speed=speed)
    video = assembly.video_settings(checked, settings, device, height, width, keep=keep, seed=seed,
                                    latent_frames=part.latent_frames)  # the preset's window cap (draft)
    save = fast_parts.SaveState.plan(request, video, cfg, part.latent_frames)
    fast_request.check_targets(request, target, part.frames, height, width, save=save, files=files)
    log.info("model: %s", checked.entry.describe())  # after the checks: a refusal is the run's one line
    if part.note:
        log.warning("frames: %s", part.note)
    fast_parts.write_picture(request, part, camera, target)
    control = fast_parts.control_label(camera)
    if session.is_main:
        print(f"{entry.title}: {width}x{height}, {part.frames} frames ({part.latent_frames} latent frames, "
              f"{part.chunks} chunks of {video.chunk_frames}), camera: {control}"
              + (f", rule: {video.mode}" if request.save_state else ""), flush=True)
    split = parallel_flags.plan(session, request.parallel, cfg.num_heads, "fast", False, log)
    tiny = checked.tiny
    try:
        plan, stream_vae = assembly.plan_memory(checked, video, device, settings, latent_frames=part.latent_frames,
                                                with_camera=part.camera is not None, seq_parallel=split.ulysses)
    except FastMemoryError as e:
        raise UsageError(str(e)) from None
    if not plan.fits:
        log.warning("the plan may not fit in VRAM: %s", plan.reason)
    keep_vae = stream_vae and tiny is None  # the VAE's decoder streams (a tiny decoder needs the VAE to encode only)
    session.end_checks()
    parallel_flags.use(session, split, log)
    parallel_flags.agree_on_plans(session, plan.reason, False, log)
    parallel_flags.check_same_models(session, {"Fast model": files.dit}, log)
    stats.mark("setup")

    from ..loaders.vae_files import load_vae
    from ..memory.kv_placement import FastPlacement
    from ..wan.i2v import ConditionTrack, build_i2v_condition
    from ..wan.vae.model import VAEConfig
    from ..world import text_stage
    from ..world.model_load import ModelLoad
    from ..world.plan import compute_dtype

    model_bytes = int(plan.estimates.get("model_bytes", 0))
    # The load may run at the same time as the encode (a thread) when the whole model is resident: block swap
    # sets up its own streams and pinned ring, kept on the main thread.
    steps = [text_stage.vae_encode_step(files.vae_config() or VAEConfig(), height, width, part.frames,
                                        request.vae_tiled, keeps_vae=keep_vae),
             Step(LOAD_STEP, model_bytes + int(plan.estimates.get("block_bytes", 0)), model_bytes,
                  with_previous=plan.blocks_on_gpu is None)]
    # the cache's pinned layers (an FP8 cache's in codes: host_layer_bytes), allocated while the text encodes
    host_bytes = plan.streamed_layers * int(plan.estimates.get("host_layer_bytes", 0)) if plan.cache == "host" else 0
    text_plan = text_stage.plan(settings.text, files, [request.prompt], device, steps, session, host_bytes=host_bytes,
                                ram_free=plan.estimates.get("ram_free"))
    placement = FastPlacement(plan, device, log.info)
    loader = assembly.model_loader(checked, settings, device)
    load = ModelLoad(lambda progress: loader(placement, progress), device, before=imports.wait)
    text = None
    world = None
    try:
        if text_plan.overlap.host_early:  # pinned host memory from now on, beside the text, encode and load
            placement.start_host_memory(cfg, compute_dtype(request.weights, device))
        text = text_plan.start(log)
        if not text.background:
            stats.mark("text")
        vae = None

        def encode_image():  # rank 0 only when there are several: the others receive y
            nonlocal vae
            vae = load_vae(files.vae, device, config=files.vae_config())
            with torch.inference_mode():
                if save is not None:  # the conditioning of later frames too (a continuation needs them), in one encode
                    cond = ConditionTrack.build(vae, image, height, width, tiled=request.vae_tiled).y
                else:
                    cond = build_i2v_condition(vae, image, height, width, part.frames, tiled=request.vae_tiled)
            if not keep_vae:
                vae.to("cpu")
            _empty_cache(device)
            return [cond]

        text.before(text_stage.ENCODE_STEP)
        if text.plan.runs_with_previous(LOAD_STEP) and (imports.background or not imports.modules):
            load.start()  # beside the encode (both were admitted on the same side of the text encoder)
        y, = session.from_main(encode_image, "the first frame's encoding")
        stats.mark("vae_encode")
        condition = ConditionTrack(y, y.shape[2] - 1) if save is not None else FixedCondition(y)

        seed = session.same_value(seed, "the seed")  # a random seed is rank 0's
        video = replace(video, seed=seed)
        from ..wan.sampling.fast_sampler import draw, make_generator

        noise_probe = draw(make_generator(seed, video.noise_source), (256,), device)
        parallel_flags.check_same_inputs(session, {"noise": noise_probe, "conditioning": y,
                                                   "text": text.embeddings()[0] if session.parallel else None,
                                                   "camera": part.camera})

        def load_model():
            text.before(LOAD_STEP)
            if load.background:
                model = load.result()
                _empty_cache(device)  # what the load's stream cached: the main stream cannot reuse it
                stats.note("load (beside the VAE encode)", load.seconds)
                stats.mark("waiting for the load")
            else:
                if imports.modules:
                    imports.wait()
                    stats.mark("waiting for the imports" if imports.background else "imports")
                model = load.result()
                stats.mark("load")
            if imports.background:
                stats.note("imports (in the background)", imports.seconds)
            log.info("%s loaded in %.1f s", entry.title, load.seconds)
            return model

        def prepare_model(model):
            from ..speed.options import apply_speed

            model = apply_speed(model, speed)
            parallel_flags.attach(session, model)  # this rank's tokens; its cache holds this rank's heads
            return model

        world = WorldSession(placement, video, device=device, load_model=load_model, prepare_model=prepare_model,
                             vae=vae if keep_vae and vae is not None else None, speed=speed,
                             tiny_decoder=tiny if session.is_main else None)
        world.load()
        if text.background:  # before the cache takes the VRAM the encoder holds
            text.embeddings()
            stats.mark("waiting for the text encoder")
        pos, = text.embeddings()
        world.begin(condition, pos, request.prompt, video)

        def on_done(state):
            save.write(state, placement.placement)

        latent, written = fast_parts.run_part(world, part, camera, frames, fps=request.fps, quiet=request.quiet,
                                              target=target, stats=stats,
                                              stream=stream_vae and session.is_main,  # rank 0 writes the video
                                              on_done=on_done if save is not None else None,
                                              keep_cache=save is not None, label=control)
        if placement.host_memory_s is not None:
            stats.note("K/V host memory (in the background)", placement.host_memory_s)
        world.close()
        stats.mark("finish (last frames written and memory freed)")
    finally:
        load.close()
        if text is not None:
            text.stop()
        if world is not None:
            world.close()
        placement.close()
        _empty_cache(device)
    report_compile(speed, log)
    if not session.is_main:
        return 0  # rank 0 decodes and writes the video
    if written is None:
        written = _decode_and_write(vae, latent, target, request, speed, device)
        stats.mark("vae_decode")
    asked = frames if frames is not None else {"keys": "as long as the keys",
                                               "camera": "as long as the camera"}.get(camera.kind, "81")
    print(f"{entry.title}: generated {part.frames} frames (requested {asked})")
    if save is not None:
        save.report()
    print(stats.summary(written, seed=seed, device=device))
    return 0


def _decode_and_write(vae, latent, target, request: GenerateRequest, speed, device):
    """The whole latent decoded after sampling (the VAE did not fit beside the model) and written."""
    from ..speed.decode import decode_precision
    from ..speed.levers import plan_levers
    from ..speed.vae_norm import decoder_norm_silu
    from .video_out import write_video

    vae.to(device)
    # the decoder's kernels and precision as the session's streaming decode runs them
    with torch.inference_mode(), decode_precision(device, plan_levers(speed)["decode_bf16"]):
        video = vae.decode(latent, tiled=request.vae_tiled, norm_silu=decoder_norm_silu(device))[0]
    return write_video(video, target, request.fps)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

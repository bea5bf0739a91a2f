"""`generate --model fast --continue-from STATE`: the next part of a saved Fast video, through the World session.

A video made with `--save-state` goes on with new keys (`--actions`), a new camera (`--camera`) or neither (the
camera stands still), `--frames` new frames (12 per chunk; default: as long as the keys); it writes the new part's
video (`--out`), optionally the whole video so far (`--whole-video`), and with `--save-state` the state after it
(the same path may be given to both). Everything a state fixes (the size, the seed's generator, the cache rules,
the model) comes from the state; a state from another model, weights mode or device kind is refused before
anything loads. `--rule reference|continuable` (wan/sampling/fast_state.py) says how a first part is made.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from ..wan.sampling.fast_state import FastSettings
from . import fast_parts, fast_request
from .errors import UsageError
from .generate_request import GenerateRequest

log = logging.getLogger("lingbot_world.generate")


def run(request: GenerateRequest) -> int:
    """generate --model fast --continue-from PATH."""
    from ..memory.kv_placement import FastMemoryError, FastPlacement
    from ..speed.decode import decode_precision
    from ..speed.levers import plan_levers
    from ..speed.vae_norm import decoder_norm_silu
    from ..text_encoder.encode import encode_prompts
    from ..wan.vae.streaming import decode_part
    from ..wan.vae.tiny import TinyStreamingDecoder
    from ..world import assembly
    from ..world.files import WorldFiles
    from ..world.session import WorldSession
    from .preflight import resolve_device
    from .progress import RunStats
    from .speed_flags import (fast_compile_policy, follow_started_compile, follow_started_speed, log_speed_plan,
                              report_compile, speed_plan)
    from .video_out import plan_output, write_video

    stats = RunStats()
    if request.demo and request.device == "auto":
        request = replace(request, device="cpu")  # the demo's default
    fast_parts.warn_base_only_flags(request)
    sf = assembly.open_state(request.continue_from)  # format, version, damage: refused here, before anything loads
    state = sf.state
    st = state.settings
    _refuse_other_settings(request, st)
    if request.model == "fast" and st.model_name:  # the default name: the state says which model made it
        request = replace(request, model=st.model_name)
    device = resolve_device(request.device)
    if st.noise_source == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{sf.path} continues the reference's CUDA generator; run it on a CUDA GPU")
    followed = follow_started_speed(request.speed, request.chunk_steps, st.speed, st.chunk_steps)
    request = replace(request, speed=followed.speed, chunk_steps=followed.chunk_steps)
    if followed.note:
        (log.warning if followed.differs else log.info)("speed: %s", followed.note)
    speed = speed_plan(request.speed_flags, device)
    settings = fast_parts.world_settings(request, loras=fast_parts.fast_lora_specs(request.loras))
    assembly.check_weights_mode(settings.weights, device)
    files = WorldFiles.find(fast_parts.model_source(request), settings.weights)
    checked = assembly.check(files, settings, device)
    cfg = checked.config
    tiny = checked.tiny
    here = assembly.video_settings(checked, settings, device, st.height, st.width, seed=st.seed, mode=st.mode,
                                   window=st.window, sink=st.sink)
    here = replace(here, max_attention=st.max_attention, precision=st.precision, noise_source=st.noise_source)
    st.check_continue(here, str(sf.path))
    sf.check_model(cfg.num_layers, cfg.num_heads, cfg.head_dim, getattr(torch, here.cache_dtype))
    if state.condition is None:
        raise UsageError(f"{sf.path} has no conditioning for later frames; it cannot be continued")

    source, frames = fast_parts.camera_source(request, request.frames, continuation=True)
    from ..wan.sampling.fast_state import plan_next_part

    part = plan_next_part(state, source, frames)
    index = len(state.parts) + 1
    target = plan_output(request.out if request.out is not None else Path(f"{sf.path.stem}_part{index}.mp4"))
    whole_target = (plan_output(request.whole_video, flag="--whole-video") if request.whole_video is not None
                    else None)
    total_lat = state.latent_frames + part.latent_frames
    control = fast_parts.control_label(source, still=state.has_camera)
    print(f"continuing {sf.path} ({sf.file_bytes / 1e9:.2f} GB): {state.frames} frames so far ({state.chunks} chunks), "
          f"+ {part.frames} frames ({part.chunks} chunks), camera: {control}", flush=True)
    save = fast_parts.SaveState.plan(request, st, cfg, total_lat)
    fast_request.check_targets(request, target, part.frames, st.height, st.width, save=save, whole=whole_target,
                               whole_frames=state.frames + part.frames, files=files)
    log.info("model: %s", checked.entry.describe())  # after the checks: a refusal is the run's one line
    if part.note:
        log.warning("frames: %s", part.note)
    fast_parts.write_picture(request, part, source, target)
    speed = follow_started_compile(fast_compile_policy(speed, request.speed_flags, part.chunks), speed,
                                   request.speed_flags, st.compile)
    log_speed_plan(speed, log)
    settings = replace(settings, speed=speed)
    try:
        plan, stream_vae = assembly.plan_memory(checked, st, device, settings, latent_frames=total_lat,
                                                with_camera=part.camera is not None)
    except FastMemoryError as e:
        raise UsageError(str(e)) from None
    if not plan.fits:
        log.warning("the plan may not fit in VRAM: %s", plan.reason)
    stats.mark("setup")

    prompt, context = state.prompt, state.context
    if request.prompt is not None and request.prompt != state.prompt:
        prompt = request.prompt
        text = request.text
        context = encode_prompts(files.t5, files.tokenizer, [prompt], device=text.device, cache_dir=text.cache_dir,
                                 use_cache=text.use_cache, timeout=text.timeout)[0]
        log.info("new prompt from this part on: %s", prompt)
    stats.mark("text")

    from ..loaders.vae_files import load_vae

    # a tiny decoder decodes everything here: the VAE (only a decoder in a continuation) is not loaded
    vae = load_vae(files.vae, device, config=files.vae_config()) if tiny is None else None
    if vae is not None and not stream_vae:
        vae.to("cpu")
    z_before = state.latent()
    placement = FastPlacement(plan, device, log.info)
    loader = assembly.model_loader(checked, settings, device)
    world = WorldSession(placement, st, device=device, load_model=lambda: loader(placement),
                         prepare_model=assembly.speed_preparer(speed), vae=vae if stream_vae else None, speed=speed,
                         tiny_decoder=tiny)
    try:
        world.resume(state, sf)
        world.context, world.prompt = context.detach().to("cpu", torch.float32), prompt

        def on_done(new_state):
            save.write(new_state, placement.placement)

        latent, written = fast_parts.run_part(world, part, source, frames, fps=request.fps, quiet=request.quiet,
                                              target=target, stats=stats, stream=stream_vae,
                                              on_done=on_done if save is not None else None,
                                              keep_cache=save is not None, label=control)
    finally:
        world.close()
    report_compile(speed, log)
    if vae is not None and (written is None or whole_target is not None):
        vae.to(device)
    norm_silu = decoder_norm_silu(device)  # the decoder's kernels and precision as the session's decode runs them
    precision = partial(decode_precision, device, plan_levers(speed)["decode_bf16"])
    if written is None:
        with torch.inference_mode(), precision():
            video = decode_part(vae, z_before.to(device), latent, tiled=request.vae_tiled,
                                norm_silu=norm_silu)[0]
        written = write_video(video, target, request.fps)
        del video
        stats.mark("vae_decode")
    whole = None
    if whole_target is not None:
        z_whole = torch.cat([z_before.to(device), latent.to(device)], dim=2)
        with torch.inference_mode(), precision():
            if tiny is not None:
                video = TinyStreamingDecoder(tiny).decode(z_whole)[0]
            else:
                video = vae.decode(z_whole, tiled=request.vae_tiled, norm_silu=norm_silu)[0]
        del z_whole
        whole = write_video(video, whole_target, request.fps)
        del video
        stats.mark("whole video")
    del vae
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print(f"{checked.entry.title}: continued with {part.frames} frames ({state.frames + part.frames} so far)")
    if whole is not None:
        print(f"the whole video so far: {whole}")
    if save is not None:
        save.report()
    print(stats.summary(written, seed=st.seed, device=device))
    return 0


def _refuse_other_settings(request: GenerateRequest, st: FastSettings) -> None:
    """The cache rules a continuation takes from the state: a different value is refused."""
    window = None if request.window is None else (request.window or None)  # --window 0: the whole video
    for flag, given, saved in (("--window", window, st.window),
                               ("--max-attention", request.max_attention, st.max_attention)):
        if (request.window if flag == "--window" else given) is not None and given != saved:
            raise UsageError(f"{flag} {given}: the video was started with {flag} {saved}; a continuation keeps "
                             "the cache rules it was started with (leave the flag out)")
    if request.sink is not None and request.sink != st.sink:
        raise UsageError(f"--sink {request.sink}: the video was started with --sink {st.sink}; leave the flag out")
    # --image, --size, --seed, --noise and --rule are refused before this (cli/flag_checks.FROM_THE_STATE)

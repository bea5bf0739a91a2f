"""`lingbot-world generate --model fast|v2-14b|v2-1.3b`: a causal model's first part of a video
(world/first_part.py), or with `--continue-from STATE` the next part of a saved one (world/continuation.py).

Same inputs as the base model (image, camera or keys, prompt, size, frames, seed), the umT5 / VAE / tokenizer of
the same download, and the model's release defaults (its registry entry: chunk, steps, shift, window). Every check
that can fail runs before the text encoder starts: the flags (cli/checks.py), the model's kind and tensors (headers
only), LoRA files, the frame count, the camera, the outputs (cli/outputs.py), the cache plan against free VRAM and
RAM. Each finished chunk is decoded and appended to the output (streaming decode), so an interrupted run keeps its
frames.

A continuation goes on with new keys (`--actions`), a new camera (`--camera`) or neither (the camera stands still),
`--frames` new frames (12 per chunk; default: as long as the keys); it writes the new part's video (`--out`),
optionally the whole video so far (`--whole-video`), and with `--save-state` the state after it (the same path may
be given to both). Everything a state fixes comes from the state; the flags that would change it are refused.

This door translates the flags into the world's typed settings at its edge: `_first_part` and `_continue` each build
their ModelSource, WorldSettings, Steering and VideoRequest right where they hand them to the world (the two differ
in the model and the noise: a continuation's come from its state), and turn what comes back into files and lines.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from . import parallel_flags
from .checks import check_causal_flags, noise_source, resolve_device, warn_base_only_flags
from .errors import UsageError
from .outputs import check_targets, picture_path, picture_video, write_picture
from .progress import ProgressLine, RunStats
from .requests import GenerateRequest
from .video_out import VideoWriter, default_output_name, plan_output, write_video

log = logging.getLogger("lingbot_world.generate")


def run(request: GenerateRequest) -> int:
    """Entry point from generate.run() for a causal model (one process, or one rank of a torchrun launch)."""
    check_causal_flags(request)  # no I/O: the flags' ranges and what applies to the model
    if request.continue_from is None and request.demo:  # a continuation takes its inputs from the state
        request = with_demo_defaults(request)
    launch = parallel_flags.ParallelFlags(request.parallel, request.parallel_timeout, request.device)
    session = parallel_flags.start(launch, log)
    request = request.on_rank(session)
    from ..world import heavy_imports

    # bitsandbytes (seconds) imports on a thread while this one checks, starts the text encoder and encodes the
    # image; waited for before the load (one process only: under torchrun the ranks set up collectives meanwhile).
    stats = RunStats()
    imports = heavy_imports.BackgroundImports(background=request.overlap != "off" and not session.parallel)
    stats.mark("imports (torch._dynamo)")  # on this thread, first (world/heavy_imports.py says why)
    failed = True
    try:
        if request.continue_from is not None:
            if session.parallel:
                raise UsageError("--continue-from runs in one process: start it without torchrun (a saved state "
                                 "holds every head of the K/V cache)")
            imports.wait()  # a continuation's checks import bitsandbytes' modules on this thread: not beside them
            code = _continue(request)
        else:
            code = _first_part(request, session, imports, stats)
        failed = False
        return code
    except Exception as e:
        session.report_failure(e)  # a check that failed here is raised on every rank
        raise
    finally:
        session.close(failed)


def with_demo_defaults(request: GenerateRequest) -> GenerateRequest:
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


# ---- the first part ----------------------------------------------------------------------------------------------
def _first_part(request: GenerateRequest, session, imports, stats: RunStats) -> int:
    from ..world.first_part import FirstPart
    from ..world.settings import ModelSource, Steering, VideoRequest, WorldSettings

    if request.save_state and session.parallel:
        raise UsageError("--save-state runs in one process: start it without torchrun (a saved state holds every "
                         "head of the K/V cache)")
    warn_base_only_flags(request, log)
    if request.image is None or request.prompt is None:
        raise UsageError("--image and --prompt are required (or use --demo)")
    if request.camera and request.actions:
        raise UsageError("give either --camera (a trajectory) or --actions (keys), not both")
    session.begin_checks()  # several ranks: rank 0 first (it may build the demo checkpoint the others read)
    device = resolve_device(request.device)
    noise = noise_source(request.noise, device)
    target = plan_output(request.out if request.out is not None
                         else default_output_name(request.prompt, "lingbot_fast_"))
    window = _window(request)
    loras = tuple((*_lora(spec), f"--lora {spec}") for spec in request.lora)
    source = ModelSource(model=request.model, ckpt_dir=request.ckpt_dir, demo=bool(request.demo),
                         demo_dir=request.demo_dir, dit=request.fast_model, t5=request.t5, vae=request.vae,
                         tokenizer=request.tokenizer, assets_dir=request.assets_dir)
    settings = WorldSettings(size=request.size, seed=request.seed, noise=noise, rule=request.rule, window=window,
                             sink=_sink(request), max_attention=request.max_attention,
                             precision=request.camera_precision, weights=request.weights, kv_cache=request.kv_cache,
                             kv_layers_on_gpu=request.kv_layers_on_gpu, vae_tiled=bool(request.vae_tiled),
                             tiny_vae=request.tiny_vae, loras=loras, text=request.text,
                             stream_decode=request.stream_decode)
    steering = Steering(actions=request.actions, camera=request.camera, camera_speed=request.camera_speed,
                        per_frame_intrinsics=bool(request.per_frame_intrinsics), frames=request.frames)
    inputs = VideoRequest(image=request.image, prompt=request.prompt, steering=steering, device=device,
                          parallel=request.parallel, speed=request.speed_flags, save_to=request.save_state)
    video = FirstPart(source, settings, inputs, session, imports=imports, stages=stats, log=log)
    video.check()
    part = video.plan()
    save = video.state_target()  # --save-state: checked with the other outputs before the run
    if save is not None and not request.quiet:
        _say_state(save)
    check_targets(request, target, part.frames, video.height, video.width, save=save, files=video.files)
    video.describe()
    _write_picture(request, video.picture(), target)
    if session.is_main:
        print(f"{video.entry.title}: {video.width}x{video.height}, {part.frames} frames ({part.latent_frames} latent "
              f"frames, {part.chunks} chunks of {video.video.chunk_frames}), camera: {video.control}"
              + (f", rule: {video.video.mode}" if request.save_state else ""), flush=True)
    video.place()
    stats.mark("setup")
    try:
        world = video.start()
        latent, written = run_part(world, part, video.camera, video.frames, fps=request.fps, quiet=request.quiet,
                                   target=target, stats=stats, stream=video.streams,
                                   on_done=video.saver(save) if save is not None else None,
                                   keep_cache=save is not None, label=video.control)
        video.finish()
    finally:
        video.close()
    video.log_compile()
    if not session.is_main:
        return 0  # rank 0 decodes and writes the video
    if written is None:  # the VAE did not fit beside the model: the whole latent decoded now
        written = write_video(video.decode(latent), target, request.fps)
        stats.mark("vae_decode")
    frames, kind = video.frames, video.camera.kind
    asked = frames if frames is not None else {"keys": "as long as the keys",
                                               "camera": "as long as the camera"}.get(kind, "81")
    print(f"{video.entry.title}: generated {part.frames} frames (requested {asked})")
    if save is not None:
        _report_saved(save)
    print(stats.summary(written, seed=video.seed, device=device))
    return 0


# ---- a continuation ----------------------------------------------------------------------------------------------
def _continue(request: GenerateRequest) -> int:
    """generate --model fast --continue-from PATH."""
    from ..world.continuation import Continuation
    from ..world.settings import ModelSource, Steering, VideoRequest, WorldSettings

    stats = RunStats()
    if request.demo and request.device == "auto":
        request = replace(request, device="cpu")  # the demo's default
    warn_base_only_flags(request, log)
    device = resolve_device(request.device)
    loras = tuple((*_lora(spec), f"--lora {spec}") for spec in request.lora)
    source = ModelSource(model=None if request.model == "fast" else request.model,  # the state says which model
                         ckpt_dir=request.ckpt_dir, demo=bool(request.demo), demo_dir=request.demo_dir,
                         dit=request.fast_model, t5=request.t5, vae=request.vae, tokenizer=request.tokenizer,
                         assets_dir=request.assets_dir)
    settings = WorldSettings(size=request.size, seed=request.seed, noise=request.noise, rule=request.rule,
                             window=_window(request), sink=_sink(request), max_attention=request.max_attention,
                             precision=request.camera_precision, weights=request.weights, kv_cache=request.kv_cache,
                             kv_layers_on_gpu=request.kv_layers_on_gpu, vae_tiled=bool(request.vae_tiled),
                             tiny_vae=request.tiny_vae, loras=loras, text=request.text,
                             stream_decode=request.stream_decode)
    steering = Steering(actions=request.actions, camera=request.camera, camera_speed=request.camera_speed,
                        per_frame_intrinsics=bool(request.per_frame_intrinsics), frames=request.frames)
    inputs = VideoRequest(prompt=request.prompt, steering=steering, device=device, speed=request.speed_flags,
                          save_to=request.save_state, continue_from=request.continue_from)
    video = Continuation(source, settings, inputs, stages=stats, log=log)
    video.open()  # format, version, damage: refused here, before anything loads
    _refuse_other_settings(request, video.started)
    part = video.check()
    sf, state = video.file, video.state
    target = plan_output(request.out if request.out is not None else Path(f"{sf.path.stem}_part{len(state.parts) + 1}.mp4"))
    whole_target = (plan_output(request.whole_video, flag="--whole-video") if request.whole_video is not None
                    else None)
    print(f"continuing {sf.path} ({sf.file_bytes / 1e9:.2f} GB): {state.frames} frames so far ({state.chunks} chunks), "
          f"+ {part.frames} frames ({part.chunks} chunks), camera: {video.control}", flush=True)
    save = video.state_target()  # --save-state: checked with the other outputs before the run
    if save is not None and not request.quiet:
        _say_state(save)
    st = video.started
    check_targets(request, target, part.frames, st.height, st.width, save=save, whole=whole_target,
                  whole_frames=state.frames + part.frames, files=video.files)
    video.describe()
    _write_picture(request, video.picture(), target)
    video.place()
    stats.mark("setup")
    try:
        world = video.start()
        latent, written = run_part(world, part, video.source_steering, video.frames, fps=request.fps,
                                   quiet=request.quiet, target=target, stats=stats, stream=video.stream_vae,
                                   on_done=video.saver(save) if save is not None else None,
                                   keep_cache=save is not None, label=video.control)
    finally:
        video.close()
    video.log_compile()
    video.prepare_decode(written is None, whole_target is not None)
    if written is None:
        written = write_video(video.decode_part(latent), target, request.fps)
        stats.mark("vae_decode")
    whole = None
    if whole_target is not None:
        whole = write_video(video.decode_whole(latent), whole_target, request.fps)
        stats.mark("whole video")
    video.release()
    print(f"{video.entry.title}: continued with {part.frames} frames ({state.frames + part.frames} so far)")
    if whole is not None:
        print(f"the whole video so far: {whole}")
    if save is not None:
        _report_saved(save)
    print(stats.summary(written, seed=st.seed, device=device))
    return 0


def _refuse_other_settings(request: GenerateRequest, st) -> None:
    """The cache rules a continuation takes from the state (`st`, its FastSettings): a different value is refused."""
    window = None if request.window is None else (request.window or None)  # --window 0: the whole video
    for flag, given, saved in (("--window", window, st.window),
                               ("--max-attention", request.max_attention, st.max_attention)):
        if (request.window if flag == "--window" else given) is not None and given != saved:
            raise UsageError(f"{flag} {given}: the video was started with {flag} {saved}; a continuation keeps "
                             "the cache rules it was started with (leave the flag out)")
    if request.sink is not None and request.sink != st.sink:
        raise UsageError(f"--sink {request.sink}: the video was started with --sink {st.sink}; leave the flag out")
    # --image, --size, --seed, --noise and --rule are refused before this (cli/checks.FROM_THE_STATE)


# ---- flags -> the world's typed settings -------------------------------------------------------------------------
def _window(request: GenerateRequest):
    """--window: the model's default when not given (world/settings.MODEL_DEFAULT), None for 0 (the whole video)."""
    from ..world.settings import MODEL_DEFAULT

    return MODEL_DEFAULT if request.window is None else (request.window or None)


def _sink(request: GenerateRequest) -> int:
    from ..world.settings import MODEL_DEFAULT

    return MODEL_DEFAULT if request.sink is None else request.sink


def _lora(spec: str) -> tuple:
    """--lora FILE[:STRENGTH] on a causal model as (path, strength); the world's checks read and match it (--lora-high
    / --lora-low, the base model's two experts, are refused by the flag checks)."""
    from .checks import parse_spec

    return parse_spec(spec, "--lora")


# ---- what a part writes ------------------------------------------------------------------------------------------
def _say_state(save) -> None:
    """--save-state's target and the size it will have."""
    print(f"state: {save.path} will hold {save.size_text(save.estimate)} (the K/V cache: {save.tokens} tokens x "
          f"{save.layers} layers in {save.cache_dtype}, {save.size_text(save.kv_bytes)})", flush=True)


def _report_saved(save) -> None:
    if save.written is not None:
        print(f"saved the state: {save.written} ({save.size_text(save.written.stat().st_size)}); continue with "
              f"--continue-from {save.written} --actions KEYS", flush=True)


def _write_picture(request: GenerateRequest, picture, target) -> Optional[Path]:
    """--trajectory-picture: the part's camera path, with its key timeline for keys, next to `target` (the part's
    video, cli/video_out.OutputTarget) unless --out names the video."""
    if request.trajectory_picture is None:
        return None
    if picture is None:
        log.warning("--trajectory-picture: this part has no camera; no picture written")
        return None
    out = write_picture(picture_path(request.trajectory_picture, picture_video(request, target)), picture)
    if out is not None and not request.quiet:
        print(f"trajectory picture: {out}", flush=True)
    return out


def run_part(world, part, source, frames, *, fps: int, quiet: bool, target, stats, stream: bool,
             on_done: Optional[Callable] = None, keep_cache: bool = True, label: str = "") -> tuple:
    """A part through the World session with the CLI's progress line and (streaming, at `fps`) video writer; returns
    (latent, written path or None when the video is decoded afterwards). Ctrl-C keeps the frames decoded so far."""
    from ..world.errors import Cancelled

    writer: Optional[VideoWriter] = VideoWriter(target, fps) if stream else None
    steps = world.steps_per_chunk
    bar = ProgressLine(part.chunks * steps, enabled=not quiet)
    done = [0]  # chunks whose steps are all done

    def progress(info):
        done[0] = (info.index + 1) // steps
        bar.update(replace(info, expert=f"chunk {info.chunk + 1}/{info.chunks}"))

    world.callback = progress
    try:
        latent = world.run_part(part, source, frames, on_frames=(lambda f: writer.append(f[0])) if stream else None,
                                final_context=on_done is not None or keep_cache, on_done=on_done,
                                release_cache_after=not keep_cache, label=label)
        stats.mark("sampling")
        if stream:
            stats.note("of which streaming decode", world.last_times.decode)
        written = writer.close() if writer is not None else None
        writer = None
        return latent, written
    except Cancelled:
        raise KeyboardInterrupt from None
    finally:
        bar.close()
        world.callback = None
        if writer is not None and writer.open:  # stopped early: what was decoded goes to a new name, never --out
            frames, kept = writer.frames, writer.keep_partial()
            if kept is not None:
                print(f"stopped after {done[0]} of {part.chunks} chunks: the {frames} frames decoded so far are in "
                      f"{kept} ({target.path} was not touched)", flush=True)
            else:
                print(f"stopped after {done[0]} of {part.chunks} chunks; nothing written", flush=True)

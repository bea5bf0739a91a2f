"""`lingbot-world generate` with the base models (the default `--model base`): the two v1 experts, Cam or Act (told
from their weights), flow-UniPC with classifier-free guidance, through the base world (world/base.py).

This door translates the flags into the world's typed settings, runs the pre-flight (its own flag, device and
output checks between the world's: every check that costs seconds before any that costs minutes; the pre-flight's
order is flags -> device and noise -> output path -> image -> checkpoint files -> the video's memory floor ->
outputs -> camera), then the run, and writes the video (rank 0 of a torchrun launch) and the summary.
"""
from __future__ import annotations

import logging
from pathlib import Path

from . import parallel_flags
from .checks import check_base_flags, check_t5_device, noise_source, resolve_device
from .outputs import check_outputs, generate_inputs, picture_path, picture_spec, video_spec, write_picture
from .progress import ProgressLine, RunStats
from .requests import GenerateRequest
from .video_out import default_output_name, plan_output, write_video

log = logging.getLogger("lingbot_world.generate")


def run(request: GenerateRequest) -> int:
    """generate --model base (one process, or one rank of a torchrun launch: the request takes its device)."""
    if request.demo:
        request = request.with_demo_defaults()
    stats = RunStats()
    launch = parallel_flags.ParallelFlags(request.parallel, request.parallel_timeout, request.device)
    session = parallel_flags.start(launch, log)
    request = request.on_rank(session)
    failed = True
    try:
        code = _generate(request, session, stats)
        failed = False
        return code
    finally:
        session.close(failed)


def _generate(request: GenerateRequest, session, stats: RunStats) -> int:
    # Everything that can be checked in seconds is checked before anything that takes minutes (on every rank;
    # rank 0 first, as it may build the demo checkpoint the others read).
    with session.main_first("the pre-flight"):
        world, output = preflight(request, session)
    world.join()
    stats.mark("checks")
    latent = world.sample(stats, lambda steps: ProgressLine(steps, enabled=not request.quiet))
    if not session.is_main:
        return 0  # rank 0 decodes and writes the video
    video = world.decode(latent)
    stats.mark("vae_decode")
    out = write_video(video, output, request.fps)
    stats.mark("write")
    print(stats.summary(out, seed=world.seed, device=world.device))
    return 0


def preflight(request: GenerateRequest, session):
    """Every check, in order; returns (the checked world, the video's target). Builds the demo checkpoint when
    --demo asks for it."""
    from ..world.speed import log_speed_plan, speed_plan
    from ..world.base import BaseWorld
    from ..world.settings import BaseSettings, ExpertLora, ModelSource, Steering, VideoRequest

    check_base_flags(request)
    device = resolve_device(request.device)
    noise = noise_source(request.noise, device)
    check_t5_device(request.t5_device)
    speed = speed_plan(request.speed_flags, device)  # refuses an impossible --compile/--compute/--attention first
    output = plan_output(request.out if request.out is not None else default_output_name(request.prompt))

    source = ModelSource(model="v1-base-act" if request.demo == "act" else None, ckpt_dir=request.ckpt_dir,
                         demo=bool(request.demo), demo_dir=request.demo_dir, high=request.high, low=request.low,
                         t5=request.t5, vae=request.vae, tokenizer=request.tokenizer)
    loras = tuple(ExpertLora(*_parse_lora(spec, flag), experts, flag, spec)
                  for flag, experts, specs in (("--lora", ("high", "low"), request.lora),
                                               ("--lora-high", ("high",), request.lora_high),
                                               ("--lora-low", ("low",), request.lora_low)) for spec in specs)
    settings = BaseSettings(size=request.size, steps=request.steps, shift=request.shift, boundary=request.boundary,
                            guide_scale=tuple(request.guide_scale), seed=request.seed, noise=noise,
                            solver=request.solver, cfg_mode=request.cfg_mode, weights=request.weights,
                            memory_mode=request.memory_mode, blocks_on_gpu=request.blocks_on_gpu,
                            camera_cache=request.camera_cache, vae_tiled=bool(request.vae_tiled),
                            precision=request.camera_precision, negative_prompt=request.negative_prompt, loras=loras,
                            text=request.text, speed=speed)
    steering = Steering(actions=request.actions, camera=request.camera, camera_speed=request.camera_speed,
                        per_frame_intrinsics=bool(request.per_frame_intrinsics), frames=request.frames)
    video = VideoRequest(image=request.image, prompt=request.prompt, steering=steering, device=device,
                         parallel=request.parallel)
    world = BaseWorld(source, settings, video, session, log)
    world.check()
    check_outputs([video_spec("--out", output, world.frames, world.height, world.width),
                   *picture_spec(request.trajectory_picture, output.path)],
                  inputs=generate_inputs(request, world.files))
    # the picture goes next to the video actually written (--out as given, else the planned name)
    picture = picture_path(request.trajectory_picture, Path(request.out) if request.out is not None else output.path)
    control = world.control()
    if control.line and not request.quiet:
        print(control.line, flush=True)
    write_picture(picture, control.picture)
    log_speed_plan(speed, log)
    return world, output


def _parse_lora(spec: str, flag: str) -> tuple[Path, float]:
    from .checks import parse_spec

    return parse_spec(spec, flag)

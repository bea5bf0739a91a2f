"""What the Fast model's first part and its continuations share in the CLI: the flags read into settings, files,
the part's control, the state target, the memory plan, and running a part through the World session with the
CLI's progress line, streaming video writer and Ctrl-C handling."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from ..quant.lowp_kinds import LOWP_WEIGHTS
from ..wan.sampling.fast_state import CameraSource, FastSettings, PartPlan
from .errors import UsageError
from .generate_request import GenerateRequest
from .lora_run import LoraFlags

log = logging.getLogger("lingbot_world.generate")

FILE_FRAMES = 81  # key files without --frames: the first 81 frames, as the release reads keys[:frame_num]
LOAD_STEP = "the Fast model's load"


# ---- flags -> settings -------------------------------------------------------------------------------------------
def settings_for(request: GenerateRequest, fmt, device, height: int, width: int, seed: int, noise: str, mode: Optional[str] = None,
                 window=None, sink=None, max_attention=None, precision=None) -> FastSettings:
    """The settings of a Fast video started (or continued) by this request."""
    from ..loaders.fast_state_file import model_fingerprint, model_label
    from ..world.plan import compute_dtype

    dtype = compute_dtype(request.weights, device)
    keep = request.save_state is not None or request.continue_from is not None
    return FastSettings(
        height, width, int(seed), noise, mode or request.rule,
        window=request.window if window is None else window, sink=request.sink if sink is None else sink,
        max_attention=request.max_attention if max_attention is None else max_attention,
        precision=precision or request.camera_precision, weights=request.weights,
        cache_dtype=str(dtype).replace("torch.", ""), model=model_fingerprint(fmt) if keep else "",
        model_label=model_label(fmt), vae_tiled=bool(request.vae_tiled))


def camera_source(request: GenerateRequest, frames: Optional[int],
                  continuation: bool = False) -> tuple[CameraSource, Optional[int]]:
    """(what steers the part: --actions (keys), --camera (trajectory folder or preset) or nothing, the frames the
    part asks for: `frames`, or FILE_FRAMES for key files of a first part without --frames)."""
    from ..loaders.action_files import read_key_source
    from .preflight import camera_path

    if request.actions:
        src = read_key_source(request.actions)
        if frames is None and src.from_file and not continuation:
            frames = FILE_FRAMES  # key files are cut to the video (the release reads keys[:frame_num])
        return CameraSource(keys=src.keys, intrinsics=src.intrinsics, label=src.label, from_file=src.from_file), frames
    if request.camera:
        want = (frames or 12) + 1 if continuation else (frames or FILE_FRAMES)
        path, zoom = camera_path(request.camera, max(want, 2), request.camera_speed)
        return CameraSource(poses=path.poses, intrinsics=path.intrinsics,
                            per_frame_intrinsics=bool(request.per_frame_intrinsics or zoom),
                            label=str(request.camera)), frames
    return CameraSource(), frames


def control_label(source: CameraSource, still: bool = False) -> str:
    """What steers a part, for the log line and the state's history (keys steer the camera too)."""
    if source.label:
        return source.label
    if source.kind == "none":
        return "none (the camera stands still)" if still else "none"
    return source.kind


def write_picture(request: GenerateRequest, part: PartPlan, source: CameraSource, target) -> Optional[Path]:
    """--trajectory-picture: the part's camera path, with its key timeline for keys, next to `target` (the part's
    cli/video_out.OutputTarget) unless --out names the video."""
    from . import actions_arg
    from .fast_request import picture_video

    if request.trajectory_picture is None:
        return None
    if part.path is None:
        log.warning("--trajectory-picture: this part has no camera; no picture written")
        return None
    title = f"{source.label}: {part.keys.to_string()}" if part.keys is not None and not source.from_file else source.label
    picture = actions_arg.picture_path(request.trajectory_picture, picture_video(request, target))
    out = actions_arg.write_trajectory_picture(picture, part.path, part.intrinsics,
                                               actions_arg._short(title or "camera"), keys=part.keys)
    if out is not None and not request.quiet:
        print(f"trajectory picture: {out}", flush=True)
    return out


@dataclass
class SaveState:
    """--save-state: the target and the size it will have (checked with the other outputs before the run)."""

    path: Path
    estimate: int
    written: Optional[Path] = None

    @classmethod
    def plan(cls, request: GenerateRequest, settings: FastSettings, cfg, latent_frames: int) -> Optional["SaveState"]:
        from ..loaders.fast_state_file import HEADER_RESERVE_BYTES, describe_size, kv_bytes

        if request.save_state is None:
            return None
        path = Path(request.save_state).expanduser()  # checked with every other output (cli/fast_request.py)
        layout = settings.layout(latent_frames)
        tokens = min(layout.capacity, latent_frames * settings.frame_tokens)
        dtype = getattr(torch, settings.cache_dtype)
        kv = kv_bytes(tokens, cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype)
        lat_h, lat_w = settings.height // 8, settings.width // 8
        small = (4 * lat_h * lat_w * (16 * latent_frames + 20 * 32) + cfg.text_len * cfg.text_dim * 4
                 + HEADER_RESERVE_BYTES)
        out = cls(path, kv + small)
        if not request.quiet:
            print(f"state: {path} will hold {describe_size(out.estimate)} (the K/V cache: {tokens} tokens x "
                  f"{cfg.num_layers} layers in {settings.cache_dtype}, {describe_size(kv)})", flush=True)
        return out

    def write(self, state, placement) -> Path:
        from ..loaders.fast_state_file import save_state
        from ..memory.kv_park import placement_layers

        self.written = save_state(self.path, state, placement_layers(placement, state.kv_local_end))
        return self.written

    def report(self) -> None:
        from ..loaders.fast_state_file import describe_size

        if self.written is not None:
            print(f"saved the state: {self.written} ({describe_size(self.written.stat().st_size)}); continue with "
                  f"--continue-from {self.written} --actions KEYS", flush=True)


# ---- files, plan, load -------------------------------------------------------------------------------------------
def warn_base_only_flags(request: GenerateRequest) -> None:
    """The base model's own flags are refused before this (cli/flag_checks.BASE_ONLY); --shift applies but warns."""
    if request.shift != 10.0:
        log.warning("--shift %.3g: the Fast model was distilled at shift 10; other values change its timesteps",
                    request.shift)


def fast_files(request: GenerateRequest, device, imports=None):
    """The Fast model and the T5 / VAE / tokenizer from --demo, --ckpt-dir or the file flags (for --weights fp8 /
    int8 its FP8 / INT8 copy, refused in one line first where the GPU cannot run it)."""
    from ..loaders.demo_checkpoint import demo_fast_ready
    from ..world.files import FastFiles

    if request.weights in LOWP_WEIGHTS:
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(request.weights, device)
    if request.demo:
        if imports is not None and not demo_fast_ready(request.demo_dir, weights=request.weights):
            imports.wait()  # building it quantizes with bitsandbytes: not beside the background import
        files = FastFiles.demo(request.demo_dir, weights=request.weights)
    elif request.ckpt_dir is not None:
        files = FastFiles.find(request.ckpt_dir, request.fast_model, weights=request.weights)
    else:
        missing = [f"--{n.replace('_', '-')}" for n in ("fast_model", "t5", "vae") if getattr(request, n) is None]
        if missing:
            raise UsageError(f"give --ckpt-dir (or --demo), or {' '.join(missing)}")
        return FastFiles(Path("."), request.fast_model, request.t5, request.vae, request.tokenizer)
    return replace(files, **{n: getattr(request, attr) for n, attr in (("fast", "fast_model"), ("t5", "t5"),
                                                                        ("vae", "vae"), ("tokenizer", "tokenizer"))
                             if getattr(request, attr) is not None})


def memory_plan(request: GenerateRequest, cfg, settings: FastSettings, latent_frames: int, device, with_camera: bool, files,
                seq_parallel: int = 1, speed=None, tiny=None):
    """The memory plan of a video of `latent_frames` (the World session's layout for it) and whether the VAE
    streams chunk by chunk beside the model (--stream-decode). speed: the run's SpeedPlan (the levers the plan counts:
    speed.levers.plan_levers). tiny: the --tiny-vae decoder (it always streams, at its own size)."""
    from ..memory.kv_placement import FastMemoryError
    from ..speed.levers import plan_levers
    from ..world.opening import tiny_bytes
    from ..world.plan import plan_world_memory, session_layout

    layout = session_layout(settings, latent_frames)
    try:
        plan, stream = plan_world_memory(cfg, layout, device, settings.height, settings.width, weights=request.weights,
                                         kv_cache=request.kv_cache, kv_layers_on_gpu=request.kv_layers_on_gpu,
                                         with_camera=with_camera,
                                         stream_decode="on" if tiny is not None else request.stream_decode,
                                         vae_cfg=files.vae_config(), seq_parallel=seq_parallel,
                                         decode_bytes=tiny_bytes(tiny, settings.height, settings.width),
                                         **plan_levers(speed))
    except FastMemoryError as e:
        raise UsageError(str(e)) from None
    if not plan.fits:
        log.warning("the plan may not fit in VRAM: %s", plan.reason)
    return plan, stream


def tiny_decoder(request: GenerateRequest, device):
    """The --tiny-vae decoder on the device (None without the flag); a bad file is refused in one line."""
    if request.tiny_vae is None:
        return None
    from ..loaders.tiny_vae_files import TinyVAEFileError
    from ..world.opening import load_tiny

    try:
        return load_tiny(request.tiny_vae, device)
    except (TinyVAEFileError, FileNotFoundError) as e:
        raise UsageError(f"--tiny-vae: {e}") from None


def check_tiny_vae(path) -> None:
    """--tiny-vae's file read and checked (a few MB) without building the decoder; one line naming the flag."""
    from ..loaders.tiny_vae_files import TinyVAEFileError, check_tiny_decoder_file

    try:
        check_tiny_decoder_file(path)
    except (TinyVAEFileError, FileNotFoundError) as e:
        raise UsageError(f"--tiny-vae: {e}") from None


def model_load(weights: str, files, placement, device, imports=None, loras=()):
    """The Fast model's load (--weights `weights`) as a ModelLoad (cli/model_load.py): run in turn, or started on a
    thread beside the image's VAE encode. It waits for the background imports first (the model needs bitsandbytes); the LoRAs go on
    right after it."""
    from ..world.plan import compute_dtype
    from .model_load import ModelLoad

    def load(progress):
        model = placement.load_model(files.fast, weights, progress=progress)
        if loras:
            from ..loaders.lora_apply import put_loras

            put_loras(model, loras, dtype=compute_dtype(weights, device), device=device, name=files.fast.name)
        return model

    return ModelLoad(load, device, before=imports.wait if imports is not None else None)


def read_fast_loras(loras: LoraFlags, cfg) -> list:
    """--lora FILE[:STRENGTH] on the Fast model (read and matched before anything loads); --lora-high/-low are
    the base model's two experts."""
    for flag in ("lora_high", "lora_low"):
        if getattr(loras, flag):
            raise UsageError(f"--{flag.replace('_', '-')}: the Fast model is one model; use --lora FILE[:STRENGTH]")
    if not loras.lora:
        return []
    from .lora_run import read_cli_loras

    return read_cli_loras(loras, cfg)["high"]


def default_name(prompt: str) -> Path:
    from .preflight import default_output_name

    p = default_output_name(prompt)
    return p.with_name(p.name.replace("lingbot_", "lingbot_fast_", 1))


# ---- running a part ----------------------------------------------------------------------------------------------
def run_part(world, part: PartPlan, source: CameraSource, frames, *, fps: int, quiet: bool, target, stats,
             stream: bool, on_done: Optional[Callable] = None, keep_cache: bool = True, label: str = "") -> tuple:
    """A part through the World session with the CLI's progress line and (streaming, at `fps`) video writer; returns
    (latent, written path or None when the video is decoded afterwards). Ctrl-C keeps the frames decoded so far."""
    from ..wan.sampling.fast_sampler import STEP_INDICES
    from ..wan.sampling.sampler import Cancelled
    from .progress import ProgressLine
    from .video_out import VideoWriter

    writer: Optional[VideoWriter] = VideoWriter(target, fps) if stream else None
    bar = ProgressLine(part.chunks * len(STEP_INDICES), enabled=not quiet)
    done = [0]  # chunks whose steps are all done

    def progress(info):
        done[0] = (info.index + 1) // len(STEP_INDICES)
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

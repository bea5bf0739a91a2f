"""What the Fast model's first part and its continuations share in the CLI: the flags read into settings, files,
the part's control, the state target, the memory plan, and running a part through the World session with the
CLI's progress line, streaming video writer and Ctrl-C handling."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from ..wan.sampling.fast_state import CameraSource, FastSettings, PartPlan
from .errors import UsageError
from .generate_request import GenerateRequest
from .lora_run import LoraFlags

if TYPE_CHECKING:
    from ..world.settings import ModelSource, WorldSettings

log = logging.getLogger("lingbot_world.generate")

FILE_FRAMES = 81  # key files without --frames: the first 81 frames, as the release reads keys[:frame_num]


# ---- flags -> the world's typed settings ------------------------------------------------------------------------
def model_source(request: GenerateRequest) -> "ModelSource":
    """Which causal model and where its files are: --model, --demo / --ckpt-dir / the file flags."""
    from ..world.settings import ModelSource

    return ModelSource(model=request.model, ckpt_dir=request.ckpt_dir, demo=bool(request.demo),
                       demo_dir=request.demo_dir, dit=request.fast_model, t5=request.t5, vae=request.vae,
                       tokenizer=request.tokenizer, assets_dir=request.assets_dir)


def world_settings(request: GenerateRequest, speed=None, loras: Sequence = ()) -> "WorldSettings":
    """The world's settings from the flags (--window / --sink left out: the model's defaults)."""
    from ..world.settings import MODEL_DEFAULT, WorldSettings

    window = MODEL_DEFAULT if request.window is None else (request.window or None)  # --window 0: the whole video
    return WorldSettings(size=request.size, seed=request.seed, noise=request.noise, rule=request.rule, window=window,
                         sink=MODEL_DEFAULT if request.sink is None else request.sink,
                         max_attention=request.max_attention, precision=request.camera_precision,
                         weights=request.weights, kv_cache=request.kv_cache, kv_layers_on_gpu=request.kv_layers_on_gpu,
                         vae_tiled=bool(request.vae_tiled), tiny_vae=request.tiny_vae, loras=tuple(loras),
                         text=request.text, speed=speed, stream_decode=request.stream_decode)


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


def check_tiny_vae(path) -> None:
    """--tiny-vae's file read and checked (a few MB) without building the decoder; one line naming the flag."""
    from ..loaders.tiny_vae_files import TinyVAEFileError, check_tiny_decoder_file

    try:
        check_tiny_decoder_file(path)
    except (TinyVAEFileError, FileNotFoundError) as e:
        raise UsageError(f"--tiny-vae: {e}") from None


def fast_lora_specs(loras: LoraFlags) -> tuple:
    """--lora FILE[:STRENGTH] on a causal model as (path, strength, flag) items (read and matched by the world's
    checks); --lora-high/-low are the base model's two experts."""
    from .lora_run import parse_spec

    for flag in ("lora_high", "lora_low"):
        if getattr(loras, flag):
            raise UsageError(f"--{flag.replace('_', '-')}: the Fast model is one model; use --lora FILE[:STRENGTH]")
    return tuple((*parse_spec(spec, "--lora"), f"--lora {spec}") for spec in loras.lora)

def default_name(prompt: str) -> Path:
    from .preflight import default_output_name

    p = default_output_name(prompt)
    return p.with_name(p.name.replace("lingbot_", "lingbot_fast_", 1))


# ---- running a part ----------------------------------------------------------------------------------------------
def run_part(world, part: PartPlan, source: CameraSource, frames, *, fps: int, quiet: bool, target, stats,
             stream: bool, on_done: Optional[Callable] = None, keep_cache: bool = True, label: str = "") -> tuple:
    """A part through the World session with the CLI's progress line and (streaming, at `fps`) video writer; returns
    (latent, written path or None when the video is decoded afterwards). Ctrl-C keeps the frames decoded so far."""
    from ..wan.sampling.sampler import Cancelled
    from .progress import ProgressLine
    from .video_out import VideoWriter

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

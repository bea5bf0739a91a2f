"""`generate --model fast` with keys, and continuing a Fast video from a saved state.

- `--actions` (action string or key files) steers the Fast model like the Cam model: the keys are walked into a
  camera path (act-to-camera), resampled at the chunk-rounded latent frames.
- `--save-state PATH` writes the video's state after the run (loaders/fast_state_file.py: the K/V cache, the
  generator, the camera, ...); its size is printed before the run starts.
- `--continue-from PATH` continues such a video with new keys (`--actions`), a new camera (`--camera`) or neither
  (the camera stands still), `--frames` new frames (12 per chunk; default: as long as the keys); it writes the new
  part's video (`--out`), optionally the whole video so far (`--whole-video`), and with `--save-state` the state
  after it (the same path may be given to both). Everything a state fixes (the size, the seed's generator, the
  cache rules, the model) comes from the state; a state from another model, weights mode or device kind is
  refused before anything loads.
- `--rule reference|continuable` (wan/sampling/fast_state.py): how the first part is made.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..wan.sampling.fast_state import FAST_MODES, CameraSource, FastSettings, PartPlan
from .errors import UsageError

log = logging.getLogger("lingbot_world.generate")

FILE_FRAMES = 81  # key files without --frames: the first 81 frames, as the release reads keys[:frame_num]


def add_arguments(g) -> None:
    g.add_argument("--rule", choices=FAST_MODES, default="reference",
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


def settings_for(args, fmt, device, height: int, width: int, seed: int, noise: str, mode: Optional[str] = None,
                 window=None, sink=None, max_attention=None, precision=None) -> FastSettings:
    """The settings of a Fast video started (or continued) by these flags."""
    from ..loaders.fast_state_file import model_fingerprint, model_label
    from ..quant.nf4_format import default_compute_dtype

    dtype = torch.bfloat16 if args.weights == "bf16" else default_compute_dtype(device)
    keep = args.save_state is not None or args.continue_from is not None
    return FastSettings(
        height, width, int(seed), noise, mode or args.rule,
        window=args.window if window is None else window, sink=args.sink if sink is None else sink,
        max_attention=args.max_attention if max_attention is None else max_attention,
        precision=precision or args.camera_precision, weights=args.weights,
        cache_dtype=str(dtype).replace("torch.", ""), model=model_fingerprint(fmt) if keep else "",
        model_label=model_label(fmt), vae_tiled=bool(args.vae_tiled))


def camera_source(args, frames: Optional[int], continuation: bool = False) -> CameraSource:
    """What steers the part: --actions (keys), --camera (trajectory folder or preset) or nothing."""
    from ..loaders.action_files import read_key_source
    from .preflight import camera_path

    if args.actions:
        src = read_key_source(args.actions)
        if frames is None and src.from_file and not continuation:
            args.frames = FILE_FRAMES  # key files are cut to the video (the release reads keys[:frame_num])
        return CameraSource(keys=src.keys, intrinsics=src.intrinsics, label=src.label, from_file=src.from_file)
    if args.camera:
        want = (frames or 12) + 1 if continuation else (frames or FILE_FRAMES)
        path, zoom = camera_path(args.camera, max(want, 2), args.camera_speed)
        return CameraSource(poses=path.poses, intrinsics=path.intrinsics,
                            per_frame_intrinsics=bool(args.per_frame_intrinsics or zoom), label=str(args.camera))
    return CameraSource()


def write_picture(args, part: PartPlan, source: CameraSource, target: Path) -> Optional[Path]:
    """--trajectory-picture: the part's camera path, with its key timeline for keys."""
    from . import actions_arg

    if args.trajectory_picture is None:
        return None
    if part.path is None:
        log.warning("--trajectory-picture: this part has no camera; no picture written")
        return None
    if args.out is None:
        args.out = target
    title = f"{source.label}: {part.keys.to_string()}" if part.keys is not None and not source.from_file else source.label
    out = actions_arg.write_trajectory_picture(args, part.path, part.intrinsics, actions_arg._short(title or "camera"),
                                               keys=part.keys)
    if out is not None and not args.quiet:
        print(f"trajectory picture: {out}", flush=True)
    return out


@dataclass
class SaveState:
    """--save-state: the target, checked before the run, and the size it will have."""

    path: Path
    estimate: int
    written: Optional[Path] = None

    @classmethod
    def plan(cls, args, settings: FastSettings, cfg, latent_frames: int) -> Optional["SaveState"]:
        from ..loaders.fast_state_file import describe_size, kv_bytes

        if args.save_state is None:
            return None
        path = Path(args.save_state).expanduser()
        if path.is_dir():
            raise UsageError(f"--save-state {path} is a folder; give a file name, e.g. {path / 'video.state'}")
        if not path.parent.is_dir():
            raise UsageError(f"--save-state {path}: the folder {path.parent} does not exist")
        layout = settings.layout(latent_frames)
        tokens = min(layout.capacity, latent_frames * settings.frame_tokens)
        dtype = getattr(torch, settings.cache_dtype)
        kv = kv_bytes(tokens, cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype)
        lat_h, lat_w = settings.height // 8, settings.width // 8
        small = 4 * lat_h * lat_w * (16 * latent_frames + 20 * 32) + cfg.text_len * cfg.text_dim * 4
        out = cls(path, kv + small)
        if not args.quiet:
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


def run(args) -> int:
    """generate --model fast --continue-from PATH."""
    from ..loaders.demo_checkpoint import demo_vae_config
    from ..loaders.expert_format import check_model_kind, detect_format
    from ..loaders.expert_loader import check_expert_keys
    from ..loaders.fast_state_file import StateFile
    from ..loaders.vae_files import load_vae
    from ..text_encoder.encode import encode_prompts
    from ..wan.dit.model import pad_context
    from ..wan.sampling.fast_state import finish_part, next_layout, plan_next_part, start_part
    from ..wan.vae.streaming import decode_part
    from ..memory.kv_placement import FastPlacement
    from .fast_run import _fast_files, _model_load, _plan, _sample, _warn_base_only_flags
    from .generate import _empty_cache
    from .preflight import resolve_device
    from .progress import RunStats
    from .speed_flags import fast_compile_policy, log_speed_plan, report_compile, speed_plan
    from .video_out import plan_output, write_video

    stats = RunStats()
    if args.demo and args.device == "auto":
        args.device = "cpu"  # the demo's default
    _warn_base_only_flags(args)
    sf = StateFile(args.continue_from)  # format, version, damage: refused here, before anything loads
    state = sf.state
    st = state.settings
    _refuse_other_settings(args, st)
    device = resolve_device(args.device)
    if st.noise_source == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{sf.path} continues the reference's CUDA generator; run it on a CUDA GPU")
    speed = speed_plan(args, device)
    files = _fast_files(args)
    fmt = detect_format(files.fast)
    note = check_model_kind(fmt, "fast")
    if note:
        log.warning("%s", note)
    check_expert_keys(fmt, args.weights)
    cfg = fmt.config
    here = settings_for(args, fmt, device, st.height, st.width, st.seed, st.noise_source, st.mode, st.window,
                        st.sink, st.max_attention, st.precision)
    st.check_continue(here, str(sf.path))
    sf.check_model(cfg.num_layers, cfg.num_heads, cfg.head_dim, getattr(torch, here.cache_dtype))
    if state.condition is None:
        raise UsageError(f"{sf.path} has no conditioning for later frames; it cannot be continued")

    source = camera_source(args, args.frames, continuation=True)
    part = plan_next_part(state, source, args.frames)
    if part.note:
        log.warning("frames: %s", part.note)
    index = len(state.parts) + 1
    target = plan_output(args.out if args.out is not None else Path(f"{sf.path.stem}_part{index}.mp4"))
    whole_target = plan_output(args.whole_video) if args.whole_video is not None else None
    write_picture(args, part, source, target)
    layout = next_layout(state, part)
    if layout.note:
        log.warning("K/V cache: %s", layout.note)
    total_lat = state.latent_frames + part.latent_frames
    control = source.label or ("none (the camera stands still)" if state.has_camera else "none")
    print(f"continuing {sf.path} ({sf.file_bytes / 1e9:.2f} GB): {state.frames} frames so far ({state.chunks} chunks), "
          f"+ {part.frames} frames ({part.chunks} chunks), camera: {control}", flush=True)
    save = SaveState.plan(args, st, cfg, total_lat)
    speed = fast_compile_policy(speed, args, part.chunks)
    log_speed_plan(speed, log)

    plan, stream_vae = _plan(args, cfg, layout, device, st.height, st.width, part.camera is not None, files)
    log.info("memory plan: %s", plan.reason)
    stats.mark("setup")

    prompt, context = state.prompt, state.context
    if args.prompt is not None and args.prompt != state.prompt:
        prompt = args.prompt
        context = encode_prompts(files.t5, files.tokenizer, [prompt], device=args.t5_device, cache_dir=args.cache_dir,
                                 use_cache=not args.no_text_cache, timeout=args.t5_timeout)[0]
        log.info("new prompt from this part on: %s", prompt)
    stats.mark("text")

    vae = load_vae(files.vae, device, config=demo_vae_config(files.root))
    if not stream_vae:
        vae.to("cpu")
    y = state.condition.frames(state.latent_frames, part.latent_frames)
    z_before = state.latent()

    def make_run(model, cache, **kw):
        return start_part(model, part, st, y, pad_context([context], model.cfg.text_len).to(device), cache, state,
                          device=device, final_context=save is not None, **kw)

    def after(run, placement):
        if save is not None:
            save.write(finish_part(run, part, st, state, context=context, prompt=prompt, label=control), placement)

    placement = FastPlacement(plan, device, log.info)
    try:
        latent, written = _sample(args, placement, _model_load(args, files, placement, device, speed), device,
                                  make_run, vae if stream_vae else None, target, stats, speed, restore=sf,
                                  z_before=z_before if stream_vae else None, after=after, keep_cache=save is not None)
    finally:
        placement.close()
    report_compile(speed, log)
    if written is None or whole_target is not None:
        vae.to(device)
    if written is None:
        with torch.inference_mode():
            video = decode_part(vae, z_before.to(device), latent, tiled=args.vae_tiled)[0]
        written = write_video(video, target, args.fps)
        del video
        stats.mark("vae_decode")
    whole = None
    if whole_target is not None:
        with torch.inference_mode():
            video = vae.decode(torch.cat([z_before.to(device), latent.to(device)], dim=2), tiled=args.vae_tiled)[0]
        whole = write_video(video, whole_target, args.fps)
        del video
        stats.mark("whole video")
    del vae
    _empty_cache(device)
    print(f"Fast model: continued with {part.frames} frames ({state.frames + part.frames} so far)")
    if whole is not None:
        print(f"the whole video so far: {whole}")
    if save is not None:
        save.report()
    print(stats.summary(written, seed=st.seed, device=device))
    return 0


def _refuse_other_settings(args, st: FastSettings) -> None:
    """Flags that a continuation takes from the state: a different value is refused (cache rules) or ignored."""
    for flag, given, saved in (("--window", args.window, st.window), ("--max-attention", args.max_attention,
                                                                       st.max_attention)):
        if given is not None and given != saved:
            raise UsageError(f"{flag} {given}: the video was started with {flag} {saved}; a continuation keeps "
                             "the cache rules it was started with (leave the flag out)")
    if args.sink and args.sink != st.sink:
        raise UsageError(f"--sink {args.sink}: the video was started with --sink {st.sink}; leave the flag out")
    ignored = [f for f, on in (("--image", args.image is not None), ("--size", args.size not in ("480*832", "64*112")),
                               ("--rule", args.rule != "reference"), ("--seed", args.seed != 42)) if on]
    if ignored:
        log.warning("a continuation takes the size, the generator and the rule from the state; ignoring %s",
                    ", ".join(ignored))

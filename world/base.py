"""The one assembly of a base world: the two v1 experts (Cam or Act, told from their weights), flow-UniPC over them
with classifier-free guidance.

    world   = BaseWorld(source, settings, video, ranks)   # video: a VideoRequest (image, prompt, steering, device)
    world.check()      # the image, the checkpoint's files (headers, sizes, keys; the demo is built first), the model's
                       # kind and default steps, the LoRAs, the video's size and its memory floor
    control = world.control()   # the camera path or keys -> the packed control tensor (and the path to draw)
    world.join()       # the ranks' layout and the check that they load the same files
    latent  = world.sample(stages, progress)  # text (a child process, beside the image's VAE encode where it
                                               # fits), the experts placed by the memory plan, the sampler
    video   = world.decode(latent)             # [3, F, H, W] in [-1, 1], on rank 0

Everything that can be checked in seconds is checked before anything that takes minutes; each problem is one
ValueError / FileNotFoundError line naming the file or value and what to use. A door translates its input into
the typed settings (world/settings.py), runs these steps in order with its own checks between them (the outputs
before `control`), and writes the video. `ranks`: a parallel.group.Session (Session.single() for one process).
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Callable, Optional

import torch

from . import controls
from .settings import BaseSettings, ModelSource, VideoRequest

log = logging.getLogger(__name__)

BASE_WEIGHTS = ("nf4", "bf16")  # the experts' weights: NF4 kept as is, or dequantized to bf16


def base_files(source: ModelSource):
    """The checkpoint's files (loaders/checkpoint_dir.CheckpointFiles): the demo's (built on first use), a checkpoint
    folder's, or the files named; files named beside a folder or the demo replace its own."""
    from ..loaders.checkpoint_dir import CheckpointFiles, find_checkpoint_files
    from ..loaders.demo_checkpoint import build_demo_checkpoint
    from .models import model

    if source.demo:
        files = build_demo_checkpoint(source.demo_dir, control=model(source.model or "v1-base-cam").control)
    elif source.ckpt_dir is not None:
        files = find_checkpoint_files(source.ckpt_dir)
    else:
        missing = ["--" + n for n in ("high", "low", "t5", "vae") if getattr(source, n) is None]
        if missing:
            raise FileNotFoundError(f"give --ckpt-dir (or --demo), or all of --high --low --t5 --vae (missing: "
                                    f"{' '.join(missing)})")
        return CheckpointFiles(Path("."), source.high, source.low, source.t5, source.vae, source.tokenizer)
    for n in ("high", "low", "t5", "vae", "tokenizer"):
        if getattr(source, n) is not None:
            setattr(files, n, getattr(source, n))
    return files


class BaseWorld:
    """One base video: its checks, its control, its sampling over the ranks and its decode (see the module)."""

    def __init__(self, source: ModelSource, settings: BaseSettings, video: VideoRequest, ranks,
                 log: logging.Logger = log):
        self.source = source
        self.settings = settings
        self.request = video
        self.ranks = ranks
        self.log = log
        self.device = None
        self.files = self.image = self.vae_config = self.config = self.camera = self.vae = None
        self.kind, self.steps, self.loras = "camera", 0, {"high": [], "low": []}
        self.height = self.width = self.frames = 0
        self.camera_note: Optional[str] = None
        self.seed: Optional[int] = None

    # ---- the pre-flight ----------------------------------------------------------------------------------------
    def check(self) -> None:
        """Everything but the control, before any work: the image, the files, the kind and steps, the LoRAs, the
        checkpoint's files, the size and frame count, and the video against the machine's total memory."""
        from ..loaders.checkpoint_check import check_checkpoint
        from ..loaders.demo_checkpoint import demo_vae_config
        from ..memory.bounds import check_video_fits
        from ..wan.sizes import check_frames, max_area_for, target_size
        from .assembly import compute_device, load_start_image
        from .experts import read_expert_loras

        s, log = self.settings, self.log
        self.device = compute_device(self.request.device)
        self.image = load_start_image(self.request.image)
        files = self.files = base_files(self.source)
        # Cam or Act, from the weights (refuses mismatches), and the kind's default steps
        self.kind, self.steps = controls.base_kind(self.steering, s.steps, files.high, files.low, log)
        _warn_if_not_base(files, log)
        self.loras = read_expert_loras(s.loras, _expert_config(files.high))  # a bad LoRA stops here, before any work
        self.vae_config = demo_vae_config(files.root)
        self.config = check_checkpoint(files, self.vae_config).high.config
        self.height, self.width = target_size(self.image.shape[1], self.image.shape[2], max_area_for(s.size))
        self.frames = check_frames(self.steering.frames or controls.DEFAULT_FRAMES)
        check_video_fits(self.frames, self.height, self.width, self.config, total_ram=_total_ram(),
                         total_vram=_total_vram(self.device),
                         camera=bool(self.steering.camera or self.steering.actions),
                         what=f"--frames {self.frames} --size {s.size}")

    def control(self) -> controls.BaseControl:
        """The control input for the video's size (the camera path or keys; none without either); the frames become
        those the control covers."""
        control = controls.base_control(self.steering, self.settings.precision, self.kind, self.frames, self.height,
                                        self.width, self.log)
        self.camera, self.camera_note, self.frames = control.tensor, control.note, control.frames
        return control

    @property
    def steering(self):
        return self.request.steering

    @property
    def num_heads(self) -> int:
        """The experts' attention heads (how far a sequence split can go)."""
        return self.config.num_heads

    def join(self) -> None:
        """After the pre-flight (every rank): the layout over the ranks, and the check that every rank loads the
        same experts and LoRAs; then the video in the log."""
        from ..parallel.ranks import check_same_models, set_layout
        from ..wan.sizes import latent_size

        s, files, log = self.settings, self.files, self.log
        set_layout(self.ranks, self.request.parallel, self.num_heads, "base", s.guidance, log)
        check_same_models(self.ranks, {"high-noise expert": files.high, "low-noise expert": files.low}, log,
                          [(lora.flag, Path(lora.path).expanduser(), lora.strength) for lora in s.loras])
        if self.camera_note:
            log.warning("camera: %s", self.camera_note)
        lat_h, lat_w = latent_size(self.height, self.width)
        log.info("size %dx%d, %d frames (latent %dx%d x %d), camera: %s", self.height, self.width, self.frames, lat_h,
                 lat_w, (self.frames - 1) // 4 + 1, self.steering.camera or "none")

    # ---- the run -----------------------------------------------------------------------------------------------
    def sample(self, stages, progress: Callable[[int], object]) -> torch.Tensor:
        """The latent video: the prompts' embeddings (a child process, or the cache; rank 0 for every rank) beside
        the image's VAE encode where both fit, then the experts as the memory plan places them and the sampler.
        stages: mark(name) / note(name, seconds) at each stage (the door's summary); progress(total) -> an object
        with update(StepInfo) and close() (the door's progress line)."""
        from ..loaders.vae_files import load_vae
        from ..parallel.ranks import (agree_on_plans, check_same_inputs, planned_cfg_mode, sampling_cfg_mode,
                                      velocity as rank_velocity)
        from ..speed.plans import report_compile
        from ..wan.dit.model import pad_context
        from ..wan.i2v import build_i2v_condition
        from ..wan.sampling.sampler import SamplingSettings, make_noise, sample
        from ..wan.sizes import latent_size
        from ..wan.text.prompts import DEFAULT_NEGATIVE_PROMPT
        from ..wan.vae.model import VAEConfig
        from . import text_stage
        from .experts import camera_cache, expert_provider, lora_loader

        s, files, device, ranks, log = self.settings, self.files, self.device, self.ranks, self.log
        height, width, frames, camera = self.height, self.width, self.frames, self.camera
        # Text: child process (or the cache); nothing of T5 stays in this process. Several ranks: rank 0 encodes.
        # The image's VAE encode runs beside the encoder when both fit in VRAM; the experts load after it.
        negative = s.negative_prompt if s.negative_prompt else DEFAULT_NEGATIVE_PROMPT
        vae_step = text_stage.vae_encode_step(self.vae_config or VAEConfig(), height, width, frames, s.vae_tiled,
                                              keeps_vae=False)
        text = text_stage.start(s.text, files, [self.request.prompt, negative], device, [vae_step], ranks, log)
        if not text.background:
            stages.mark("text")

        def encode_image():  # I2V conditioning on the compute device; the VAE leaves the GPU while the experts run
            self.vae = load_vae(files.vae, device, config=self.vae_config)
            with torch.inference_mode():
                cond = build_i2v_condition(self.vae, self.image, height, width, frames, tiled=s.vae_tiled)
            self.vae.to("cpu")
            _empty_cache(device)
            return [cond]

        try:
            text.before(text_stage.ENCODE_STEP)
            (y,) = ranks.from_main(encode_image, "the first frame's encoding")  # rank 0 only when there are several
            stages.mark("vae_encode")
            pos, neg = text.embeddings()
            if text.background:
                stages.mark("waiting for the text encoder")
        finally:
            text.stop()

        settings = SamplingSettings(steps=self.steps, shift=s.shift, boundary=s.boundary, solver=s.solver,
                                    cfg_mode=s.cfg_mode, guide_low=s.guide_scale[0], guide_high=s.guide_scale[-1])
        self.seed = ranks.same_value(s.seed if s.seed >= 0 else random.randrange(2**31), "the seed")
        lat_h, lat_w = latent_size(height, width)
        noise = make_noise((1, 16, y.shape[2], lat_h, lat_w), self.seed, s.noise, device=device)
        velocity = rank_velocity(ranks)
        cfg_mode = planned_cfg_mode(s.cfg_mode, ranks.parallel, velocity is not None, log)
        check_same_inputs(ranks, {"noise": noise, "conditioning": y, "text": pos, "negative text": neg,
                                  "camera": camera})
        provider = expert_provider(s, files, device, (frames, height, width), camera is not None, ranks, cfg_mode,
                                   lora_loader(self.loras, {"high": files.high, "low": files.low}), log)
        batch = agree_on_plans(ranks, provider.plan.reason, provider.plan.cfg_batch, log)
        settings.cfg_mode = sampling_cfg_mode(cfg_mode, ranks.parallel, velocity is not None, provider.plan.cfg_mode,
                                              batch)
        film = camera_cache(s, self.config, device, (frames, height, width), camera is not None and velocity is None,
                            settings.steps, settings.cfg_mode, provider.plan, ranks, log)
        bar = progress(settings.steps)
        try:
            with torch.inference_mode():
                latent = sample(
                    provider, noise, pad_context([pos], 512).to(device), pad_context([neg], 512).to(device), y,
                    camera, settings, device=device, callback=bar.update, velocity=velocity, camera_cache=film,
                )
        finally:
            if film is not None:
                film.close()
            bar.close()
            close = getattr(provider, "close", None)
            if close is not None:
                close()
            del provider
            _empty_cache(device)
        stages.mark("sampling")
        if s.speed is not None:
            report_compile(s.speed, log)
        return latent

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """The video [3, F, H, W] in [-1, 1] (rank 0: it encoded the image and holds the VAE)."""
        from ..speed.vae_norm import decoder_norm_silu
        from .decoding import plan_decode

        vae, self.vae = self.vae, None
        vae.to(self.device)
        with torch.inference_mode():
            return plan_decode(self.device, self.settings.speed, lambda: vae.decode(
                latent, tiled=self.settings.vae_tiled, norm_silu=decoder_norm_silu(self.device))[0])


def _expert_config(path):
    from ..memory.placement import read_expert_config

    return read_expert_config(path)


def _warn_if_not_base(files, log) -> None:
    """The base path's note when a high/low-noise expert is the Fast model (headers only)."""
    from ..loaders.expert_format import check_model_kind, detect_format

    for path in (files.high, files.low):
        note = check_model_kind(detect_format(path), "base")
        if note:
            log.warning("%s", note)


def _total_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _total_vram(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).total_memory)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

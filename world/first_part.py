"""A causal model's first part of a video opened from files with the start-up overlap (the CLI's way): the world
assembly (world/assembly.py) with bitsandbytes' import, the text encoder, the image's VAE encode and the model's
load side by side where memory allows (world/heavy_imports.py, world/text_stage.py, world/model_load.py), then the
World session (world/session.py).

    video = FirstPart(source, settings, request, ranks, imports=..., stages=...)   # request: a VideoRequest
    video.check()           # the weights mode, the files (headers, every tensor, LoRAs, the tiny decoder), the image,
                            # the size and the video against the RAM
    video.plan()            # the part (chunks, frames, camera), the speed plan, the video's fixed settings
    video.describe()        # the model and the part's note, in the log
    video.place()           # the layout over the ranks and the memory plan; the ranks' checks end here
    session = video.start() # text, image and model; the session begun, ready for run_part
    ...
    video.finish(); video.close()   # (close in a finally)

Every check that can fail runs before the text encoder starts; a door checks its outputs between `plan` and
`describe`. `stages`: mark(name) / note(name, seconds) at each stage (the door's summary).
"""
from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Optional

import torch

from . import assembly, controls
from .settings import ModelSource, VideoRequest, WorldSettings

log = logging.getLogger(__name__)

LOAD_STEP = "the model's load"  # the start-up step the text encoder may run beside
# Host bytes per pixel per frame a causal run holds for the whole part, at least: the packed camera input (384 fp32
# channels per 4 frames x 8x8 pixels: 6), the latents and the conditioning (~1); a video decoded at the end
# (stream decode off) holds the decoded frames and their uint8 copy too (27).
CAMERA_BYTES_PER_PIXEL_FRAME = 6
LATENT_BYTES_PER_PIXEL_FRAME = 1
DECODED_BYTES_PER_PIXEL_FRAME = 27


class FirstPart:
    """The first part of a causal video (see the module), as `request` (a VideoRequest) asks: its image, prompt and
    steering, device, layout over the ranks and speed flags. request.save_to: where the video's state goes after the
    part, to continue it (None: it is not saved); then the model's files are fingerprinted and the whole conditioning
    track is encoded."""

    def __init__(self, source: ModelSource, settings: WorldSettings, request: VideoRequest, ranks, *, imports=None,
                 stages=None, log: logging.Logger = log):
        self.source = source
        self.settings = settings
        self.request = request
        self.ranks = ranks
        self.imports = imports
        self.stages = stages
        self.log = log
        self.device = None
        self.files = self.checked = self.image = self.part = self.camera = self.video = self.speed = None
        self.height = self.width = self.seed = 0
        self.frames: Optional[int] = None  # asked for (None: as long as the keys / camera)
        self.plan_ = self.placement = self.vae = self.session = self._load = self._text = None
        self.stream_vae = self.keep_vae = False

    @property
    def keep(self) -> bool:
        return self.request.save_to is not None

    @property
    def steering(self):
        return self.request.steering

    @property
    def prompt(self) -> str:
        return self.request.prompt

    def _wait_imports(self) -> None:
        if self.imports is not None:
            self.imports.wait()

    @property
    def entry(self):
        return self.checked.entry

    @property
    def config(self):
        return self.checked.config

    # ---- the pre-flight ----------------------------------------------------------------------------------------
    def check(self) -> None:
        """The weights mode, the tiny decoder's file, the model's files and every check of them, the start image, the
        video's size and the RAM its per-frame tensors take."""
        from ..wan.sizes import max_area_for, target_size
        from .demos import demo_ready
        from .files import WorldFiles
        from .models import model

        s, source = self.settings, self.source
        self.device = assembly.compute_device(self.request.device)
        assembly.check_weights_mode(s.weights, self.device)
        if s.tiny_vae is not None:
            assembly.check_tiny_vae(s.tiny_vae, "--tiny-vae")  # one line, before the model's files
        if source.demo and not demo_ready(model(source.model), source.demo_dir, s.weights):
            self._wait_imports()  # building the demo quantizes with bitsandbytes: not beside the background import
        self.files = WorldFiles.find(source, s.weights)
        self.checked = assembly.check(self.files, s, self.device)  # missing or mis-shaped tensors, LoRAs, the decoder
        self.image = assembly.load_start_image(self.request.image)
        self.height, self.width = target_size(self.image.shape[1], self.image.shape[2], max_area_for(s.size))
        self._check_ram()

    def _check_ram(self, total_ram: Optional[int] = None) -> None:
        """Refuse a video whose per-frame tensors alone exceed this machine's RAM (instead of an allocation that
        fails after the model has loaded, or runs for minutes)."""
        from .base import _total_ram

        st, s = self.steering, self.settings
        frames = controls.requested_frames(st.actions, st.frames)
        per_pixel = LATENT_BYTES_PER_PIXEL_FRAME
        if st.camera or st.actions:
            per_pixel += CAMERA_BYTES_PER_PIXEL_FRAME
        if s.stream_decode == "off":
            per_pixel += DECODED_BYTES_PER_PIXEL_FRAME
        need = frames * self.height * self.width * per_pixel
        total = _total_ram() if total_ram is None else total_ram
        if need > total:
            raise ValueError(f"--frames {frames} at {self.width}x{self.height} needs at least {need / 2**30:.1f} GiB "
                             f"of RAM ({per_pixel} bytes per pixel per frame for the camera input and the latents"
                             + (" and the frames decoded at the end" if per_pixel > 7 else "")
                             + f"), more than this machine's {total / 2**30:.1f} GiB; use fewer frames or a smaller "
                             "size")

    def plan(self):
        """The part (PartPlan: chunks, frames, camera) from the steering; the speed plan for its length (an impossible
        compile / compute / attention choice refused before loading; a compiler check waits for the imports), and
        the video's fixed settings with the preset's window cap."""
        from ..speed.plans import fast_speed_plan, log_speed_plan
        from ..wan.sampling.fast_parts import plan_first_part

        s, checked, device = self.settings, self.checked, self.device
        self.seed = s.seed if s.seed >= 0 else random.randrange(2**31)
        probe = assembly.video_settings(checked, s, device, self.height, self.width, keep=False, seed=self.seed)
        # key files: 81 frames without a frame count
        self.camera, self.frames = controls.camera_source(self.steering, self.steering.frames)
        self.part = part = plan_first_part(self.camera, self.frames, probe)
        self.speed = fast_speed_plan(self.request.speed, device, part.chunks, before_compiler_check=self._wait_imports)
        self.speed = assembly.fit_speed(checked, self.speed)  # a narrow model runs --compile auto eagerly
        log_speed_plan(self.speed, self.log)
        self.settings = s = replace(s, speed=self.speed)
        self.video = assembly.video_settings(checked, s, device, self.height, self.width, keep=self.keep,
                                             seed=self.seed, latent_frames=part.latent_frames)  # the window cap
        return part

    def state_target(self):
        """Where the video's state goes after the part, with the size it will have (world/saving.py); None when it
        is not saved."""
        from .saving import StateTarget

        if self.request.save_to is None:
            return None
        return StateTarget.plan(self.request.save_to, self.video, self.config, self.part.latent_frames)

    def describe(self) -> None:
        """The model and the part's frame note, in the log (after the checks: a refusal is the run's one line)."""
        self.log.info("model: %s", self.entry.describe())
        if self.part.note:
            self.log.warning("frames: %s", self.part.note)

    @property
    def control(self) -> str:
        return controls.control_label(self.camera)

    def picture(self):
        """The path the part follows, to draw (None: the part has no camera)."""
        return controls.part_picture(self.part, self.camera)

    def place(self) -> None:
        """The layout over the ranks and the memory plan (nothing fits: one line); the ranks' checks end here, then
        every rank takes the layout, logs its plan on rank 0 and checks that every rank loads the same model."""
        from ..memory.fast_plan import FastMemoryError
        from ..parallel.ranks import agree_on_plans, check_same_models, plan, use
        from .errors import WorldError

        s, ranks, log = self.settings, self.ranks, self.log
        split = plan(ranks, self.request.parallel, self.config.num_heads, "fast", False, log)
        try:
            self.plan_, self.stream_vae = assembly.plan_memory(
                self.checked, self.video, self.device, s, latent_frames=self.part.latent_frames,
                with_camera=self.part.camera is not None, seq_parallel=split.ulysses)
        except FastMemoryError as e:
            raise WorldError(str(e)) from None
        if not self.plan_.fits:
            log.warning("the plan may not fit in VRAM: %s", self.plan_.reason)
        # the VAE's decoder streams (a tiny decoder needs the VAE to encode only)
        self.keep_vae = self.stream_vae and self.checked.tiny is None
        ranks.end_checks()
        use(ranks, split, log)
        agree_on_plans(ranks, self.plan_.reason, False, log)
        check_same_models(ranks, {"Fast model": self.files.dit}, log)

    # ---- the start-up ------------------------------------------------------------------------------------------
    def start(self):
        """The text encoder (in the background where it fits), the image's VAE encode and the model's load (on a
        thread beside the encode where both fit), the K/V cache's host memory meanwhile; returns the WorldSession
        with the video begun."""
        from ..loaders.vae_files import load_vae
        from ..memory.kv_placement import FastPlacement
        from ..memory.overlap import Step
        from ..parallel.ranks import attach, check_same_inputs
        from ..wan.i2v import ConditionTrack, build_i2v_condition
        from ..wan.sampling.fast_sampler import draw, make_generator
        from ..wan.vae.model import VAEConfig
        from . import text_stage
        from .model_load import ModelLoad
        from .plan import cache_dtype
        from .session import FixedCondition, WorldSession

        s, files, device, ranks, stages, log = self.settings, self.files, self.device, self.ranks, self.stages, \
            self.log
        plan, part, video, imports = self.plan_, self.part, self.video, self.imports
        height, width, image, keep, keep_vae = self.height, self.width, self.image, self.keep, self.keep_vae
        model_bytes = int(plan.estimates.get("model_bytes", 0))
        # The load may run at the same time as the encode (a thread) when the whole model is resident: block swap
        # sets up its own streams and pinned ring, kept on the main thread.
        steps = [text_stage.vae_encode_step(files.vae_config() or VAEConfig(), height, width, part.frames,
                                            s.vae_tiled, keeps_vae=keep_vae),
                 Step(LOAD_STEP, model_bytes + int(plan.estimates.get("block_bytes", 0)), model_bytes,
                      with_previous=plan.blocks_on_gpu is None)]
        # the cache's pinned layers (an FP8 cache's in codes: host_layer_bytes), allocated while the text encodes
        host_bytes = plan.streamed_layers * int(plan.estimates.get("host_layer_bytes", 0)) if plan.cache == "host" \
            else 0
        text_plan = text_stage.plan(s.text, files, [self.prompt], device, steps, ranks, host_bytes=host_bytes,
                                    ram_free=plan.estimates.get("ram_free"))
        self.placement = placement = FastPlacement(plan, device, log.info)
        loader = assembly.model_loader(self.checked, s, device)
        self._load = load = ModelLoad(lambda progress: loader(placement, progress), device,
                                      before=self._wait_imports)
        if text_plan.overlap.host_early:  # pinned host memory from now on, beside the text, encode and load
            placement.start_host_memory(self.config, cache_dtype(s.weights, device, self.speed))
        self._text = text = text_plan.start(log)
        if not text.background:
            stages.mark("text")

        def encode_image():  # rank 0 only when there are several: the others receive y
            self.vae = load_vae(files.vae, device, config=files.vae_config())
            with torch.inference_mode():
                if keep:  # the conditioning of later frames too (a continuation needs them), in one encode
                    cond = ConditionTrack.build(self.vae, image, height, width, tiled=s.vae_tiled).y
                else:
                    cond = build_i2v_condition(self.vae, image, height, width, part.frames, tiled=s.vae_tiled)
            if not keep_vae:
                self.vae.to("cpu")
            _empty_cache(device)
            return [cond]

        text.before(text_stage.ENCODE_STEP)
        if text.plan.runs_with_previous(LOAD_STEP) and (imports is None or imports.background or not imports.modules):
            load.start()  # beside the encode (both were admitted on the same side of the text encoder)
        y, = ranks.from_main(encode_image, "the first frame's encoding")
        stages.mark("vae_encode")
        condition = ConditionTrack(y, y.shape[2] - 1) if keep else FixedCondition(y)

        self.seed = ranks.same_value(self.seed, "the seed")  # a random seed is rank 0's
        self.video = video = replace(video, seed=self.seed)
        noise_probe = draw(make_generator(self.seed, video.noise_source), (256,), device)
        check_same_inputs(ranks, {"noise": noise_probe, "conditioning": y,
                                  "text": text.embeddings()[0] if ranks.parallel else None, "camera": part.camera})

        def load_model():
            text.before(LOAD_STEP)
            if load.background:
                model = load.result()
                _empty_cache(device)  # what the load's stream cached: the main stream cannot reuse it
                stages.note("load (beside the VAE encode)", load.seconds)
                stages.mark("waiting for the load")
            else:
                if imports is not None and imports.modules:
                    imports.wait()
                    stages.mark("waiting for the imports" if imports.background else "imports")
                model = load.result()
                stages.mark("load")
            if imports is not None and imports.background:
                stages.note("imports (in the background)", imports.seconds)
            log.info("%s loaded in %.1f s", self.entry.title, load.seconds)
            return model

        def prepare_model(model):
            from ..speed.options import apply_speed

            model = apply_speed(model, self.speed)
            attach(ranks, model)  # this rank's tokens; its cache holds this rank's heads
            return model

        self.session = session = WorldSession(
            placement, video, device=device, load_model=load_model, prepare_model=prepare_model,
            vae=self.vae if keep_vae and self.vae is not None else None, speed=self.speed,
            tiny_decoder=self.checked.tiny if ranks.is_main else None)
        session.load()
        if text.background:  # before the cache takes the VRAM the encoder holds
            text.embeddings()
            stages.mark("waiting for the text encoder")
        pos, = text.embeddings()
        session.begin(condition, pos, self.prompt, video)
        return session

    def saver(self, target):
        """on_done(state) of the part: the state written to `target` (a saving.StateTarget) with the cache as placed."""
        return lambda state: target.write(state, self.placement.placement)

    @property
    def streams(self) -> bool:
        """Whether this rank decodes each chunk as it is made (rank 0 writes the video)."""
        return self.stream_vae and self.ranks.is_main

    def finish(self) -> None:
        """After the part: the cache's host memory in the summary, the session closed (the last frames written and
        the memory freed)."""
        if self.placement.host_memory_s is not None:
            self.stages.note("K/V host memory (in the background)", self.placement.host_memory_s)
        self.session.close()
        self.stages.mark("finish (last frames written and memory freed)")

    def close(self) -> None:
        """Stop what still runs (the load, the text encoder) and free the session and the placement (a finally)."""
        if self._load is not None:
            self._load.close()
        if self._text is not None:
            self._text.stop()
        if self.session is not None:
            self.session.close()
        if self.placement is not None:
            self.placement.close()
        _empty_cache(self.device)

    def log_compile(self) -> None:
        """After a part: how long compiling took."""
        from ..speed.plans import report_compile

        report_compile(self.speed, self.log)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """The whole latent decoded after sampling (the VAE did not fit beside the model), with the decoder's kernels
        and precision as the session's streaming decode runs them: [3, F, H, W] in [-1, 1]."""
        from ..speed.vae_norm import decoder_norm_silu
        from .decoding import plan_decode

        vae, device = self.vae, self.device
        vae.to(device)
        with torch.inference_mode():
            return plan_decode(device, self.speed, lambda: vae.decode(
                latent, tiled=self.settings.vae_tiled, norm_silu=decoder_norm_silu(device))[0])


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

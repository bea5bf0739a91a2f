"""The next part of a saved causal video, through the World session: a video made with its state saved goes on with
new keys, a new camera or neither (the camera stands still), from where it stopped.

    video = Continuation(source, settings, request)   # request: a VideoRequest naming the state it continues
    video.open()        # the state file read and checked (format, version, damage); `started`: the video's fixed
                        # settings, which the door holds its flags against
    video.check()       # the model's files against the state (model, weights, device kind), the part planned
    video.describe()    # the model and the part's note, in the log
    video.place()       # the speed plan (following the video's) and the memory plan
    session = video.start()   # the prompt (a new one encoded), the VAE, the session resumed from the state
    ...
    video.close()       # in a finally; then video.decode_part(latent) / video.decode_whole(latent)

Everything a state fixes (the size, the seed's generator, the cache rules, the model) comes from the state; a state
from another model, weights mode or device kind is refused before anything loads. How a first part is made
(`rule`: reference or continuable) is wan/sampling/fast_state.py's.
"""
from __future__ import annotations

import logging
from dataclasses import replace
import torch

from . import assembly, controls
from .plan import cache_dtype
from .settings import ModelSource, VideoRequest, WorldSettings

log = logging.getLogger(__name__)


class Continuation:
    """The next part of the video saved in request.continue_from (see the module), as `request` (a VideoRequest)
    asks: steering, prompt (None or the state's: the state's embedding), device, speed flags (None of them: the
    video's), request.save_to (the state after the part; None: not saved). source.model None: the model the state
    names."""

    def __init__(self, source: ModelSource, settings: WorldSettings, request: VideoRequest, *, stages=None,
                 log: logging.Logger = log):
        self.source = source
        self.settings = settings
        self.request = request
        self.stages = stages
        self.log = log
        self.file = self.state = self.started = None
        self.device = self.speed_flags = self.files = self.checked = self.source_steering = self.part = None
        self.frames = self.speed = self.plan_ = self.vae = self.session = None
        self.stream_vae = False
        self._available = None

    def open(self) -> None:
        """The saved state read and checked before anything loads (loaders/fast_state_file.StateFile): its format,
        version and damage; `started` is the video's FastSettings (size, seed, rule, window, model, speed)."""
        self.file = assembly.open_state(self.request.continue_from)
        self.state = self.file.state
        self.started = self.state.settings

    @property
    def entry(self):
        return self.checked.entry

    def check(self):
        """The generator's device, the speed flags (the video's preset and steps followed), the model's files checked
        against the state, and the part planned from the steering; returns the PartPlan."""
        from ..speed.plans import follow_started_speed, speed_plan
        from ..wan.sampling.fast_parts import plan_next_part
        from .errors import WorldError
        from .files import WorldFiles

        sf, state, st, log = self.file, self.state, self.started, self.log
        self.device = device = assembly.compute_device(self.request.device)
        self.source = replace(self.source, model=self.source.model or st.model_name or "fast")
        if st.noise_source == "cuda" and not torch.cuda.is_available():
            raise WorldError(f"{sf.path} continues the reference's CUDA generator; run it on a CUDA GPU")
        flags = self.request.speed
        followed = follow_started_speed(flags.speed, flags.chunk_steps, st.speed, st.chunk_steps)
        self.speed_flags = flags = flags.with_preset(followed.speed, followed.chunk_steps)
        if followed.note:
            (log.warning if followed.differs else log.info)("speed: %s", followed.note)
        self._available = speed_plan(flags, device)
        s = self.settings
        assembly.check_weights_mode(s.weights, device)
        self.files = WorldFiles.find(self.source, s.weights)
        self.checked = checked = assembly.check(self.files, s, device)
        cfg = checked.config
        here = assembly.video_settings(checked, s, device, st.height, st.width, seed=st.seed, mode=st.mode,
                                       window=st.window, sink=st.sink)
        # the cache dtype this run's compute gives (fp16 under --compute fp16acc): the speed plan is not in s yet
        dtype = cache_dtype(s.weights, device, self._available)
        here = replace(here, max_attention=st.max_attention, precision=st.precision, noise_source=st.noise_source,
                       cache_dtype=str(dtype).replace("torch.", ""))
        st.check_continue(here, str(sf.path))
        sf.check_model(cfg.num_layers, cfg.num_heads, cfg.head_dim, getattr(torch, here.cache_dtype))
        if state.condition is None:
            raise WorldError(f"{sf.path} has no conditioning for later frames; it cannot be continued")
        steering = self.request.steering
        self.source_steering, self.frames = controls.camera_source(steering, steering.frames, continuation=True)
        self.part = plan_next_part(state, self.source_steering, self.frames)
        return self.part

    @property
    def latent_frames(self) -> int:
        """The video's latent frames after the part."""
        return self.state.latent_frames + self.part.latent_frames

    @property
    def control(self) -> str:
        return controls.control_label(self.source_steering, still=self.state.has_camera)

    def state_target(self):
        """Where the state after the part goes, with the size it will have (world/saving.py); None when it is not
        saved."""
        from .saving import StateTarget

        if self.request.save_to is None:
            return None
        return StateTarget.plan(self.request.save_to, self.started, self.checked.config, self.latent_frames)

    def describe(self) -> None:
        """The model and the part's frame note, in the log (after the checks: a refusal is the run's one line)."""
        self.log.info("model: %s", self.entry.describe())
        if self.part.note:
            self.log.warning("frames: %s", self.part.note)

    def picture(self):
        """The path the part follows, to draw (None: the part has no camera)."""
        return controls.part_picture(self.part, self.source_steering)

    def place(self) -> None:
        """The speed plan for this part (its length's compile policy, the kernels the video was made with) and the
        memory plan for the whole video so far (nothing fits: one line)."""
        from ..memory.fast_plan import FastMemoryError
        from ..speed.plans import fast_compile_policy, follow_started_compile, log_speed_plan
        from .errors import WorldError

        flags, available = self.speed_flags, self._available
        self.speed = follow_started_compile(fast_compile_policy(available, flags, self.part.chunks), available, flags,
                                            self.started.compile)
        self.speed = assembly.fit_speed(self.checked, self.speed)  # a narrow model runs --compile auto eagerly
        log_speed_plan(self.speed, self.log)
        self.settings = s = replace(self.settings, speed=self.speed)
        try:
            self.plan_, self.stream_vae = assembly.plan_memory(self.checked, self.started, self.device, s,
                                                               latent_frames=self.latent_frames,
                                                               with_camera=self.part.camera is not None)
        except FastMemoryError as e:
            raise WorldError(str(e)) from None
        if not self.plan_.fits:
            self.log.warning("the plan may not fit in VRAM: %s", self.plan_.reason)

    def start(self):
        """The prompt (a new one is encoded; the state's otherwise), the VAE (none with a tiny decoder: it decodes
        everything), the session resumed from the state; returns the WorldSession."""
        from ..loaders.vae_files import load_vae
        from ..memory.kv_placement import FastPlacement
        from ..text_encoder.encode import encode_prompts
        from .session import WorldSession

        state, files, device, s, log = self.state, self.files, self.device, self.settings, self.log
        prompt, context = state.prompt, state.context
        if self.request.prompt is not None and self.request.prompt != state.prompt:
            prompt, text = self.request.prompt, s.text
            context = encode_prompts(files.t5, files.tokenizer, [prompt], device=text.device, cache_dir=text.cache_dir,
                                     use_cache=text.use_cache, timeout=text.timeout)[0]
            log.info("new prompt from this part on: %s", prompt)
        self.stages.mark("text")
        tiny = self.checked.tiny
        # a tiny decoder decodes everything here: the VAE (only a decoder in a continuation) is not loaded
        self.vae = vae = load_vae(files.vae, device, config=files.vae_config()) if tiny is None else None
        if vae is not None and not self.stream_vae:
            vae.to("cpu")
        self.z_before = state.latent()
        self.placement = placement = FastPlacement(self.plan_, device, log.info)
        loader = assembly.model_loader(self.checked, s, device)
        self.session = session = WorldSession(
            placement, self.started, device=device, load_model=lambda: loader(placement),
            prepare_model=assembly.speed_preparer(self.speed), vae=vae if self.stream_vae else None, speed=self.speed,
            tiny_decoder=tiny)
        session.resume(state, self.file)
        session.context, session.prompt = context.detach().to("cpu", torch.float32), prompt
        return session

    def saver(self, target):
        """on_done(state) of the part: the state written to `target` (a saving.StateTarget) with the cache as placed."""
        return lambda state: target.write(state, self.placement.placement)

    def close(self) -> None:
        """The session freed (a finally)."""
        if self.session is not None:
            self.session.close()

    def log_compile(self) -> None:
        """After the part: how long compiling took."""
        from ..speed.plans import report_compile

        report_compile(self.speed, self.log)

    # ---- decoding after the part -------------------------------------------------------------------------------
    def prepare_decode(self, part: bool, whole: bool) -> None:
        """The VAE back on the device when the part (not streamed) or the whole video is to be decoded."""
        if self.vae is not None and (part or whole):
            self.vae.to(self.device)

    def decode_part(self, latent: torch.Tensor) -> torch.Tensor:
        """The part's frames (decoded with the video's last latents as context): [3, F, H, W] in [-1, 1]."""
        from ..speed.vae_norm import decoder_norm_silu
        from ..wan.vae.streaming import decode_part
        from .decoding import plan_decode

        with torch.inference_mode():
            return plan_decode(self.device, self.speed, lambda: decode_part(
                self.vae, self.z_before.to(self.device), latent, tiled=self.settings.vae_tiled,
                norm_silu=decoder_norm_silu(self.device))[0])

    def decode_whole(self, latent: torch.Tensor) -> torch.Tensor:
        """The whole video so far: [3, F, H, W] in [-1, 1] (the tiny decoder's when there is one)."""
        from ..speed.vae_norm import decoder_norm_silu
        from ..wan.vae.tiny import TinyStreamingDecoder
        from .decoding import plan_decode

        z_whole = torch.cat([self.z_before.to(self.device), latent.to(self.device)], dim=2)
        tiny = self.checked.tiny
        with torch.inference_mode():
            if tiny is not None:
                return plan_decode(self.device, self.speed, lambda: TinyStreamingDecoder(tiny).decode(z_whole)[0])
            return plan_decode(self.device, self.speed, lambda: self.vae.decode(
                z_whole, tiled=self.settings.vae_tiled, norm_silu=decoder_norm_silu(self.device))[0])

    def release(self) -> None:
        """The VAE dropped and the device's cache emptied."""
        self.vae = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

"""The World session: one loaded causal model and one video, driven part by part or chunk by chunk.

Its sections live in files of their own: the parts and their tensors, old ones on disk (history.py), playing it chunk
by chunk, what was played and saving it (played.py), going back (rewinding.py), decoding (decoding.py); the K/V
cache's placement is cache.py.

Every door (the CLI's generate / continue, the ComfyUI nodes, the live player) runs the Fast model through this
object, so a played video and a batch run are the same calls and give the same frames.

What it owns: the model (loaded through the door's placement: the CLI's `FastPlacement`, ComfyUI's model
management), the K/V cache (placed by the memory plan; grown, rewound or rebuilt here), the conditioning track,
the prompt embedding, the video's state after every part (`FastState`: generator, camera track, latents), the keys
played, and a streaming VAE decoder. What it does not know: command-line flags, ComfyUI, HTTP, where the frames go.

Exactness. `step(keys)` makes one chunk by the continuable rule (no look-ahead), so chunk after chunk it makes
exactly the video of one batch run of the concatenated keys with `--rule continuable`. `rewind(n)` goes back to
the boundary after part n: without an eviction since then the cache's counters are simply set back (slots past them
are overwritten before they are read); after an eviction the cache is rebuilt by replaying the kept parts' context
passes (the only forwards whose K/V survive a chunk), which writes the same K/V in the same order.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..memory.resident_weights import apply_resident_weights, drop_resident_weights
from ..wan.dit.film_cache import DeviceFilmStore
from ..wan.dit.model import pad_context
from ..wan.sampling.fast_sampler import FastRun
from ..wan.sampling.fast_parts import (CameraSource, PartPlan, finish_part, plan_first_part, plan_next_part,
                                       start_part)
from ..wan.sampling.fast_state import FastSettings, FastState
from ..wan.sizes import VAE_TEMPORAL_STRIDE
from .cache import SessionCache
from .decoding import SessionDecoding
from .errors import WorldError, check_finite_chunk
from .frames import ChunkTimes, FixedCondition
from .history import PartHistory
from .played import PlayedVideo
from .rewinding import Rewinding

log = logging.getLogger(__name__)


class WorldSession(PartHistory, PlayedVideo, Rewinding, SessionDecoding):
    """One Fast video at a time on one loaded model. Not thread-safe: drive it from one thread.

    placement: where the model and cache live, as the door manages them: `plan` (a FastMemoryPlan whose layout may
    be replaced here), `make_cache(fill=None)` -> KVCache, `placement` (the CachePlacement made), `release_cache()`,
    `close()`; the CLI's `memory.kv_placement.FastPlacement`, or ComfyUI's (nodes/adapters/fast_host.py).
    load_model(): the model, loaded as the plan says (called once, when the first part needs it).
    prepare_model(model) -> model: speed options, a parallel layout (called once after the load).
    vae: a WanVAE on the device for streaming decode (None: the door decodes the latents itself).
    tiny_decoder: a wan.vae.tiny.TinyDecoder on the device: every decode of this session uses it instead of the
    VAE (preview quality, a fraction of the VAE's time and memory); the VAE, if given, still encodes a start image.
    speed: the run's SpeedPlan (speed/options.py): its chunk levers go to every chunk (a preset's 3 steps, the
    folded context pass) and its decode levers to the streaming decode (bf16); None: the release's schedule.
    """

    def __init__(self, placement, settings: FastSettings, *, device, load_model: Callable[[], nn.Module],
                 prepare_model: Optional[Callable[[nn.Module], nn.Module]] = None, vae=None,
                 text_len: Optional[int] = None, speed=None, model_lock=None, tiny_decoder=None):
        self.placement = placement
        self.settings = settings
        self.device = torch.device(device)
        self._load_model = load_model
        self._prepare_model = prepare_model
        self.vae = vae
        self.tiny_decoder = tiny_decoder
        self.text_len = text_len
        self.speed = speed  # a speed.options.SpeedPlan: its chunk levers (steps, fold) and decode levers
        # held while the model runs (load, a part, a chunk and its decode, a rewind's rebuild): a door that lets
        # several sessions share one model (ComfyUI: LingBot Play beside Fast Continue) passes the model's lock
        self.model_lock = model_lock if model_lock is not None else threading.RLock()
        self.model: Optional[nn.Module] = None
        self.kv = SessionCache(placement)
        self.decoder = None  # a StreamingDecoder (the VAE's) or a TinyStreamingDecoder
        # the camera FiLM's pinned host buffers (a plan with film_host_blocks): pinned once, kept with the cache
        self._film_store = None  # a memory.film_stream.HostFilmStore
        self._film_device_store = None  # a wan.dit.film_cache.DeviceFilmStore: the same tensors every chunk
        self.condition = None
        self.context: Optional[torch.Tensor] = None  # [L, dim] float32, CPU (trimmed)
        self.prompt = ""
        self._init_history()  # self.parts: the video's parts (world/history.py)
        self.callback = None  # FastStepInfo after every model call
        self.cancel_check: Optional[Callable[[], bool]] = None
        self.last_times = ChunkTimes()
        self.load_seconds: Optional[float] = None
        self.opened = None  # world.assembly.Opened, set by open_session: what start() needs
        self._restore = None  # a saved cache to put back when the cache is placed (resume)
        self._unfinished = False  # the last part skipped its final context pass: the video cannot go on
        self._walked = None  # camera_path's walk so far: (pressed keys, poses, intrinsics, end state)
        self._grow_ahead = False  # played chunk by chunk: the cache is sized ahead, grown 81 frames at a time
        self._closed = False

    @property
    def files(self):
        """The files a session opened from files loads (world.files.WorldFiles; None when a door placed the model)."""
        return None if self.opened is None else self.opened.checked.files

    @property
    def cache(self):
        """The K/V cache of the video (None when none is placed)."""
        return self.kv.cache

    def load(self, progress: Optional[Callable[[int, int], None]] = None) -> None:
        """Load the model now (otherwise the first chunk does); progress(done_bytes, total_bytes) as it reads, where
        the session's loader reports it (the CLI's and the player's do)."""
        self._check_open()
        with self.model_lock:
            self._ensure_model(progress)

    def start(self, image, prompt: str) -> None:
        """A new video from an image (a path or [3, H, W] in [-1, 1]) and a prompt (encoded in a child process,
        cached); its size follows the image's aspect within the settings' pixel budget."""
        self._check_open()
        if self.opened is None:
            raise WorldError("start() needs a session opened from files (world.open_session); use begin() otherwise")
        h, w, condition, context, settings = self.opened.new_video(self.vae, image, prompt, self.device)
        self.begin(condition, context, prompt, settings)

    # ---- the video ---------------------------------------------------------------------------------------------
    def begin(self, condition, context: torch.Tensor, prompt: str, settings: Optional[FastSettings] = None) -> None:
        """A new video: its conditioning (a ConditionTrack, or a FixedCondition / y tensor for a known length), the
        prompt's embedding [L, dim] and the prompt. The cache and decoder start over."""
        self._check_open()
        if isinstance(condition, torch.Tensor):
            condition = FixedCondition(condition)
        if settings is not None:
            self.settings = settings
        self.condition = condition
        self.context = context.detach().to("cpu", torch.float32)
        self.prompt = prompt
        self._new_history()
        self._reset_cache()
        self._reset_decoder()

    def resume(self, state: FastState, restore) -> None:
        """Go on with a saved video: its state, and `restore` with fill(i, k, v) + restore_counters(cache) (a
        state file, or a parked cache) to put its K/V back when the cache is placed."""
        self._check_open()
        if state.condition is None:
            raise WorldError("the saved video has no conditioning for later frames; it cannot be continued")
        self.settings = state.settings
        self.condition = state.condition
        self.context = state.context
        self.prompt = state.prompt
        self._reset_cache()
        self._reset_decoder()
        self._new_history()
        self._add_part(state, CameraSource(), None, None, resumed=True, added=len(state.latents))
        self._restore = restore

    def _made_with(self) -> FastSettings:
        """The settings a state records: these ones, with the kernels, speed preset and steps per chunk this run
        uses (a continuation given none of them follows them, so it makes what one run of all its keys would)."""
        if self.speed is None:
            return self.settings
        levers = getattr(self.speed, "levers", None)
        return replace(self.settings, compile=getattr(self.speed, "compile", None) or self.settings.compile,
                       speed=getattr(self.speed, "preset", None) or "",
                       chunk_steps=levers.steps if levers is not None else self.settings.chunk_steps)

    @property
    def chunks(self) -> int:
        return self.state.chunks if self.parts else 0

    @property
    def frames(self) -> int:
        return self.state.frames if self.parts else 0

    @property
    def height(self) -> int:
        return self.settings.height

    @property
    def width(self) -> int:
        return self.settings.width

    @property
    def chunk_frames(self) -> int:
        """Latent frames per chunk (the model's recipe: v1 Fast 3, v2 4)."""
        return self.settings.chunk_frames

    @property
    def chunk_video_frames(self) -> int:
        """Video frames a chunk adds after the first (v1 Fast 12, v2 16)."""
        return self.settings.recipe.chunk_video_frames

    @property
    def steps_per_chunk(self) -> int:
        """Denoising calls per chunk: the speed plan's (a preset's 3 or 2), else the model's recipe's."""
        levers = getattr(self.speed, "levers", None)
        return levers.steps if levers is not None else self.settings.recipe.steps

    def keys_for_next_chunk(self) -> int:
        """Frames of keys the next chunk takes: for the video's first chunk one latent frame fewer (its first frame
        is the image: v1 Fast 8, v2 12), then a chunk's (v1 Fast 12, v2 16)."""
        return VAE_TEMPORAL_STRIDE * (self.chunk_frames - 1) if self.chunks == 0 else self.chunk_video_frames

    # ---- planning a part -----------------------------------------------------------------------------------------
    def plan_part(self, source: CameraSource, frames: Optional[int] = None) -> PartPlan:
        """The next part for keys / a camera / nothing (`frames` asked for; None: as long as the input)."""
        self._check_open()
        if self.condition is None:
            raise WorldError("start a video first (begin / start)")
        if not self.parts:
            return plan_first_part(source, frames, self.settings)
        return plan_next_part(self.state, source, frames)

    # ---- running a part ------------------------------------------------------------------------------------------
    def run_part(self, part: PartPlan, source: CameraSource, frames: Optional[int] = None, *,
                 on_frames: Optional[Callable[[torch.Tensor], None]] = None, final_context: bool = True,
                 release_cache_after: bool = False,
                 on_done: Optional[Callable[[FastState], None]] = None, label: str = "",
                 on_latent: Optional[Callable[[int, torch.Tensor], None]] = None,
                 step_callback: Optional[Callable] = None) -> torch.Tensor:
        """Make every chunk of `part` (planned by `plan_part` from `source` and `frames`); returns its latent
        [1, 16, F, h, w] (normalised, on the device).

        on_frames(frames [1, 3, T, H, W] in [-1, 1]): each chunk's frames from the streaming decoder (needs a VAE).
        final_context=False skips the last chunk's context pass (only a later part reads it; the latent is the
        same) -- then the video cannot be continued. release_cache_after: free the cache when its last chunk is done
        with it (the end of a batch run). on_done(state): called after the last chunk while the cache is still
        there (saving a state file). on_latent(index, x0): each chunk's latent as it is done (previews).
        step_callback: this part's callback after every model call, instead of `self.callback`."""
        with self.model_lock:  # one user of the model at a time (a door may share it between sessions)
            self._check_open()
            latent_start = self.state.latent_frames if self.parts else 0
            model = self._ready_model()
            self._ensure_cache(latent_start + part.latent_frames)
            y = self.condition.frames(latent_start, part.latent_frames)
            ctx = pad_context([self.context], self._text_len(model)).to(self.device)
            decoder = self._decoder_for(on_frames)
            run: Optional[FastRun] = None
            t_decode = 0.0

            def on_chunk(index: int, x0: torch.Tensor) -> None:
                nonlocal t_decode
                check_finite_chunk(x0, index, getattr(self.speed, "compute", None))
                if on_latent is not None:
                    on_latent(index, x0)
                if release_cache_after and on_done is None and index == run.chunks - 1:
                    self._release_cache()  # done with it: freed while this chunk is decoded and written
                if decoder is not None:
                    t = time.perf_counter()
                    with torch.inference_mode():
                        on_frames(self._decode(decoder, x0))
                    t_decode += time.perf_counter() - t

            t0 = time.perf_counter()
            film = self._film() if part.camera is not None else None
            run = start_part(model, part, self.settings, y, ctx, self.cache, self.state, device=self.device,
                             final_context=final_context, callback=step_callback or self.callback, on_chunk=on_chunk,
                             cancel_check=self.cancel_check, film=film, **self._run_options())
            try:
                with torch.inference_mode():
                    latent = run.run()
            except BaseException:
                self._after_interrupt(run)
                raise
            finally:
                if film is not None:
                    film.close()
            state = finish_part(run, part, self._made_with(), self.state, context=self.context, prompt=self.prompt,
                                label=label or source.label or source.kind)
            state.condition = self.condition if not isinstance(self.condition, FixedCondition) else None
            folded = [(x.detach().to("cpu"), t) for x, t in getattr(run, "folded_inputs", [])]
            self._add_part(state, source, frames, part.keys, folded=folded)
            if not final_context:
                self._unfinished = True
            if on_done is not None:
                on_done(state)
            if release_cache_after:
                self._release_cache()
                self._close_film_store()
            total = time.perf_counter() - t0
            self.last_times = ChunkTimes(total - t_decode, t_decode, total)
            return latent

    def _run_options(self) -> dict:
        return self.speed.fast_run_options(self.settings.recipe) if self.speed is not None else {}

    # ---- the model and the cache ---------------------------------------------------------------------------------
    def _ensure_model(self, progress=None) -> nn.Module:
        if self.model is None:
            t = time.perf_counter()
            model = self._load_model() if progress is None else self._load_model(progress=progress)
            if self._prepare_model is not None:
                model = self._prepare_model(model)
            self.model = model
            self.load_seconds = time.perf_counter() - t
        return self.model

    def _ready_model(self) -> nn.Module:
        """The model with the GEMM weights the plan keeps made (or dropped), before the cache is placed: here, not at
        the load, since a door's start-up may still hold the card then (the CLI's text encoder beside the load).
        Every part checks them: another session on the same model (ComfyUI) or a LoRA may have dropped them."""
        model = self._ensure_model()
        apply_resident_weights(model, self.placement.plan)
        return model

    def _text_len(self, model) -> int:
        return self.text_len or int(getattr(getattr(model, "cfg", None), "text_len", 512))

    def _ensure_cache(self, latent_frames: int) -> None:
        self.kv.ensure(self.settings, latent_frames, restore=self._restore, ahead=self._grow_ahead)
        self._restore = None

    def _release_cache(self) -> None:
        self.kv.release()

    def _close_film_store(self) -> None:
        for store in (self._film_store, self._film_device_store):
            if store is not None:
                store.close()
        self._film_store = self._film_device_store = None

    def _film(self):
        """A camera FiLM cache for one part (None: every call computes the FiLM); its blocks use the session's
        stores, which serve every part until the cache is released: the pinned buffers of the blocks kept in host
        RAM, and the device's tensors (the same addresses every chunk, which the CUDA graphs replay over)."""
        plan = self.placement.plan
        if plan.film_host_blocks and self._film_store is None:
            self._film_store = plan.make_film_store(self.device)
        if plan.film_blocks and self._film_device_store is None:
            self._film_device_store = DeviceFilmStore()
        return plan.make_film(host_store=self._film_store, device_store=self._film_device_store)

    def _reset_cache(self) -> None:
        """An empty cache for a new video: the placed one with its counters at zero, or none yet."""
        self._restore = None
        self._unfinished = False
        self._release_cache()  # a new video may have another prompt (text K/V) and a ring may have rotated
        self._close_film_store()

    # ---- the end -----------------------------------------------------------------------------------------------
    def park(self):
        """Take the cache out into host memory (a ParkedKV) and free the device's share; the session can go on
        after `resume(state, parked)`."""
        return self.kv.park()

    def snapshot(self):
        """The video so far, to continue elsewhere while this session goes on: (its FastState, a copy of its cache in
        host memory as `park` gives it). The state is shared: no FastState changes after its part. Between chunks
        only (a player: on its driver's thread); the copy takes `snapshot_bytes()` of RAM."""
        self._check_open()
        if not self.parts:
            raise WorldError("no chunk made yet: nothing to continue")
        if self._unfinished:
            raise WorldError("the last part skipped its final context pass; the video cannot go on")
        state, cache = self.state, self.cache
        if cache is None or (cache.global_end, cache.local_end) != (state.kv_global_end, state.kv_local_end):
            raise WorldError("the cache is not at the end of the last chunk (a chunk is running?)")
        return state, self.kv.copy()

    def snapshot_bytes(self) -> int:
        return self.kv.filled_bytes()

    def close(self) -> None:
        """Free the decoder, the cache and the model (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._reset_decoder()
        self._close_history()
        self.kv.cache = None
        self._close_film_store()
        # The kept GEMM weights go: a host keeps the model (ComfyUI) and its memory accounting does not count them.
        # Not while another session runs the same model (holding the lock): its chunk reads them.
        if self.model is not None and self.model_lock.acquire(blocking=False):
            try:
                drop_resident_weights(self.model)
            finally:
                self.model_lock.release()
        self.model = None
        self.tiny_decoder = None
        self.placement.close()

    def _check_open(self) -> None:
        if self._closed:
            raise WorldError("this World session is closed; open a new one")

    def __enter__(self) -> "WorldSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The Fast model in ComfyUI's process: its payload, and one part of a video run through the World session with the
model placed by ComfyUI's model management (world/hosted.py: the world a host places).

`ComfyFastPlacement` is the session's placement here: the model is loaded by `comfy.model_management` (the
experts' ExpertPatcher, so "free memory" and other models evict it like an expert) and the K/V cache is placed by
the memory plan next to it (GPU, or pinned RAM streamed one layer ahead). `open_fast_world` plans the memory for
what ComfyUI can free and shows the plan on the node; `run_fast_part` runs the part with ComfyUI's progress bar,
previews and cancel, and frees the cache when the part ends or is cancelled (a state keeps it parked in RAM:
nodes/adapters/fast_state_store.py).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ...world.controls import CameraSource
from ...world.errors import Cancelled
from ...world.hosted import FastSettings, HostedWorld, HostPlacement, check_text
from ...world.machine import gb
from ...world.session import WorldSession
from ...world.settings import WorldSettings
from .memory import vram_comfy_can_free
from .payloads import CameraInput, VAEHandle
from .progress import count

log = logging.getLogger(__name__)

FAST_MODEL = "LINGBOT_FAST_MODEL"
FAST_STATE = "LINGBOT_FAST_STATE"
NOISE_SOURCES = ("cpu", "cuda")
PREVIEW_COLUMNS = 4
FPS = 16


@dataclass
class FastModel:
    """LINGBOT_FAST_MODEL: the Fast model's patcher (loaded on demand by the sampler) and how to place its cache."""

    patcher: Any  # ExpertPatcher
    checked: Any  # world.assembly.Checked: the model's format, registry entry and notes
    weights: str
    kv_cache: str  # "auto" | "gpu" | "host"
    speed: Any = None  # speed.options.SpeedPlan from LingBot Speed Options (None: the exact defaults)
    # one session runs the model at a time: LingBot Play's chunks (its own thread) and a Sampler / Continue on
    # ComfyUI's worker take turns instead of running the same weights in one memory plan at once
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def config(self):
        return self.checked.config

    @property
    def format(self):
        return self.checked.fmt

    @property
    def entry(self):
        """The registry model (world/models.py) the loaded weights are."""
        return self.checked.entry

    def settings(self, **kw) -> WorldSettings:
        """The world settings of a video of this model (node inputs as keywords)."""
        return WorldSettings(weights=self.weights, kv_cache=self.kv_cache, speed=self.speed, **kw)

    def check_text(self, embedding) -> None:
        """A prompt embedding from the text encoder this model takes."""
        check_text(self.checked, embedding)


def fast_summary(frames, width: int, height: int, plan, notes: list, so_far: int = 0, steps: int = 4) -> str:
    """The Fast nodes' text: what they generate (after the chunk rounding; `so_far` frames before it for a
    continued video), where the model and the K/V cache live, then any adjustment."""
    est = plan.estimates
    if so_far:
        total = so_far + frames.frames
        line = (f"{width}x{height}, {frames.frames} new frames after {so_far} ({total} frames, {total / FPS:.1f} s "
                f"at {FPS} fps): {count(frames.chunks, 'chunk')} x {steps} steps")
    else:
        line = (f"{width}x{height}, {frames.frames} frames ({frames.frames / FPS:.1f} s at {FPS} fps): "
                f"{count(frames.chunks, 'chunk')} x {steps} steps")
    if est.get("vram_free") is None:
        where = f"model and K/V cache ({gb(est['cache_bytes'])}) in RAM (CPU run)"
    elif plan.cache == "gpu":
        where = f"K/V cache ({gb(est['cache_bytes'])}) on the GPU"
    else:
        where = (f"K/V cache ({gb(est['cache_bytes'])}) in pinned RAM, {plan.cache_layers_on_gpu}/{est['num_layers']} "
                 f"layers on the GPU" + (f" ({plan.code_layers_on_gpu} as FP8 codes)" if plan.code_layers_on_gpu else ""))
    if plan.blocks_on_gpu is not None:
        where += f", model block swap ({plan.blocks_on_gpu} blocks on the GPU)"
    if plan.film_blocks or plan.film_host_blocks:
        kept = [f"{plan.film_blocks}/{est['num_layers']} blocks on the GPU"] if plan.film_blocks else []
        if plan.film_host_blocks:
            kept.append(f"{plan.film_host_blocks} in pinned RAM")
        where += f", camera FiLM kept per chunk for {' and '.join(kept)}"
    return "\n".join([line, f"memory: {where}"] + [n for n in notes if n])


def camera_source(camera: Optional[CameraInput]) -> CameraSource:
    """The Sampler's / Continue's camera input as a part's control: keys when it was built from keys."""
    if camera is None:
        return CameraSource()
    if camera.keys is not None:
        return CameraSource(keys=camera.keys, intrinsics=camera.intrinsics[:1], label=camera.label)
    return CameraSource(poses=camera.poses, intrinsics=camera.intrinsics,
                        per_frame_intrinsics=camera.per_frame_intrinsics, label=camera.label)


class ComfyFastPlacement(HostPlacement):
    """The World session's placement in ComfyUI: the model through model management, the cache by the plan."""

    def __init__(self, fast_model: FastModel, plan, device, preview_vae: Optional[VAEHandle] = None,
                 extra_vram: int = 0):
        super().__init__(plan, device)
        self.fast_model = fast_model
        self.preview_vae = preview_vae
        self.extra_vram = extra_vram

    def load_model(self):
        import comfy.model_management as mm

        from .progress import load_progress

        plan, patcher = self.plan, self.fast_model.patcher
        weights = patcher.weights
        if patcher.is_loaded() and plan.blocks_on_gpu != weights.blocks_on_gpu:
            from .patchers import unload_patcher

            unload_patcher(patcher)  # placed differently last run
        weights.set_placement(False, plan.blocks_on_gpu)
        if not patcher.is_loaded():
            patcher.size = weights.device_bytes(patcher.load_device)
        est = plan.estimates
        beside = (plan.device_cache_bytes + est["activation_bytes"]
                  + (est["text_kv_bytes"] if plan.cache_text else 0)
                  + (2 * est["cache_layer_bytes"] if plan.cache == "host" else 0)
                  + plan.film_blocks * est.get("film_block_bytes", 0) + est.get("film_buffer_bytes", 0)
                  + plan.resident_weight_bytes)  # the session keeps them once the model is loaded
        models = [patcher] + ([self.preview_vae.patcher] if self.preview_vae is not None else [])
        weights.progress = load_progress()("fast")
        try:
            mm.load_models_gpu(models, memory_required=beside + self.extra_vram, force_full_load=True)
        finally:
            weights.progress = None
        model = patcher.model.diffusion_model
        if model is None:
            raise RuntimeError("ComfyUI did not load the Fast model; see the log above")
        if plan.token_chunk is not None:
            model.set_token_chunk(plan.token_chunk)
        self.model = model
        return model

    def close(self) -> None:
        """The cache goes; the model stays with ComfyUI's model management."""
        import comfy.model_management as mm

        super().close()
        mm.soft_empty_cache()


def open_fast_world(fast_model: FastModel, world: HostedWorld, video: FastSettings, latent_frames: int, part,
                    preview_vae, *, so_far: int = 0, show: Callable[[str], None] = lambda s: None,
                    tiny_decoder=None) -> tuple[WorldSession, str]:
    """A World session for a video of `latent_frames` (so far + this part), its memory planned for what ComfyUI
    can free; the plan is shown on the node (returned too). tiny_decoder (a wan.vae.tiny.TinyDecoder on ComfyUI's
    device, LingBot Play's tiny_vae): the session decodes with it, the plan counts its memory instead of the
    VAE's streaming decode, and the VAE is not loaded beside the model."""
    import comfy.model_management as mm

    h, w = video.height, video.width
    extra = 0
    if tiny_decoder is not None:
        extra = world.tiny_bytes(tiny_decoder, h, w)
        preview_vae = None  # the tiny decoder makes every frame: the VAE's weights stay off the card
    elif preview_vae is not None:
        extra = world.preview_bytes(preview_vae.model.cfg, h, w)
    try:
        plan = world.plan(video, latent_frames, part, decode_bytes=extra,
                          vram=vram_comfy_can_free(mm, world.device, fast_model.patcher))
    except MemoryError as e:
        raise MemoryError(f"LingBot-World Fast: {e}") from None
    session = world.open(ComfyFastPlacement(fast_model, plan, world.device, preview_vae, extra), video,
                         model_lock=fast_model.lock, tiny_decoder=tiny_decoder)
    summary = fast_summary(part, w, h, plan, [part.note, video.layout(latent_frames).note], so_far,
                           session.steps_per_chunk)
    show(summary)
    return session, summary


def run_fast_part(world: WorldSession, part, source: CameraSource, frames: Optional[int],
                  preview_vae: Optional[VAEHandle], *, keep: bool, after=None,
                  z_before: Optional[torch.Tensor] = None, label: str = "", previews: bool = True) -> torch.Tensor:
    """Run `part` in `world` (begun or resumed by the caller) with progress, previews and cancel. after(world, ok)
    runs before the cache is freed (ok False when the part stopped). Returns the part's latent (normalised)."""
    import comfy.model_management as mm

    progress = FastProgress(part.chunks * world.steps_per_chunk, world.device, preview_vae if previews else None,
                            z_before, previews=previews)
    world.callback = progress.step
    world.cancel_check = mm.processing_interrupted
    ok = False
    try:
        # the last chunk's context pass only feeds a continuation: skipped when nothing takes the state
        x = world.run_part(part, source, frames, final_context=keep, on_latent=progress.chunk_done, label=label)
        ok = True
    except Cancelled:
        mm.throw_exception_if_processing_interrupted()
        raise mm.InterruptProcessingException()
    finally:
        try:
            if after is not None:
                after(world, ok)
        finally:
            world.close()
            progress.close()
    progress.finish()
    return x


class FastProgress:
    """Progress per chunk x step, and previews. Without a VAE: at each step, every latent frame of the part so far
    (the finished chunks and the current chunk's x0) as one grid through ComfyUI's latent previewer, like LingBot
    Sampler's whole-clip preview. With a VAE: each finished chunk decoded to its frames, tiled into one image (a
    continued part's decoder is first warmed up on the video before it, `z_before`, so its frames are exact)."""

    def __init__(self, total: int, device, vae: Optional[VAEHandle], z_before: Optional[torch.Tensor] = None,
                 previews: bool = True):
        from .progress import SamplingProgress

        self.total = total
        self.previews = previews
        self.bar = SamplingProgress(total, device, previews=previews)  # ComfyUI's bar and the whole-clip preview
        self.pbar = self.bar.pbar
        self.decoder = None
        self.failed = False
        self.finished: list[torch.Tensor] = []  # x0 of the finished chunks (FastRun keeps them anyway)
        self.decoded = vae is not None  # each finished chunk decoded, instead of the latent previews
        if vae is not None:
            from ...world.vae import chunk_decoder

            try:  # a continued video's decoder is warmed up on it: its chunks decode as in the whole video
                self.decoder = chunk_decoder(vae.model, z_before)
            except Exception as e:  # a preview must never stop a generation
                self.failed = True
                log.warning("LingBot-World: chunk previews disabled for this run: %s", e)
        self.done = 0

    def step(self, info) -> None:
        self.done = info.index + 1
        preview = None
        if not self.decoded and self.previews:
            preview = self.bar.preview(torch.cat(self.finished + [info.x0], dim=2))
        self.pbar.update_absolute(self.done, self.total, preview)

    def chunk_done(self, index: int, x0: torch.Tensor) -> None:
        self.finished.append(x0)
        if self.decoder is None or self.failed:
            return
        try:
            with torch.inference_mode():
                frames = self.decoder.decode(x0)[0]  # [3, T, H, W] in [-1, 1]
            preview = ("JPEG", frame_grid(((frames + 1) / 2).clamp(0, 1)), _max_preview())
        except Exception as e:
            self.failed = True
            log.warning("LingBot-World: chunk previews disabled for this run: %s", e)
            return
        self.pbar.update_absolute(self.done, self.total, preview)

    def finish(self) -> None:
        self.pbar.update_absolute(self.total, self.total)

    def close(self) -> None:
        self.finished = []
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None


def _max_preview() -> int:
    try:
        from latent_preview import MAX_PREVIEW_RESOLUTION

        return int(MAX_PREVIEW_RESOLUTION)
    except Exception:
        return 512


def frame_grid(frames: torch.Tensor, columns: int = PREVIEW_COLUMNS):
    """[3, T, H, W] in 0..1 -> one PIL image with the T frames in rows of `columns`."""
    from PIL import Image

    arr = (frames.permute(1, 2, 3, 0).float().cpu().numpy() * 255).astype("uint8")
    return tile_images([Image.fromarray(a) for a in arr], columns)


def tile_images(images: list, columns: int = PREVIEW_COLUMNS):
    from PIL import Image

    w, h = images[0].size
    cols = min(columns, len(images))
    rows = -(-len(images) // cols)
    grid = Image.new("RGB", (cols * w, rows * h))
    for i, im in enumerate(images):
        grid.paste(im.convert("RGB"), ((i % cols) * w, (i // cols) * h))
    return grid


def condition_track(i2v):
    """The I2V conditioning of every later frame of a video (a ConditionTrack): built once per I2V output (one VAE
    encode of ~117 frames) and kept on it, for LingBot Fast Continue and LingBot Play."""
    if i2v is not None and i2v.track is not None:  # ComfyUI's cached I2V output: built for an earlier video
        return i2v.track
    if i2v is None or i2v.vae is None or i2v.image is None:
        raise ValueError("the video's LingBot Image To Video input was not made with LingBot VAE Loader's VAE (a "
                         "native Load VAE cannot encode the later frames' conditioning); connect LingBot VAE Loader "
                         "to LingBot Image To Video and queue again")
    from ...world.vae import ConditionTrack, track_work_bytes
    from .video_setup import load_vae_to_device

    model = load_vae_to_device(i2v.vae, track_work_bytes(i2v.vae.model.cfg, i2v.height, i2v.width, i2v.tiled))
    i2v.track = ConditionTrack.build(model, i2v.image, i2v.height, i2v.width, tiled=i2v.tiled, have=i2v.y)
    return i2v.track

"""LingBot-World-Fast in ComfyUI: the Fast model loader and the LingBot Fast Sampler.

The loader only checks the file (Fast vs base from its config, every tensor from the headers); the sampler loads
the model through ComfyUI's model management (the experts' ExpertPatcher, so "free memory" and other models
evict it like an expert), plans the K/V cache for the video and the free VRAM/RAM (GPU, or pinned RAM streamed
one layer ahead), runs the chunks with progress per chunk x step and cancel between model calls, previews (every
latent frame so far at each step through ComfyUI's latent previewer, or each finished chunk decoded to frames with
the optional VAE), shows the frames and the memory plan on the node, and frees the cache when the run ends or is
cancelled. Output: a native LATENT (raw Wan 2.1 latent), like LingBot Sampler.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..loaders.expert_format import ExpertFormat, check_model_kind, detect_format
from ..loaders.expert_loader import check_expert_keys
from ..memory.kv_placement import CACHE_PLACEMENTS, FastMemoryError, place_kv_cache, plan_fast_memory
from ..memory.placement import _gb, available_ram_bytes
from ..wan.control.camera import camera_condition
from ..wan.dit.kv_cache import cache_layout
from ..wan.dit.model import pad_context
from ..wan.sampling.fast_sampler import CHUNK_FRAMES, STEP_INDICES, FastRun, draw, fast_frames, make_generator
from ..wan.sampling.sampler import Cancelled
from . import comfy_paths, host_memory
from .expert_weights import ExpertWeights, compute_bytes_for
from .memory import vram_comfy_can_free
from .payloads import CAMERA, CATEGORY, I2V, TEXT, VAE, WEIGHT_MODES, CameraInput, I2VCondition, TextEmbeds, VAEHandle
from .progress import show_on_node
from .ui_hints import hide_if, short_labels

log = logging.getLogger(__name__)

FAST_MODEL = "LINGBOT_FAST_MODEL"
NOISE_SOURCES = ("cpu", "cuda")
MAX_SEED = 0xFFFFFFFFFFFFFFFF
PREVIEW_COLUMNS = 4
FPS = 16


@dataclass
class FastModel:
    """LINGBOT_FAST_MODEL: the Fast model's patcher (loaded on demand by the sampler) and how to place its cache."""

    patcher: Any  # ExpertPatcher
    format: ExpertFormat
    weights: str
    kv_cache: str  # "auto" | "gpu" | "host"

    @property
    def config(self):
        return self.format.config


def fast_summary(frames, width: int, height: int, plan, notes: list) -> str:
    """The Fast sampler's text: what it generates (after its chunk rounding), where the model and the K/V cache
    live, then any adjustment."""
    est = plan.estimates
    line = (f"{width}x{height}, {frames.frames} frames ({frames.frames / FPS:.1f} s at {FPS} fps): {frames.chunks} "
            f"chunks x {len(STEP_INDICES)} steps")
    if est.get("vram_free") is None:
        where = f"model and K/V cache ({_gb(est['cache_bytes'])}) in RAM (CPU run)"
    elif plan.cache == "gpu":
        where = f"K/V cache ({_gb(est['cache_bytes'])}) on the GPU"
    else:
        where = (f"K/V cache ({_gb(est['cache_bytes'])}) in pinned RAM, {plan.cache_layers_on_gpu}/{est['num_layers']} "
                 f"layers on the GPU")
    if plan.blocks_on_gpu is not None:
        where += f", model block swap ({plan.blocks_on_gpu} blocks on the GPU)"
    return "\n".join([line, f"memory: {where}"] + [n for n in notes if n])


class LingBotFastLoader:
    """Pick the LingBot-World-Fast model. Nothing is loaded here: the Fast Sampler loads it through ComfyUI."""

    @classmethod
    def INPUT_TYPES(cls):
        from .loader_nodes import _combo

        names, opts = _combo(comfy_paths.list_experts(), "fast")
        return {
            "required": {
                "fast_model": (names, {**opts, **short_labels(), "tooltip": (
                    "The Fast model: lingbot_world_fast/ from huggingface.co/robbyant/lingbot-world-fast (placed in "
                    "the lingbot-world-base-cam folder; quantized to NF4 while loading) or its NF4 copy "
                    "(lingbot-world convert-expert), in models/lingbot_world or models/diffusion_models.")}),
                "weights": (list(WEIGHT_MODES), {"default": "nf4", "tooltip": (
                    "nf4: 4-bit weights on the GPU (about 9.6 GB). bf16: plain bf16 weights (37 GB; big GPUs).")}),
                "kv_cache": (list(CACHE_PLACEMENTS), {"default": "auto", "tooltip": (
                    "Where the K/V cache of the video lives (26.8 GB at 480x832x81): gpu (the reference's layout), "
                    "host (pinned RAM, each layer streamed to the GPU one layer ahead; for 16-24 GB cards), auto "
                    "(GPU when it fits; logs the plan).")}),
            }
        }

    RETURN_TYPES = (FAST_MODEL,)
    RETURN_NAMES = ("fast_model",)
    OUTPUT_TOOLTIPS = ("The Fast model, loaded on demand by LingBot Fast Sampler",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Selects LingBot-World-Fast (causal, 4 steps per chunk of 3 latent frames, no CFG) and where its "
                   "K/V cache lives.")

    def load(self, fast_model: str, weights: str = "nf4", kv_cache: str = "auto"):
        import comfy.model_management as mm

        from .patchers import ExpertContainer, ExpertPatcher

        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
        if kv_cache not in CACHE_PLACEMENTS:
            raise ValueError(f"kv_cache must be one of {CACHE_PLACEMENTS}, got {kv_cache!r}")
        path = comfy_paths.resolve_expert(fast_model, "Fast model")
        fmt = detect_format(path)
        note = check_model_kind(fmt, "fast")  # a base expert is refused here, with the fix
        if note:
            log.warning("LingBot-World: %s", note)
        check_expert_keys(fmt, weights)  # a missing or mis-shaped tensor is named now, not mid-load
        device = mm.get_torch_device()
        w = ExpertWeights("fast", fmt, weights)
        host_memory.track(w)  # dropped with ComfyUI's node cache: give its host copies back to the OS
        patcher = ExpertPatcher(ExpertContainer(w), device, torch.device("cpu"), size=w.device_bytes(device))
        log.info("LingBot-World Fast model: %s (%s), weights=%s, kv_cache=%s", path, fmt.kind, weights, kv_cache)
        return (FastModel(patcher, fmt, weights, kv_cache),)


class LingBotFastSampler:
    """Generates the video chunk by chunk with LingBot-World-Fast (reference schedule, no CFG)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "fast_model": (FAST_MODEL, {"tooltip": "From LingBot Fast Model Loader"}),
                "text": (TEXT, {"tooltip": "From LingBot Text Encode (the negative prompt is not used: no CFG)"}),
                "i2v": (I2V, {"tooltip": (
                    "From LingBot Image To Video. The Fast model generates whole chunks of 3 latent frames "
                    "(12 video frames): 81 frames stay 81, 25 become 21 (the log says so).")}),
                "seed": ("INT", {"default": 42, "min": 0, "max": MAX_SEED, "control_after_generate": True, "tooltip": (
                    "Noise seed (initial noise and every re-noise draw come from it).")}),
                "noise_source": (list(NOISE_SOURCES), {"default": "cpu", "tooltip": (
                    "cpu: the same noise on every machine. cuda: the reference's GPU generator (bit-identical to "
                    "the original scripts for the same seed; needs a CUDA GPU).")}),
                "max_attention": ("INT", {"default": 0, "min": 0, "max": 10_000_000, "step": 1560, "tooltip": (
                    "0 = attend to the whole video so far (the release). N > 0: each chunk attends to the latest N "
                    "cached tokens only (the reference's --max_attention_size; 1560 tokens = one latent frame at "
                    "480x832); the cache then keeps only those, so memory stays bounded.")}),
                "window": ("INT", {"default": 0, "min": 0, "max": 10_000, "tooltip": (
                    "NOT the released pipeline: keep only the latest N latent frames in the cache (0 = off), for "
                    "long videos in bounded memory.")}),
                "sink": ("INT", {"default": 0, "min": 0, "max": 10_000, **hide_if(window=[0]), "tooltip": (
                    "With a window: the first N latent frames are never evicted (NOT the released pipeline).")}),
            },
            "optional": {
                "camera": (CAMERA, {"tooltip": (
                    "Camera trajectory. Without it the camera layers are skipped (plain image-to-video).")}),
                "preview_vae": (VAE, {"tooltip": (
                    "Optional: decode each finished chunk with this VAE and preview its frames while the next chunk "
                    "samples (needs VRAM for the VAE's streaming caches, about 5 GB at 480p). Without it the preview "
                    "uses ComfyUI's latent previewer.")}),
            },
        }

    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("samples",)
    OUTPUT_TOOLTIPS = ("Raw Wan 2.1 latent video {'samples': [1,16,T,h,w]}; decode with LingBot VAE Decode",)
    FUNCTION = "sample"
    CATEGORY = CATEGORY
    DESCRIPTION = ("LingBot-World-Fast: 4 steps per chunk of 3 latent frames with a K/V cache, no CFG; progress per "
                   "chunk and step, a preview of every finished chunk, cancel between model calls.")

    def sample(self, fast_model: FastModel, text: TextEmbeds, i2v: I2VCondition, seed: int = 42,
               noise_source: str = "cpu", max_attention: int = 0, window: int = 0, sink: int = 0,
               camera: Optional[CameraInput] = None, preview_vae: Optional[VAEHandle] = None):
        import comfy.model_management as mm

        if noise_source not in NOISE_SOURCES:
            raise ValueError(f"noise_source must be one of {NOISE_SOURCES}, got {noise_source!r}")
        cfg = fast_model.config
        if text.positive.dim() != 2 or text.positive.shape[1] != cfg.text_dim:
            raise ValueError(f"the prompt embedding is {tuple(text.positive.shape)} but the Fast model takes "
                             f"[L, {cfg.text_dim}]: the text encoder does not belong to it (umT5-XXL gives 4096)")
        plan_frames = fast_frames(i2v.frames)
        if plan_frames.note:
            log.warning("LingBot-World Fast: %s", plan_frames.note)
        lat = plan_frames.latent_frames
        # The causal VAE encoder makes the first `lat` latent frames of the longer conditioning exactly these.
        y = i2v.y[:, :, :lat]
        plucker = None
        if camera is not None:
            cc = camera_condition(camera.poses, camera.intrinsics, i2v.height, i2v.width, i2v.frames,
                                  per_frame_intrinsics=camera.per_frame_intrinsics, latent_frames=lat)
            if cc.frames != i2v.frames:
                raise ValueError(
                    f"the camera trajectory covers {cc.frames} frames but the video has {i2v.frames}: connect the "
                    f"camera to LingBot Image To Video too (it then limits the frames), or set its frames to {cc.frames}")
            plucker = cc.plucker
        lat_h, lat_w = y.shape[3], y.shape[4]
        layout = cache_layout(lat, (lat_h // 2) * (lat_w // 2), CHUNK_FRAMES, window_frames=window or None,
                              sink_frames=sink, max_attention=max_attention or None)
        if layout.note:
            log.warning("LingBot-World Fast K/V cache: %s", layout.note)

        device = mm.get_torch_device()
        patcher = fast_model.patcher
        extra = 0
        if preview_vae is not None:
            from ..wan.vae.streaming import streaming_decode_bytes

            extra = streaming_decode_bytes(preview_vae.model.cfg, i2v.height, i2v.width)
        try:
            plan = plan_fast_memory(i2v.height, i2v.width, cfg, layout, vram_comfy_can_free(mm, device),
                                    available_ram_bytes(), weights=fast_model.weights, cache=fast_model.kv_cache,
                                    camera=plucker is not None, compute_bytes=compute_bytes_for(device, fast_model.weights),
                                    extra_vram=extra)
        except FastMemoryError as e:
            raise MemoryError(f"LingBot-World Fast: {e}") from None
        log.info("LingBot-World Fast memory plan: %s", plan.reason)
        show_on_node(fast_summary(plan_frames, i2v.width, i2v.height, plan, [plan_frames.note, layout.note]))
        weights = patcher.weights
        if patcher.is_loaded() and plan.blocks_on_gpu != weights.blocks_on_gpu:
            from .patchers import unload_patcher

            unload_patcher(patcher)  # placed differently last run
        weights.set_placement(False, plan.blocks_on_gpu)
        if not patcher.is_loaded():
            patcher.size = weights.device_bytes(patcher.load_device)
        est = plan.estimates
        beside = (plan.cache_layers_on_gpu * est["cache_layer_bytes"] + est["activation_bytes"]
                  + (est["text_kv_bytes"] if plan.cache_text else 0)
                  + (2 * est["cache_layer_bytes"] if plan.cache == "host" else 0))
        models = [patcher] + ([preview_vae.patcher] if preview_vae is not None else [])
        from .progress import load_progress

        weights.progress = load_progress()("fast")
        try:
            mm.load_models_gpu(models, memory_required=beside + extra, force_full_load=True)
        finally:
            weights.progress = None
        model = patcher.model.diffusion_model
        if model is None:
            raise RuntimeError("ComfyUI did not load the Fast model; see the log above")
        if plan.token_chunk is not None:
            model.set_token_chunk(plan.token_chunk)

        generator = make_generator(int(seed), noise_source)
        noise = draw(generator, (1, cfg.out_dim, lat, lat_h, lat_w), device)
        ctx = pad_context([text.positive], cfg.text_len).to(device)
        progress = FastProgress(plan_frames.chunks * len(STEP_INDICES), device, preview_vae)
        placement = place_kv_cache(plan, model, device, model.dtype_for_compute())
        log.info("LingBot-World Fast: %dx%d, %d frames (%d chunks), camera=%s", i2v.width, i2v.height,
                 plan_frames.frames, plan_frames.chunks, camera.label if camera is not None else "none")
        try:
            # y and the camera stay in host memory; each chunk's slice moves to the device when it runs
            run = FastRun(model, noise, ctx, y, plucker, placement.cache, generator, device=device,
                          callback=progress.step, on_chunk=progress.chunk_done, cancel_check=mm.processing_interrupted)
            with torch.inference_mode():
                x = run.run()
        except Cancelled:
            mm.throw_exception_if_processing_interrupted()
            raise mm.InterruptProcessingException()
        finally:
            placement.close()
            progress.close()
            del placement
            mm.soft_empty_cache()
        progress.finish()
        latent = i2v.to_raw_latent(x).to(mm.intermediate_device())
        del x
        return ({"samples": latent},)


class FastProgress:
    """Progress per chunk x step, and previews. Without a VAE: at each step, every latent frame generated so far
    (the finished chunks and the current chunk's x0) as one grid through ComfyUI's latent previewer, like LingBot
    Sampler's whole-clip preview. With a VAE: each finished chunk decoded to its frames, tiled into one image."""

    def __init__(self, total: int, device, vae: Optional[VAEHandle]):
        from .progress import SamplingProgress

        self.total = total
        self.bar = SamplingProgress(total, device)  # ComfyUI's bar and the whole-clip latent preview
        self.pbar = self.bar.pbar
        self.decoder = None
        self.failed = False
        self.finished: list[torch.Tensor] = []  # x0 of the finished chunks (FastRun keeps them anyway)
        if vae is not None:
            from ..wan.vae.streaming import StreamingDecoder

            self.decoder = StreamingDecoder(vae.model)
        self.done = 0

    def step(self, info) -> None:
        self.done = info.index + 1
        preview = None
        if self.decoder is None:
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

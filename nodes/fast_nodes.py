"""LingBot-World-Fast in ComfyUI: the Fast model loader and the LingBot Fast Sampler.

The loader only checks the file (Fast vs base from its config, every tensor from the headers); the sampler loads
the model through ComfyUI's model management (the experts' ExpertPatcher, so "free memory" and other models
evict it like an expert), plans the K/V cache for the video and the free VRAM/RAM (GPU, or pinned RAM streamed
one layer ahead), runs the chunks with progress per chunk x step and cancel between model calls, previews (every
latent frame so far at each step through ComfyUI's latent previewer, or each finished chunk decoded to frames with
the optional VAE), shows the frames and the memory plan on the node, and frees the cache when the run ends or is
cancelled. Output: a native LATENT (raw Wan 2.1 latent), like LingBot Sampler, and the video's state for LingBot
Fast Continue (fast_continue_node.py), which runs its parts through the same `run_fast_part`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..loaders.expert_format import ExpertFormat, check_model_kind, detect_format
from ..loaders.expert_loader import check_expert_keys
from ..memory.kv_placement import CACHE_PLACEMENTS, FastMemoryError, place_kv_cache, plan_fast_memory
from ..memory.kv_park import park
from ..memory.placement import _gb, available_ram_bytes
from ..wan.control.camera import usable_frames
from ..wan.dit.model import pad_context
from ..wan.sampling.fast_sampler import STEP_INDICES
from ..wan.sampling.fast_state import (FAST_MODES, CameraSource, FastSettings, finish_part, plan_first_part,
                                       start_part)
from ..wan.sampling.sampler import Cancelled
from . import comfy_paths, host_memory
from .expert_weights import ExpertWeights, compute_bytes_for
from .memory import vram_comfy_can_free
from .payloads import CAMERA, CATEGORY, I2V, TEXT, VAE, WEIGHT_MODES, CameraInput, I2VCondition, TextEmbeds, VAEHandle
from .progress import show_on_node
from .ui_hints import hide_if, short_labels

log = logging.getLogger(__name__)

FAST_MODEL = "LINGBOT_FAST_MODEL"
FAST_STATE = "LINGBOT_FAST_STATE"
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


def fast_summary(frames, width: int, height: int, plan, notes: list, so_far: int = 0) -> str:
    """The Fast nodes' text: what they generate (after the chunk rounding; `so_far` frames before it for a
    continued video), where the model and the K/V cache live, then any adjustment."""
    est = plan.estimates
    if so_far:
        total = so_far + frames.frames
        line = (f"{width}x{height}, {frames.frames} new frames after {so_far} ({total} frames, {total / FPS:.1f} s "
                f"at {FPS} fps): {frames.chunks} chunks x {len(STEP_INDICES)} steps")
    else:
        line = (f"{width}x{height}, {frames.frames} frames ({frames.frames / FPS:.1f} s at {FPS} fps): "
                f"{frames.chunks} chunks x {len(STEP_INDICES)} steps")
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


def state_line(parked_bytes: int, shared: bool) -> str:
    """The node text's last line when a node keeps its state (the RAM it holds until ComfyUI drops it)."""
    whose = "the chain's K/V cache (shared by its states)" if shared else "its own K/V cache"
    return f"state kept for LingBot Fast Continue: {whose}, {_gb(parked_bytes)} in RAM"


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
                    "Camera trajectory, or keys from LingBot Actions. Without it the camera layers are skipped "
                    "(plain image-to-video).")}),
                "preview_vae": (VAE, {"tooltip": (
                    "Optional: decode each finished chunk with this VAE and preview its frames while the next chunk "
                    "samples (needs VRAM for the VAE's streaming caches, about 5 GB at 480p). Without it the preview "
                    "uses ComfyUI's latent previewer.")}),
                "rule": (list(FAST_MODES), {"default": "reference", "tooltip": (
                    "reference: this part is the released pipeline's run (noise for the whole part up front, the "
                    "camera normalised over the whole part); LingBot Fast Continue follows the continuable rule "
                    "after it. continuable: rules that never look ahead, so Sampler -> Continue -> Continue gives "
                    "exactly one run of the concatenated keys (README 'Continue a Fast run').")}),
            },
            "hidden": {"prompt": "PROMPT", "unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("LATENT", FAST_STATE)
    RETURN_NAMES = ("samples", "state")
    OUTPUT_TOOLTIPS = (
        "Raw Wan 2.1 latent video {'samples': [1,16,T,h,w]}; decode with LingBot VAE Decode",
        "The video's state (K/V cache in RAM, generator, camera) for LingBot Fast Continue; kept only when a node "
        "takes it (26.8 GB of RAM at 480p x 81 frames)",
    )
    FUNCTION = "sample"
    CATEGORY = CATEGORY
    DESCRIPTION = ("LingBot-World-Fast: 4 steps per chunk of 3 latent frames with a K/V cache, no CFG; progress per "
                   "chunk and step, a preview of every finished chunk, cancel between model calls. Its state output "
                   "continues the video in LingBot Fast Continue.")

    def sample(self, fast_model: FastModel, text: TextEmbeds, i2v: I2VCondition, seed: int = 42,
               noise_source: str = "cpu", max_attention: int = 0, window: int = 0, sink: int = 0,
               camera: Optional[CameraInput] = None, preview_vae: Optional[VAEHandle] = None,
               rule: str = "reference", prompt: Optional[dict] = None, unique_id: Optional[str] = None):
        import comfy.model_management as mm

        from .fast_continue_node import FastStateHandle, state_output_used

        if noise_source not in NOISE_SOURCES:
            raise ValueError(f"noise_source must be one of {NOISE_SOURCES}, got {noise_source!r}")
        cfg = fast_model.config
        check_text(text, cfg)
        keep = state_output_used(prompt, unique_id)
        device = mm.get_torch_device()
        settings = fast_settings(fast_model, device, i2v.height, i2v.width, int(seed), noise_source, rule,
                                 window or None, sink, max_attention or None, keep=keep, tiled=i2v.tiled)
        source = camera_source(camera)
        if camera is not None:
            covered, _ = usable_frames(camera.num_frames, i2v.frames)
            if covered != i2v.frames:
                raise ValueError(
                    f"the camera trajectory covers {covered} frames but the video has {i2v.frames}: connect the "
                    f"camera to LingBot Image To Video too (it then limits the frames), or set its frames to {covered}")
        part = plan_first_part(source, i2v.frames, settings)
        if part.note:
            log.warning("LingBot-World Fast: %s", part.note)
        # The causal VAE encoder makes the first latent frames of the longer conditioning exactly these.
        y = i2v.y[:, :, :part.latent_frames]
        ctx = pad_context([text.positive], cfg.text_len).to(device)
        handle = None

        def make_run(model, cache, **kw):
            # the last chunk's context pass only feeds a continuation: skipped when nothing takes the state
            return start_part(model, part, settings, y, ctx, cache, None, device=device, final_context=keep, **kw)

        def after(run, placement, ok: bool):
            nonlocal handle
            if ok and keep:
                state = finish_part(run, part, settings, None, context=text.positive, prompt=text.prompt,
                                    label=camera.label if camera is not None else "none")
                handle = FastStateHandle.first(state, park(placement), fast_model, i2v)

        log.info("LingBot-World Fast: %dx%d, %d frames (%d chunks), camera=%s, rule=%s", i2v.width, i2v.height,
                 part.frames, part.chunks, camera.label if camera is not None else "none", rule)
        z, summary = run_fast_part(fast_model, settings, settings.layout(part.latent_frames), part, preview_vae,
                                   make_run, after=after)
        if handle is not None:
            show_on_node(f"{summary}\n{state_line(handle.store.nbytes, shared=not handle.store.evicting)}")
        latent = i2v.to_raw_latent(z).to(mm.intermediate_device())
        del z
        return ({"samples": latent}, handle if handle is not None else FastStateHandle.empty(fast_model, i2v))


def check_text(text: TextEmbeds, cfg) -> None:
    if text.positive.dim() != 2 or text.positive.shape[1] != cfg.text_dim:
        raise ValueError(f"the prompt embedding is {tuple(text.positive.shape)} but the Fast model takes "
                         f"[L, {cfg.text_dim}]: the text encoder does not belong to it (umT5-XXL gives 4096)")


def fast_settings(fast_model: FastModel, device, height: int, width: int, seed: int, noise_source: str, rule: str,
                  window: Optional[int], sink: int, max_attention: Optional[int], *, keep: bool,
                  tiled: bool = False) -> FastSettings:
    from ..loaders.fast_state_file import model_fingerprint, model_label
    from ..quant.nf4 import default_compute_dtype

    dtype = torch.bfloat16 if fast_model.weights == "bf16" else default_compute_dtype(device)
    return FastSettings(height, width, seed, noise_source, rule, window=window, sink=sink, max_attention=max_attention,
                        weights=fast_model.weights, cache_dtype=str(dtype).replace("torch.", ""),
                        model=model_fingerprint(fast_model.format) if keep else "",
                        model_label=model_label(fast_model.format), vae_tiled=tiled)


def camera_source(camera: Optional[CameraInput]) -> CameraSource:
    """The Sampler's / Continue's camera input as a part's control: keys when it was built from keys."""
    if camera is None:
        return CameraSource()
    if camera.keys is not None:
        return CameraSource(keys=camera.keys, intrinsics=camera.intrinsics[:1], label=camera.label)
    return CameraSource(poses=camera.poses, intrinsics=camera.intrinsics,
                        per_frame_intrinsics=camera.per_frame_intrinsics, label=camera.label)


def run_fast_part(fast_model: FastModel, settings: FastSettings, layout, part, preview_vae: Optional[VAEHandle],
                  make_run, *, after=None, fill=None, restore=None, z_before: Optional[torch.Tensor] = None,
                  so_far: int = 0) -> tuple[torch.Tensor, str]:
    """Plan the memory, load the model through ComfyUI, place the cache (restored with fill/restore for a
    continued video of `so_far` frames), run the part's (fast_state.PartPlan) chunks with progress, previews and
    cancel; the node shows the frames and the plan. after(run, placement, ok) runs before the cache is freed (ok
    False when the run stopped). Returns the part's latent (normalised, device) and the node text shown."""
    import comfy.model_management as mm

    cfg = fast_model.config
    device = mm.get_torch_device()
    patcher = fast_model.patcher
    h, w = settings.height, settings.width
    extra = 0
    if preview_vae is not None:
        from ..wan.vae.streaming import streaming_decode_bytes

        extra = streaming_decode_bytes(preview_vae.model.cfg, h, w)
    if layout.note:
        log.warning("LingBot-World Fast K/V cache: %s", layout.note)
    try:
        plan = plan_fast_memory(h, w, cfg, layout, vram_comfy_can_free(mm, device), available_ram_bytes(),
                                weights=fast_model.weights, cache=fast_model.kv_cache, camera=part.camera is not None,
                                compute_bytes=compute_bytes_for(device, fast_model.weights), extra_vram=extra)
    except FastMemoryError as e:
        raise MemoryError(f"LingBot-World Fast: {e}") from None
    log.info("LingBot-World Fast memory plan: %s", plan.reason)
    summary = fast_summary(part, w, h, plan, [part.note, layout.note], so_far)
    show_on_node(summary)
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

    progress = FastProgress(part.chunks * len(STEP_INDICES), device, preview_vae, z_before)
    try:
        placement = place_kv_cache(plan, model, device, model.dtype_for_compute(), fill=fill)
    except BaseException:
        progress.close()
        raise
    run = None
    ok = False
    try:
        if restore is not None:
            restore(placement.cache)
        # y and the camera stay in host memory; each chunk's slice moves to the device when it runs
        run = make_run(model, placement.cache, callback=progress.step, on_chunk=progress.chunk_done,
                       cancel_check=mm.processing_interrupted)
        with torch.inference_mode():
            x = run.run()
        ok = True
    except Cancelled:
        mm.throw_exception_if_processing_interrupted()
        raise mm.InterruptProcessingException()
    finally:
        try:
            if after is not None:
                after(run, placement, ok)
        finally:
            placement.close()
            progress.close()
            del placement
            mm.soft_empty_cache()
    progress.finish()
    return x, summary


class FastProgress:
    """Progress per chunk x step, and previews. Without a VAE: at each step, every latent frame of the part so far
    (the finished chunks and the current chunk's x0) as one grid through ComfyUI's latent previewer, like LingBot
    Sampler's whole-clip preview. With a VAE: each finished chunk decoded to its frames, tiled into one image (a
    continued part's decoder is first warmed up on the video before it, `z_before`, so its frames are exact)."""

    def __init__(self, total: int, device, vae: Optional[VAEHandle], z_before: Optional[torch.Tensor] = None):
        from .progress import SamplingProgress

        self.total = total
        self.bar = SamplingProgress(total, device)  # ComfyUI's bar and the whole-clip latent preview
        self.pbar = self.bar.pbar
        self.decoder = None
        self.failed = False
        self.finished: list[torch.Tensor] = []  # x0 of the finished chunks (FastRun keeps them anyway)
        if vae is not None:
            from ..wan.vae.streaming import StreamingDecoder, warm_up

            self.decoder = StreamingDecoder(vae.model)
            if z_before is not None:  # a continued video: its chunks decode as in the whole video
                try:
                    with torch.inference_mode():
                        warm_up(self.decoder, z_before.to(vae.model.device))
                except Exception as e:  # a preview must never stop a generation
                    self.failed = True
                    log.warning("LingBot-World: chunk previews disabled for this run: %s", e)
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

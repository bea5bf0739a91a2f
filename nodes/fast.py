"""LingBot-World-Fast in ComfyUI: the Fast model loader, LingBot Fast Sampler, LingBot Fast Continue and LingBot Fast
LoRA Loader.

The loader only checks the file (Fast vs base from its config, every tensor from the headers); the sampler runs
the first part of a video through the World session (adapters/fast_host.py: the model placed by ComfyUI's model
management, the K/V cache planned for the video and the free VRAM/RAM), with progress per chunk x step, cancel
between model calls and previews, and shows the frames and the memory plan on the node. Output: a native LATENT
(raw Wan 2.1 latent), like LingBot Sampler, and the video's state for LingBot Fast Continue.

LingBot Fast Sampler -> Fast Continue -> Fast Continue ...: each Continue goes on with new keys (or a new camera)
from the state of the node before it, adds whole chunks (the model's chunk: 12 frames for v1, 16 for v2), shows its chunks as they come (progress,
previews), and outputs the whole video so far, the new part alone and the state. Each part runs through the World
session too; how the states of one chain share one K/V cache in RAM, how a Continue puts the parked cache back
and finds the conditioning of later frames: adapters/fast_state_store.py.

LingBot Fast LoRA Loader: a Wan 14B LoRA on the Fast model, applied on its NF4 weights when it loads (the same
patching as the experts' LoRAs: low-rank terms beside the NF4 GEMMs, stackable).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Optional

import torch

from ..world import assembly
from ..world.cameras import usable_frames
from ..world.hosted import HostedWorld, ParkedKVError, PartRequest
from ..world.session import FixedCondition
from ..world.settings import CACHE_PLACEMENTS, FAST_MODES, MODEL_DEFAULT, WorldSettings
from .adapters import comfy_paths, host_memory, model_check, model_fetch
from .adapters.expert_weights import ExpertWeights
from .adapters.fast_host import (FAST_MODEL, FAST_STATE, NOISE_SOURCES, FastModel, camera_source, open_fast_world,
                                 run_fast_part)
from .adapters.fast_state_store import (FastStateHandle, KVStore, ParkedCacheRestore, continuation_condition,
                                        state_line, state_output_used)
from .adapters.lora_attach import patcher_with_lora
from .adapters.model_fetch import DOWNLOAD
from .adapters.payloads import (CAMERA, CATEGORY, CONTEXT_KEY, FAST_WEIGHT_MODES, I2V, SPEED, TEXT, VAE, CameraInput,
                                I2VCondition, TextEmbeds, VAEHandle, latent_payload)
from .adapters.progress import show_on_node
from .adapters.ui_hints import hide_if, short_labels

log = logging.getLogger(__name__)

MAX_SEED = 0xFFFFFFFFFFFFFFFF


class LingBotFastLoader:
    """Pick the LingBot-World-Fast model. Nothing is loaded here: the Fast Sampler loads it through ComfyUI."""

    @classmethod
    def INPUT_TYPES(cls):
        from .adapters.comfy_paths import _combo

        names, opts = _combo(comfy_paths.list_experts(), "fast")
        return {
            "required": {
                "fast_model": (names, {**opts, **short_labels(), "tooltip": (
                    "A causal model, told from its weights: v1 Fast (lingbot-world-base-cam/lingbot_world_fast, "
                    "huggingface.co/robbyant/lingbot-world-fast, Apache-2.0), v2 14B "
                    "(lingbot-world-v2-14b-causal-fast/transformers) or v2 1.3B (lingbot-world-v2-1.3b-causal-fast); "
                    "the v2 weights are licensed CC BY-NC-SA 4.0 (non-commercial use only). A release folder is "
                    "read through its NF4 (or FP8 / INT8) copy, made beside it on the first load; a model not "
                    "installed yet is downloaded with the download switch on. In models/lingbot_world or "
                    "models/diffusion_models.")}),
                "weights": (list(FAST_WEIGHT_MODES), {"default": "nf4", "tooltip": (
                    "nf4: 4-bit weights on the GPU (14B: about 9.6 GB); a release folder's NF4 copy is made beside "
                    "it on the first load. bf16: plain bf16 weights (14B: 37 GB; big GPUs). fp8: FP8 weights (14B: "
                    "18.6 GB), GEMMs in FP8 on Ada / Hopper GPUs (RTX 40xx, H100). int8: INT8 weights (same size), "
                    "GEMMs in INT8 on Ampere and newer (RTX 30xx). The FP8 / INT8 copy of a release folder is made "
                    "once beside it (<folder>_fp8, <folder>_int8), or pick a copy made by `convert-fp8` / "
                    "`convert-int8`.")}),
                "kv_cache": (list(CACHE_PLACEMENTS), {"default": "auto", "tooltip": (
                    "Where the K/V cache of the video lives (26.8 GB at 480x832x81): gpu (the reference's layout), "
                    "host (pinned RAM, each layer streamed to the GPU one layer ahead; for 16-24 GB cards), auto "
                    "(GPU when it fits; logs the plan).")}),
            },
            "optional": {
                "speed": (SPEED, {"tooltip": (
                    "From LingBot Speed Options: a speed preset (exact, auto, fast, draft) or compile / GEMM precision "
                    "/ attention. fast and draft keep the K/V cache in FP8 (half the RAM); draft also runs 3 steps "
                    "per chunk, folds the context pass into the last step and keeps a 15-frame window. Without it: "
                    "the exact defaults.")}),
                "download": DOWNLOAD,
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, fast_model=None, download=None):
        """At queue time: the model is installed (or the download switch fetches it) and is a causal model (the
        pack's message names the folder, where it comes from and its licence)."""
        return model_check.expert("fast_model", fast_model, want="fast", download=bool(download))

    RETURN_TYPES = (FAST_MODEL,)
    RETURN_NAMES = ("fast_model",)
    OUTPUT_TOOLTIPS = ("The Fast model, loaded on demand by LingBot Fast Sampler",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Selects a causal LingBot-World model (v1 Fast, Apache-2.0; v2 14B or 1.3B, CC BY-NC-SA 4.0: "
                   "non-commercial) and where its K/V cache lives; downloads it when missing (download switch) and "
                   "makes its NF4 / FP8 / INT8 copy once.")

    def load(self, fast_model: str, weights: str = "nf4", kv_cache: str = "auto", speed=None, download: bool = False):
        import comfy.model_management as mm

        from .adapters.patchers import ExpertContainer, ExpertPatcher

        if weights not in FAST_WEIGHT_MODES:
            raise ValueError(f"weights must be one of {FAST_WEIGHT_MODES}, got {weights!r}")
        if kv_cache not in CACHE_PLACEMENTS:
            raise ValueError(f"kv_cache must be one of {CACHE_PLACEMENTS}, got {kv_cache!r}")
        device = mm.get_torch_device()
        chosen = model_fetch.read_folder(fast_model, "fast_model", weights, download, device)
        path = chosen.path
        # the model told from its weights (a base expert refused with the fix), every tensor checked now
        checked = assembly.check_dit(path, WorldSettings(weights=weights), device)
        fmt = checked.fmt
        assembly.check_weights_mode(weights, device)  # a card without them: one line now, not a failed GEMM later
        if speed is not None and speed.compute != "bf16" and weights != "nf4":
            raise ValueError(f"LingBot Speed Options asks for compute={speed.compute}, which works with NF4 weights; "
                             "use weights nf4 or compute bf16")
        speed = assembly.fit_speed(checked, speed)  # a narrow model runs compile auto eagerly
        w = ExpertWeights("fast", fmt, weights, speed=speed)  # the speed options go on after every load
        host_memory.track(w)  # dropped with ComfyUI's node cache: give its host copies back to the OS
        patcher = ExpertPatcher(ExpertContainer(w), device, torch.device("cpu"), size=w.device_bytes(device))
        log.info("LingBot-World: %s from %s (%s), weights=%s, kv_cache=%s", checked.entry.describe(), path, fmt.kind,
                 weights, kv_cache)
        show_on_node(f"{checked.entry.title}: {chosen.said}; {checked.entry.licence.line()}")
        return (FastModel(patcher, checked, weights, kv_cache, speed),)


class LingBotFastSampler:
    """Generates the video chunk by chunk with LingBot-World-Fast (reference schedule, no CFG)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "fast_model": (FAST_MODEL, {"tooltip": "From LingBot Fast Model Loader"}),
                "text": (TEXT, {"tooltip": "From LingBot Text Encode (the negative prompt is not used: no CFG)"}),
                "i2v": (I2V, {"tooltip": (
                    "From LingBot Image To Video. A causal model generates whole chunks (v1 Fast: 12 video "
                    "frames, v2: 16): a length between two chunks is cut to the last whole one (the node says so).")}),
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
                    "Keep only the latest N latent frames in the cache, for long videos in bounded memory. 0 = the "
                    "model's release: v1 Fast caches the whole video, v2 keeps 18 with a sink of 6.")}),
                "sink": ("INT", {"default": 0, "min": 0, "max": 10_000, **hide_if(window=[0]), "tooltip": (
                    "With a window: the first N latent frames are never evicted.")}),
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
                "previews": ("BOOLEAN", {"default": True, "advanced": True, "tooltip": (
                    "Show every latent frame (or, with preview_vae, each decoded chunk) on the node while it "
                    "samples, even with ComfyUI's previews off; off saves the preview work.")}),
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
    DESCRIPTION = ("A causal LingBot-World model (v1 Fast, v2): 4 steps per chunk with a K/V cache, no CFG; progress per "
                   "chunk and step, a preview of every finished chunk, cancel between model calls. Its state output "
                   "continues the video in LingBot Fast Continue.")

    def sample(self, fast_model: FastModel, text: TextEmbeds, i2v: I2VCondition, seed: int = 42,
               noise_source: str = "cpu", max_attention: int = 0, window: int = 0, sink: int = 0,
               camera: Optional[CameraInput] = None, preview_vae: Optional[VAEHandle] = None,
               rule: str = "reference", prompt: Optional[dict] = None, unique_id: Optional[str] = None,
               previews: bool = True):
        import comfy.model_management as mm

        if noise_source not in NOISE_SOURCES:
            raise ValueError(f"noise_source must be one of {NOISE_SOURCES}, got {noise_source!r}")
        fast_model.check_text(text.positive)
        keep = state_output_used(prompt, unique_id)
        # the node's inputs as the world's typed settings
        settings = fast_model.settings(seed=int(seed), noise=noise_source, rule=rule, window=window or MODEL_DEFAULT,
                                       sink=sink if window else MODEL_DEFAULT, max_attention=max_attention or None,
                                       vae_tiled=i2v.tiled)
        world = HostedWorld(fast_model.checked, settings, mm.get_torch_device())
        request = PartRequest(height=i2v.height, width=i2v.width, frames=i2v.frames, keep=keep)
        video = world.video(request)
        source = camera_source(camera)
        if camera is not None:
            covered, _ = usable_frames(camera.num_frames, i2v.frames)
            if covered != i2v.frames:
                raise ValueError(
                    f"the camera trajectory covers {covered} frames but the video has {i2v.frames}: connect the "
                    f"camera to LingBot Image To Video too (it then limits the frames), or set its frames to {covered}")
        part = world.first_part(source, request, video)
        if part.note:
            log.warning("LingBot-World Fast: %s", part.note)
        label = camera.label if camera is not None else "none"
        log.info("LingBot-World Fast: %dx%d, %d frames (%d chunks), camera=%s, rule=%s", i2v.width, i2v.height,
                 part.frames, part.chunks, label, rule)
        session, summary = open_fast_world(fast_model, world, video, part.latent_frames, part, preview_vae,
                                           show=show_on_node)
        # The causal VAE encoder makes the first latent frames of the longer conditioning exactly these.
        session.begin(FixedCondition(i2v.y[:, :, :part.latent_frames]), text.positive, text.prompt)
        handle = None

        def after(session, ok: bool):
            nonlocal handle
            if ok and keep:
                handle = FastStateHandle.first(session.state, session.park(), fast_model, i2v)

        z = run_fast_part(session, part, source, i2v.frames, preview_vae, keep=keep, after=after, label=label,
                          previews=previews)
        if handle is not None:
            show_on_node(f"{summary}\n{state_line(handle.store.nbytes, shared=not handle.store.evicting)}")
        latent = i2v.to_raw_latent(z).to(mm.intermediate_device())
        del z
        return (latent_payload(latent, fast_model.speed),
                handle if handle is not None else FastStateHandle.empty(fast_model, i2v))


class LingBotFastContinue:
    """Continues a Fast video from a state with new keys or a new camera; outputs the video so far and the state."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "state": (FAST_STATE, {"tooltip": (
                    "From LingBot Fast Sampler, another LingBot Fast Continue or LingBot Play")}),
                "frames": ("INT", {"default": 0, "min": 0, "max": 1200, "step": 4, "tooltip": (
                    "New frames, in whole chunks (12 frames for v1 Fast, 16 for v2). 0 = as long as the keys / camera (one chunk without "
                    "either). Keys longer than this are cut, shorter ones padded with frames without keys.")}),
            },
            "optional": {
                "camera": (CAMERA, {"tooltip": (
                    "Keys from LingBot Actions (the walk goes on from where the video is), or a camera preset / "
                    "trajectory (its first pose is put where the video is). Without it the camera stands still "
                    "(or stays off if the video had none).")}),
                "text": (TEXT, {"tooltip": "Optional: a new prompt from this part on (default: the video's prompt)"}),
                "preview_vae": (VAE, {"tooltip": (
                    "Optional: preview each finished chunk as decoded frames (exactly the frames of the whole video)")}),
            },
            "hidden": {"prompt": "PROMPT", "unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("LATENT", "LATENT", FAST_STATE)
    RETURN_NAMES = ("samples", "segment", "state")
    OUTPUT_TOOLTIPS = (
        "The whole video so far (raw Wan 2.1 latent); decode with LingBot VAE Decode",
        "Only the new part: LingBot VAE Decode gives exactly its frames of the whole video (it carries latent "
        "frames before it for the decoder's context; other decoders would decode those too)",
        "The state after this part, for the next LingBot Fast Continue",
    )
    FUNCTION = "extend"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Continues a LingBot-World-Fast video with new keys or a new camera from the state of the node "
                   "before it; chain several to walk on step by step. Memory: see the README, 'Continue a Fast run'.")

    def extend(self, state: FastStateHandle, frames: int = 0, camera: Optional[CameraInput] = None,
               text: Optional[TextEmbeds] = None, preview_vae: Optional[VAEHandle] = None,
               prompt: Optional[dict] = None, unique_id: Optional[str] = None):
        import comfy.model_management as mm

        handle = state
        if not isinstance(handle, FastStateHandle):
            raise ValueError("state must come from LingBot Fast Sampler, LingBot Fast Continue or LingBot Play")
        if handle.state is None:
            raise ValueError("LingBot Fast Continue: " + (handle.why or (
                "the Fast Sampler did not keep its state (nothing was connected to its state output when it ran, so "
                "its K/V cache was freed); change any input of the Sampler (e.g. the seed) or press 'Free model and "
                "node cache', then queue again")))
        handle.store.check(handle)
        st = handle.state
        fast_model = handle.model
        # the video's own settings come from its state; the model's (weights, cache, speed) from the loader
        world = HostedWorld(fast_model.checked, fast_model.settings(), mm.get_torch_device())
        if text is not None:
            fast_model.check_text(text.positive)
        source = camera_source(camera)
        part = world.next_part(st, source, int(frames) or None)
        if part.note:
            log.warning("LingBot-World Fast Continue: %s", part.note)
        st.condition = continuation_condition(handle)
        keep = state_output_used(prompt, unique_id, 2)
        store = handle.store
        parked = store.take(handle)
        move = not store.evicting
        new_handle: Optional[FastStateHandle] = None
        label = camera.label if camera is not None else ("none (standing still)" if st.has_camera else "none")
        log.info("LingBot-World Fast Continue: %d frames so far + %d (%d chunks), camera=%s", st.frames, part.frames,
                 part.chunks, label)

        def after(session, ok: bool):
            nonlocal new_handle
            if ok:
                new_handle = FastStateHandle(session.state, fast_model, handle.i2v)
                if move and keep:  # the chain's cache grows by this part
                    store.put(session.park(), new_handle.id)
                    new_handle.store = store
                elif move:  # nobody continues this part: the cache goes back as the input state had it
                    session.rewind(1)
                    store.put(session.park(), None)
                elif keep:  # a window: this state gets its own copy
                    new_handle.store = KVStore(session.park(), new_handle.id, True)
            elif move and session.cache is not None:  # stopped: the input state keeps its cache (nothing evicted)
                try:
                    store.put(session.park(), None)
                except (ParkedKVError, ValueError) as e:
                    store.lost = str(e)

        z_before = st.latent()
        try:
            session, summary = open_fast_world(fast_model, world, st.settings, st.latent_frames + part.latent_frames,
                                               part, preview_vae, so_far=st.frames, show=show_on_node)
            session.resume(st, ParkedCacheRestore(parked, move))
            if text is not None:
                session.context, session.prompt = text.positive.detach().to("cpu", torch.float32), text.prompt
            z = run_fast_part(session, part, source, int(frames) or None, preview_vae, keep=keep, after=after,
                              z_before=z_before, label=label)
        except BaseException as e:
            if move and store.parked is None:
                if parked.complete:  # it never left: nothing was restored yet
                    store.put(parked, None)
                else:  # the cache left the store and did not come back
                    store.lost = f"{type(e).__name__}: {e}"[:200]
            raise
        z = z.detach().to("cpu", torch.float32)
        i2v = handle.i2v
        whole = torch.cat([z_before, z], dim=2)
        from ..world.vae import context_latents

        n_ctx = context_latents(i2v.vae.model.cfg, z_before.shape[2]) if i2v.vae is not None else z_before.shape[2]
        segment = latent_payload(i2v.to_raw_latent(torch.cat([z_before[:, :, z_before.shape[2] - n_ctx:], z], dim=2)),
                                 fast_model.speed, **{CONTEXT_KEY: n_ctx})
        out = new_handle if (keep and new_handle is not None) else FastStateHandle.empty(fast_model, i2v)
        if out.store is not None:
            show_on_node(f"{summary}\n{state_line(out.store.nbytes, shared=not out.store.evicting)}")
        return (latent_payload(i2v.to_raw_latent(whole).to(mm.intermediate_device()), fast_model.speed), segment, out)


class LingBotFastLoraLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "fast_model": (FAST_MODEL, {"tooltip": "From LingBot Fast Model Loader (or another Fast LoRA Loader)"}),
                "lora_name": (comfy_paths.list_loras(), {**short_labels(), "tooltip": (
                    "A .safetensors LoRA from models/loras (ComfyUI, diffusers, kohya/musubi or PEFT keys) made for "
                    "a Wan 2.1/2.2 14B model. Pickled .pt/.ckpt files are refused.")}),
                "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01, "tooltip": (
                    "LoRA strength (0 = no LoRA). Stack several loaders for several LoRAs.")}),
            }
        }

    RETURN_TYPES = (FAST_MODEL,)
    RETURN_NAMES = ("fast_model",)
    OUTPUT_TOOLTIPS = ("The Fast model with the LoRA attached (applied when it loads)",)
    FUNCTION = "load"
    CATEGORY = CATEGORY
    DESCRIPTION = "Puts a Wan 14B LoRA on the LingBot-World Fast model; refuses LoRAs made for other models."

    def load(self, fast_model: FastModel, lora_name: str, strength: float = 1.0):
        if not isinstance(fast_model, FastModel):
            raise ValueError("fast_model must come from LingBot Fast Model Loader")
        if float(strength) == 0.0:
            show_on_node("strength 0: the model is passed on unchanged")
            return (fast_model,)
        patcher, lora = patcher_with_lora(fast_model.patcher, lora_name, strength)
        show_on_node(lora.report())
        return (replace(fast_model, patcher=patcher),)

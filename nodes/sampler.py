"""The LingBot-World sampler node: dual-expert flow sampling with ComfyUI progress, previews and cancel."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ..world.controls import ACT as ACT_KIND, CAMERA as CAMERA_KIND, act_condition, camera_condition, check_control
from ..wan.dit.model import pad_context
from ..wan.sampling.sampler import SamplingSettings, make_noise, sample
from ..world.errors import Cancelled
from ..world.settings import CAMERA_CACHE_CHOICES, CFG_MODES
from .adapters import cfg_parallel as cfg_parallel_mod
from .adapters.conditioning import text_from_conditioning
from .adapters.memory import ComfyExpertProvider, camera_cache_for, plan_for, vram_comfy_can_free
from .adapters.payloads import (ACT, CAMERA, CATEGORY, EXPERTS, I2V, TEXT, ActInput, CameraInput, ExpertPair,
                                I2VCondition, TextEmbeds, latent_payload)

log = logging.getLogger(__name__)

SOLVERS = ("unipc", "dpm++")
NOISE_SOURCES = ("cpu", "cuda")
CFG_PARALLEL = cfg_parallel_mod.CHOICES
MAX_SEED = 0xFFFFFFFFFFFFFFFF


MISMATCH_FIX = {
    ACT_KIND: "connect the 'act' output of LingBot Actions to the sampler's act input (the camera input is for Cam "
              "and Fast models)",
    CAMERA_KIND: "connect the 'camera' output of LingBot Actions (the keys walked into a camera path) or a camera "
                 "trajectory to the sampler's camera input (the act input is for the Act model)",
}


def plan_summary(plan, settings: SamplingSettings, control_note: Optional[str]) -> str:
    """The sampler node's text: how the run uses memory (what `auto` picked), then any camera or act note."""
    mode = plan.mode + (f" {plan.blocks_on_gpu} blocks on the GPU" if plan.mode == "block_swap" else "")
    mode += ", released expert kept in RAM" if plan.keep_in_ram and plan.mode != "resident" else ""
    lines = [f"{settings.steps} steps, {settings.solver}, {settings.cfg_mode} CFG; memory: {mode}"]
    return "\n".join(lines + ([control_note] if control_note else []))


def camera_for(camera: CameraInput, cond: I2VCondition):
    """The trajectory rasterised at the video's size (`.plucker`, `.message`); it must cover the video's frames."""
    cc = camera_condition(camera.poses, camera.intrinsics, cond.height, cond.width, cond.frames,
                          per_frame_intrinsics=camera.per_frame_intrinsics, includes_end_pose=camera.includes_end_pose)
    if cc.frames != cond.frames:
        raise ValueError(
            f"the camera trajectory covers {cc.frames} frames but the video has {cond.frames}: connect the camera to "
            f"LingBot Image To Video too (it then limits the frames), or set its frames to {cc.frames}"
        )
    if cc.message:
        log.info("LingBot-World camera: %s", cc.message)
    return cc


def plucker_for(camera: CameraInput, cond: I2VCondition) -> torch.Tensor:
    """Rasterise the trajectory at the video's size; its frame count must cover the conditioning's."""
    return camera_for(camera, cond).plucker


def act_for(act: ActInput, cond: I2VCondition):
    """The Act model's 7-channel control at the video's size (`.tensor`, `.message`); the keys must cover the
    video's frames."""
    ac = act_condition(act.poses, act.intrinsics, act.actions, cond.height, cond.width, cond.frames,
                       includes_end_pose=act.includes_end_pose, actions_name=act.label or "actions")
    if ac.frames != cond.frames:
        raise ValueError(
            f"the act control covers {ac.frames} frames but the video has {cond.frames}: connect LingBot Actions' "
            f"frames output to LingBot Image To Video's frames, or set them to {ac.frames}"
        )
    if ac.message:
        log.info("LingBot-World act: %s", ac.message)
    return ac


def control_for(experts: ExpertPair, i2v: I2VCondition, camera: Optional[CameraInput],
                act: Optional[ActInput]) -> tuple[Optional[torch.Tensor], Optional[str]]:
    """The control tensor the experts take (Plücker for Cam/Fast, 7-channel for Act) and any note on how the path
    was fitted to the video (None when it fit), refusing the wrong kind."""
    if camera is not None and act is not None:
        raise ValueError("LingBot Sampler got both a camera and an act input; connect only the one the model takes "
                         "(camera: Cam and Fast models, act: the Act model)")
    kind = experts.formats["high"].config.control_kind
    given = ACT_KIND if act is not None else CAMERA_KIND if camera is not None else None
    check_control(kind, given, MISMATCH_FIX[kind])
    if act is not None:
        ac = act_for(act, i2v)
        return ac.tensor, ac.message
    if camera is not None:
        cc = camera_for(camera, i2v)
        return cc.plucker, cc.message
    return None, None


def text_contexts(text: TextEmbeds, experts: ExpertPair) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, text_len, dim] zero-padded contexts; refuses embeddings from a different text encoder."""
    for label, e in (("prompt", text.positive), ("negative prompt", text.negative)):
        if e.dim() != 2 or e.shape[1] != experts.text_dim:
            raise ValueError(
                f"the {label} embedding is {tuple(e.shape)} but these experts take [L, {experts.text_dim}]: the text "
                f"encoder does not belong to these experts (umT5-XXL gives 4096)"
            )
    return pad_context([text.positive], experts.text_len), pad_context([text.negative], experts.text_len)


def text_input(text: Optional[TextEmbeds], positive, negative, experts: ExpertPair) -> TextEmbeds:
    """LINGBOT_TEXT, or native positive + negative CONDITIONING; exactly one of the two."""
    native = positive is not None or negative is not None
    if text is not None and native:
        raise ValueError("connect either 'text' (LingBot Text Encode) or native 'positive' + 'negative', not both")
    if text is not None:
        return text
    if positive is None or negative is None:
        raise ValueError("LingBot Sampler needs the prompt: connect 'text' from LingBot Text Encode, or both "
                         "'positive' and 'negative' native CONDITIONING (CLIPTextEncode with umT5-XXL)")
    return text_from_conditioning(positive, negative, experts.text_dim, experts.text_len)


class LingBotSampler:
    """Denoises the video latent: high-noise expert first, then the low-noise one (spec defaults)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "experts": (EXPERTS, {"tooltip": "From LingBot Expert Loader (or LingBot Experts From Models)"}),
                "i2v": (I2V, {"tooltip": "From LingBot Image To Video (first frame, size, frames)"}),
                "steps": ("INT", {"default": 70, "min": 1, "max": 1000, "tooltip": (
                    "Denoising steps (reference 70: 26 with the high-noise expert, 44 with the low-noise one).")}),
                "shift": ("FLOAT", {"advanced": True, "default": 10.0, "min": 0.1, "max": 100.0, "step": 0.1, "tooltip": (
                    "Timestep shift of the flow schedule (reference 10).")}),
                "boundary": ("FLOAT", {"advanced": True, "default": 0.947, "min": 0.001, "max": 1.0, "step": 0.001, "tooltip": (
                    "Switch from the high- to the low-noise expert when t drops below boundary x 1000 (reference 0.947).")}),
                "guide_high": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 30.0, "step": 0.1, "tooltip": (
                    "Classifier-free guidance of the high-noise expert (reference 5; 1 = no negative pass).")}),
                "guide_low": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 30.0, "step": 0.1, "tooltip": (
                    "Classifier-free guidance of the low-noise expert (reference 5).")}),
                "seed": ("INT", {"default": 42, "min": 0, "max": MAX_SEED, "control_after_generate": True, "tooltip": (
                    "Noise seed (reference default 42).")}),
                "noise_source": (list(NOISE_SOURCES), {"advanced": True, "default": "cpu", "tooltip": (
                    "cpu: the same noise on every machine. cuda: the reference's GPU generator (bit-identical to "
                    "the original scripts for the same seed; needs a CUDA GPU).")}),
                "solver": (list(SOLVERS), {"advanced": True, "default": "unipc", "tooltip": (
                    "unipc: the reference's flow UniPC (order 2). dpm++: flow DPM-Solver++.")}),
                "cfg_mode": (list(CFG_MODES), {"advanced": True, "default": "auto", "tooltip": (
                    "How the prompt and negative passes run: batch (one forward of 2: fastest, most VRAM), "
                    "layered (one after the other inside each block, sharing the camera layers and each layer's "
                    "weight preparation and streaming: faster than sequential, the same video, ~0.65 GB more at "
                    "480p 81 frames), sequential (two forwards, least VRAM), auto (decide from memory).")}),
            },
            "optional": {
                "camera": (CAMERA, {"tooltip": (
                    "Camera trajectory (Cam and Fast models), e.g. from LingBot Actions, Camera Preset or Camera From "
                    "Files. Without a camera or act input the control layers are skipped (plain image-to-video).")}),
                "act": (ACT, {"tooltip": (
                    "Act control (Act model only: ray directions + WASD keys) from LingBot Actions. The Act "
                    "release recommends 20 steps.")}),
                "cfg_parallel": (list(CFG_PARALLEL), {"advanced": True, "default": "off", "tooltip": (
                    "Two GPUs: run the negative (unconditional) pass on a second GPU at the same time as the "
                    "prompt pass, nearly halving the time per step. That GPU holds its own copy of the current expert "
                    "(9.6 GB NF4, placed for its free VRAM) plus one pass's activations, loaded for the run and "
                    "freed when it ends. auto: the other GPU with the most free memory. off: one GPU.")}),
                "camera_cache": (list(CAMERA_CACHE_CHOICES), {"advanced": True, "default": "auto", "tooltip": (
                    "The camera layers give the same values at every step: keep them instead of recomputing them "
                    "(about 12 % faster per step, the same video). host: every block's in pinned RAM (26 GB at 480p "
                    "81 frames), streamed to the GPU one block at a time (+0.3 GB VRAM). device: on the GPU (big "
                    "cards only). auto: host, for as many blocks as free RAM allows. off: recompute.")}),
                "text": (TEXT, {"tooltip": "From LingBot Text Encode (or connect native positive + negative instead)"}),
                "positive": ("CONDITIONING", {"tooltip": (
                    "Native prompt conditioning instead of 'text': CLIPTextEncode with umT5-XXL (CLIPLoader type "
                    "wan), 4096 wide")}),
                "negative": ("CONDITIONING", {"tooltip": "Native negative conditioning (with 'positive')"}),
                "previews": ("BOOLEAN", {"default": True, "advanced": True, "tooltip": (
                    "Show every latent frame of the current estimate on the node at each step, even when ComfyUI's "
                    "own previews are off (Latent2RGB then; ComfyUI's TAESD / video TAE when chosen). Off: none.")}),
            },
        }

    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("samples",)
    OUTPUT_TOOLTIPS = ("Raw Wan 2.1 latent video {'samples': [1,16,T,h,w]}; decode with LingBot VAE Decode",)
    FUNCTION = "sample"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Runs LingBot-World's two experts with flow UniPC and CFG; shows progress and previews and "
                   "stops at the next model call when cancelled.")

    def sample(self, experts: ExpertPair, text: Optional[TextEmbeds] = None, i2v: Optional[I2VCondition] = None,
               steps: int = 70, shift: float = 10.0, boundary: float = 0.947, guide_high: float = 5.0,
               guide_low: float = 5.0, seed: int = 42, noise_source: str = "cpu", solver: str = "unipc",
               cfg_mode: str = "auto", camera: Optional[CameraInput] = None, act: Optional[ActInput] = None,
               positive=None, negative=None, cfg_parallel: str = "off", camera_cache: str = "auto",
               previews: bool = True):
        import comfy.model_management as mm

        from .adapters.progress import SamplingProgress, load_progress, show_on_node

        for value, allowed, what in ((solver, SOLVERS, "solver"), (cfg_mode, CFG_MODES, "cfg_mode"),
                                     (noise_source, NOISE_SOURCES, "noise_source"),
                                     (camera_cache, CAMERA_CACHE_CHOICES, "camera_cache")):
            if value not in allowed:
                raise ValueError(f"{what} must be one of {allowed}, got {value!r}")
        text = text_input(text, positive, negative, experts)
        cfg = experts.formats["high"].config
        control, control_note = control_for(experts, i2v, camera, act)  # refuses a control the model cannot take, before loading
        device = mm.get_torch_device()
        second = cfg_parallel_mod.second_device(cfg_parallel, device)  # refused with one line before loading
        if second is not None:
            if cfg_mode not in ("auto", "sequential"):
                log.info("LingBot-World: cfg_mode %s does not apply with cfg_parallel: each GPU runs one pass", cfg_mode)
            cfg_mode = "sequential"  # this GPU runs only the prompt pass
        plan = plan_for(experts, (i2v.frames, i2v.height, i2v.width), cfg_mode, control is not None,
                        vram_comfy_can_free(mm, device, experts.patcher("high")), device=device)
        log.info("LingBot-World memory plan: %s", plan.reason)
        settings = SamplingSettings(steps=int(steps), shift=float(shift), boundary=float(boundary),
                                    guide_high=float(guide_high), guide_low=float(guide_low), solver=solver,
                                    cfg_mode=plan.cfg_mode if cfg_mode == "auto" else cfg_mode)
        settings.validate()
        ctx, neg = text_contexts(text, experts)
        shape = (1, cfg.out_dim) + tuple(i2v.y.shape[2:])
        noise = make_noise(shape, int(seed), noise_source)

        show_on_node(plan_summary(plan, settings, control_note))
        provider = ComfyExpertProvider(experts, plan, progress=load_progress())
        velocity = None
        if second is not None:
            provider = cfg_parallel_mod.two_device_provider(provider, experts, second,
                                                            (i2v.frames, i2v.height, i2v.width), control is not None)
            velocity = provider.velocity
        film = camera_cache_for(camera_cache, experts, (i2v.frames, i2v.height, i2v.width),
                                control is not None and velocity is None, settings.steps, settings.cfg_mode, plan,
                                device)
        progress = SamplingProgress(settings.steps, device, previews=bool(previews))
        log.info("LingBot-World sampling %dx%d, %d frames, %d steps, %s CFG, camera=%s",
                 i2v.width, i2v.height, i2v.frames, settings.steps, settings.cfg_mode,
                 camera.label if camera is not None else f"act {act.label}" if act is not None else "none")
        try:
            x = sample(provider, noise, ctx, neg, i2v.y, camera=control, settings=settings, device=device,
                       callback=progress, cancel_check=mm.processing_interrupted, velocity=velocity, camera_cache=film)
        except Cancelled:
            mm.throw_exception_if_processing_interrupted()
            raise mm.InterruptProcessingException()
        finally:
            if film is not None:
                film.close()  # its host and device memory go with the run, finished or cancelled
            if velocity is not None:
                provider.close()  # the second GPU's experts go now (ComfyUI does not manage them)
        progress.finish(settings.steps)
        latent = i2v.to_raw_latent(x).to(mm.intermediate_device())
        del x
        return (latent_payload(latent, experts.speed),)

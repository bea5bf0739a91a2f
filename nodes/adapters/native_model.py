"""A LingBot-World expert as a native ComfyUI model (what travels on a MODEL link).

`LingBotWorldModel` is a `comfy.model_base.WAN21` (image-to-video, flow matching) whose `diffusion_model` is a
fixed `DiffusionModelSlot`: the NF4 expert (our `WanDiT`, streamed by our loader) is attached to the slot while
ComfyUI has the model loaded, and detached when it unloads it. Everything native works on it:
- KSampler / KSamplerAdvanced through `BaseModel.apply_model` (flow sampling `ModelSamplingDiscreteFlow`, shift 10
  by default, ModelSamplingSD3 may override it);
- the I2V latent + mask come as `concat_latent_image` / `concat_mask` (WanImageToVideo, or LingBot's own node),
  turned into the 20 conditioning channels by WAN21's own `concat_cond`;
- the camera comes as `camera_conditions`, LingBot's packed Plücker tensor [B, 384, F, h, w] (not Wan-Fun's
  24-channel one, which is refused by name);
- LoRA: `state_dict()` lists the expert's keys (meta tensors, nothing loaded), so LoraLoaderModelOnly's key map and
  `ModelPatcher.add_patches` work; the patcher (`patchers.ExpertPatcher`) hangs the patches on the NF4 linears;
- DIFFUSION_MODEL wrappers (EasyCache) run around the slot's forward; TorchCompileModel compiles the slot.

The Fast model (causal, chunked; another model kind) gets its own `model_type` in `NATIVE_KINDS` when it lands:
the slot's forward is the one place that maps ComfyUI's call onto the DiT.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

import comfy.conds
import comfy.latent_formats
import comfy.model_base
import comfy.patcher_extension
import comfy.supported_models_base

from ...memory.estimates import ACTIVATION_SAFETY, estimate_activation_bytes
from ...wan.dit.model import CAMERA_CHANNELS, DiTConfig
from .dit_slot import DiTSlot

log = logging.getLogger(__name__)

DEFAULT_SHIFT = 10.0  # LingBot-World's sample_shift (spec §6.1)
NATIVE_KINDS = {"base": "lingbot_world_base"}  # the Fast model adds e.g. "fast": "lingbot_world_fast"
TEXT_ENCODER_HINT = "umT5-XXL (CLIPLoader type 'wan' with umt5_xxl_fp16/fp8 .safetensors, or LingBot Text Encode)"


class LingBotWorldConfig(comfy.supported_models_base.BASE):
    """ComfyUI's model config for a LingBot-World expert (what WAN21_I2V declares, without its text-encoder
    imports): Wan 2.1 latents, flow sampling with shift 10, the DiT built by this pack (not by ComfyUI)."""

    sampling_settings = {"shift": DEFAULT_SHIFT}
    unet_extra_config = {}
    latent_format = comfy.latent_formats.Wan21
    supported_inference_dtypes = [torch.bfloat16, torch.float16, torch.float32]
    memory_usage_factor = 1.0  # unused: LingBotWorldModel.memory_required estimates the activations itself

    def __init__(self, cfg: DiTConfig, kind: str = "base"):
        super().__init__({"image_model": "wan2.1", "model_type": NATIVE_KINDS[kind], "in_dim": cfg.in_dim,
                          "dim": cfg.dim, "out_dim": cfg.out_dim, "num_layers": cfg.num_layers,
                          "disable_unet_model_creation": True})


class DiffusionModelSlot(DiTSlot):
    """ComfyUI's `diffusion_model` of a LingBot expert: one fixed module (wrappers, TorchCompileModel and LoRA key
    lists hold on to it) that runs whichever `WanDiT` is attached while the expert is loaded."""

    def forward(self, x, timestep, context, control=None, transformer_options={}, camera_conditions=None, **kwargs):
        return comfy.patcher_extension.WrapperExecutor.new_class_executor(
            self._forward, self,
            comfy.patcher_extension.get_all_wrappers(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL,
                                                     transformer_options),
        ).execute(x, timestep, context, camera_conditions, transformer_options, **kwargs)

    def _forward(self, x, timestep, context, camera_conditions=None, transformer_options={}, **kwargs):
        """x [B, 16 + 20, F, h, w] (noise | mask 4 | image latent 16, as BaseModel concatenates it), timestep
        sigma*1000 [B], context [B, L, 4096] -> velocity [B, 16, F, h, w]."""
        dit = self.dit
        if dit is None:
            raise RuntimeError("the LingBot-World expert is not loaded; it is loaded by ComfyUI's model management "
                               "before sampling (was the model unloaded while sampling?)")
        out_ch = self.cfg.out_dim
        if context.shape[1] > self.cfg.text_len:
            # The reference tokenizes with truncation at text_len; ComfyUI's umT5 tokenizer does not truncate.
            context = context[:, : self.cfg.text_len]
        return dit(x[:, :out_ch], timestep, context, x[:, out_ch:], camera=camera_conditions)


class LingBotWorldModel(comfy.model_base.WAN21):
    """One LingBot-World expert as a ComfyUI model; `weights` (nodes.adapters.expert_weights.ExpertWeights) loads it."""

    def __init__(self, weights, compute_dtype: torch.dtype, kind: str = "base"):
        cfg = weights.fmt.config
        super().__init__(LingBotWorldConfig(cfg, kind), image_to_video=True, device=None)
        self.weights = weights
        self.kind = kind
        self.diffusion_model = DiffusionModelSlot(cfg, compute_dtype)
        self.__dict__["slot"] = self.diffusion_model  # stays reachable while TorchCompileModel swaps diffusion_model
        self.applied_lora = None  # quant.lora.AppliedLora of the patches currently on the loaded DiT
        self.lora_uuid = None  # patches_uuid of those patches

    @property
    def cfg(self) -> DiTConfig:
        return self.weights.fmt.config

    def state_dict(self, *args, **kwargs):
        """The expert's keys as ComfyUI names them (`diffusion_model.<key>`), as meta tensors of the float shapes:
        what LoRA key maps and `add_patches` need, without loading 9.6 GB."""
        return self.slot.keys_state_dict()

    def get_dtype(self):
        return self.slot.dtype

    # ---- conditions ------------------------------------------------------------------------------------------
    def extra_conds_shapes(self, **kwargs):
        """Called for every condition before the model loads: bad text widths and cameras fail here, at once."""
        check_condition(self.cfg, kwargs.get("cross_attn"), kwargs.get("camera_conditions"))
        return {}

    def extra_conds(self, **kwargs):
        out = super().extra_conds(**kwargs)
        camera = kwargs.get("camera_conditions")
        if camera is not None:
            noise = kwargs.get("noise")
            check_camera(camera, noise.shape if noise is not None else None)
            out["camera_conditions"] = comfy.conds.CONDRegular(camera)
        return out

    def memory_required(self, input_shape, cond_shapes={}):
        """Peak activation bytes of one forward of this batch (memory.estimates' estimate, checked on an H100)."""
        b, _, f, h, w = input_shape
        compute_bytes = torch.empty(0, dtype=self.get_dtype()).element_size()
        per_pair = estimate_activation_bytes((f - 1) * 4 + 1, h * 8, w * 8, self.cfg, cfg_batch=b >= 2,
                                             compute_bytes=compute_bytes)
        return int(per_pair * max(1.0, b / 2) * ACTIVATION_SAFETY)


def check_condition(cfg: DiTConfig, cross_attn: Optional[torch.Tensor], camera: Optional[torch.Tensor]) -> None:
    if cross_attn is not None and cross_attn.shape[-1] != cfg.text_dim:
        raise ValueError(f"the text conditioning is {cross_attn.shape[-1]} wide but LingBot-World takes {cfg.text_dim} "
                         f"(umT5-XXL): encode the prompt with {TEXT_ENCODER_HINT}")
    if camera is not None:
        check_camera(camera, None)


def check_camera(camera: torch.Tensor, latent_shape) -> None:
    if camera.dim() != 5 or camera.shape[1] != CAMERA_CHANNELS:
        kind = " (a Wan-Fun camera embedding from WanCameraEmbedding)" if camera.dim() == 5 and camera.shape[1] == 24 else ""
        raise ValueError(f"camera_conditions {tuple(camera.shape)}{kind} is not a LingBot-World camera "
                         f"[B, {CAMERA_CHANNELS}, F, h, w]: use LingBot Camera Conditioning or LingBot Image To Video "
                         f"(native) with a LingBot camera")
    if latent_shape is not None and tuple(camera.shape[2:]) != tuple(latent_shape[2:]):
        raise ValueError(f"the LingBot camera was built for a latent of {tuple(camera.shape[2:])} (frames, h, w) but "
                         f"the video latent is {tuple(latent_shape[2:])}: build the camera conditioning for the same "
                         f"size and length as the latent")


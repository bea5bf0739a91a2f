"""A causal world whose model a host places with its own model management (ComfyUI's Fast nodes and LingBot Play):
the host loads the model and says how much device memory it can free; the world makes the video's settings, plans
its parts and its memory for that, and opens the session on the host's placement.

    world   = HostedWorld(checked, settings, device)   # the model's checks (assembly.check_dit), WorldSettings
    video   = world.video(request)                     # request: a PartRequest; the video's fixed settings
    part    = world.first_part(source, request, video) # or next_part(state, source, frames): a continued video
    plan    = world.plan(video, latent_frames, part, vram=..., decode_bytes=...)
    session = world.open(HostPlacement subclass(plan, ...), video)

A door translates its inputs into these typed values at its edge (its payloads never travel down) and fills in
`HostPlacement.load_model` (the host's load); the cache is placed by the plan beside the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..memory.kv_park import ParkedKV, ParkedKVError
from ..memory.fast_plan import FastMemoryError
from ..memory.kv_placement import place_kv_cache
from ..speed.levers import plan_levers
from ..wan.sampling.fast_parts import PartPlan, plan_first_part, plan_next_part
from ..wan.sampling.fast_state import FastSettings, FastState
from . import assembly
from .controls import CameraSource
from .session import WorldSession
from .settings import WorldSettings

__all__ = ["FastSettings", "FastState", "HostPlacement", "HostedWorld", "ParkedKV", "ParkedKVError", "PartPlan",
           "PartRequest", "check_text"]


def check_text(checked: "assembly.Checked", embedding: torch.Tensor) -> None:
    """A prompt embedding [L, text_dim] from the text encoder the checked model takes (umT5-XXL: 4096 wide)."""
    dim = checked.config.text_dim
    if embedding.dim() != 2 or embedding.shape[1] != dim:
        raise ValueError(f"the prompt embedding is {tuple(embedding.shape)} but the Fast model takes [L, {dim}]: "
                         "the text encoder does not belong to it (umT5-XXL gives 4096)")


@dataclass(frozen=True)
class PartRequest:
    """A video a host's node asks for: its size, the frames of its first part (None: as long as the keys or the
    camera) and whether its state is kept to be continued."""

    height: int
    width: int
    frames: Optional[int] = None
    keep: bool = False


@dataclass
class HostedWorld:
    """One causal model placed by a host: its checks, the settings the node's inputs give and the host's compute
    device (see the module)."""

    checked: "assembly.Checked"
    settings: WorldSettings
    device: torch.device

    @property
    def entry(self):
        """The registry model (world/models.py) the checked weights are."""
        return self.checked.entry

    def video(self, request: PartRequest) -> FastSettings:
        """The fixed settings of the video (world/assembly.video_settings); a kept video may be continued, so the
        model's files are fingerprinted."""
        return assembly.video_settings(self.checked, self.settings, self.device, request.height, request.width,
                                       keep=request.keep)

    @staticmethod
    def first_part(source: CameraSource, request: PartRequest, video: FastSettings) -> PartPlan:
        """The video's first part, steered by `source`, by the video's rule and the model's recipe."""
        return plan_first_part(source, request.frames, video)

    @staticmethod
    def next_part(state: FastState, source: CameraSource, frames: Optional[int]) -> PartPlan:
        """The next part of a continued video (None frames: as long as the keys or camera, else one chunk)."""
        return plan_next_part(state, source, frames)

    def preview_bytes(self, vae_cfg, height: int, width: int) -> int:
        """The device memory of a VAE decoding each chunk as it is made beside the model (its streaming caches),
        in the precision the speed plan decodes with."""
        from .vae import streaming_decode_bytes

        half = plan_levers(self.settings.speed)["decode_dtype"] != "float32"
        return streaming_decode_bytes(vae_cfg, height, width, half=half)

    def tiny_bytes(self, tiny, height: int, width: int) -> int:
        """The device memory of a tiny decoder decoding every frame (the VAE's weights then stay off the card)."""
        return assembly.tiny_bytes(tiny, height, width)

    def plan(self, video: FastSettings, latent_frames: int, part: PartPlan, *, vram: Optional[int],
             decode_bytes: int = 0):
        """The memory plan of a video of `latent_frames` (so far and this part), for the device memory the host can
        free (`vram`) with a decoder of `decode_bytes` beside the model (0: none). Raises MemoryError (the
        planner's one line) when nothing fits."""
        try:
            plan, _ = assembly.plan_memory(self.checked, video, self.device, self.settings,
                                           latent_frames=latent_frames, with_camera=part.camera is not None,
                                           stream_decode="on" if decode_bytes else "off",
                                           decode_bytes=decode_bytes or None, vram=vram)
        except FastMemoryError as e:
            raise MemoryError(str(e)) from None
        return plan

    def open(self, placement: "HostPlacement", video: FastSettings, *, model_lock=None,
             tiny_decoder=None) -> WorldSession:
        """The session of a video on the host's placement. model_lock: held while the model runs (several nodes
        share one model); tiny_decoder: it decodes every frame (the VAE does not)."""
        return WorldSession(placement, video, device=self.device, load_model=placement.load_model,
                            speed=self.settings.speed, model_lock=model_lock, tiny_decoder=tiny_decoder)


class HostPlacement:
    """A session's placement when a host loads the model: a subclass's `load_model()` loads it the host's way; the
    K/V cache is placed by the memory plan beside it, and goes when the part ends."""

    def __init__(self, plan, device):
        self.plan = plan
        self.device = torch.device(device)
        self.model = None
        self.placement = None

    def load_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def make_cache(self, fill: Optional[Callable] = None):
        if self.model is None:
            raise RuntimeError("load_model() first: the cache hooks into the model")
        self.placement = place_kv_cache(self.plan, self.model, self.device, self.model.dtype_for_compute(), fill=fill)
        return self.placement.cache

    def release_cache(self) -> None:
        if self.placement is not None:
            self.placement.close()
            self.placement = None

    def close(self) -> None:
        """The cache goes; the model stays with the host."""
        self.release_cache()
        self.model = None

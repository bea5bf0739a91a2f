"""LingBot Fast Continue: a Fast video goes on with new keys (or a new camera) from the state of the node before it.

LingBot Fast Sampler -> Fast Continue -> Fast Continue ...: each node adds whole chunks (12 frames each), shows its
chunks as they come (progress, previews), and outputs the whole video so far, the new part alone and the state.

Where the memory goes. A state holds the video's K/V cache in host RAM (the GPU holds none of it between nodes):
26.8 GB at 480x832 for 81 frames, 0.33 GB per latent frame more (see README 'Continue a Fast run'). ComfyUI keeps
every node's outputs in its cache until the graph changes or "Free model and node cache" is pressed, so the states
of one chain share one cache instead of holding a copy each:
- without a window / max_attention the cache only grows: a Continue moves the saved cache into its run (never two
  copies), appends its chunks and parks it again; earlier states of the chain are prefixes of it. Continuing an
  earlier state again (the usual "change the keys of the last step and queue again") cuts the cache back to that
  state; the later states of the old branch are then refused with a clear message if used (two branches from one
  state cannot both keep their chunks in one cache; run them one after the other).
- with a window or max_attention old tokens are dropped as the video goes on, so a state cannot be cut back: each
  Continue copies its input's (bounded) cache and leaves it intact; every state then holds its own window.
The cache is freed when ComfyUI drops the outputs that hold it. The Sampler keeps its state only when a node takes
its state output (read from the queued prompt); otherwise its cache is freed at once, as before.
"""
from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..memory.kv_park import ParkedKV, ParkedKVError, park
from ..wan.dit.model import pad_context
from ..wan.sampling.fast_state import (CHUNK_VIDEO_FRAMES, FastState, finish_part, next_layout, plan_next_part,
                                       start_part)
from .fast_nodes import FAST_STATE, camera_source, check_text, run_fast_part, state_line
from .i2v_nodes import CONTEXT_KEY
from .payloads import CAMERA, CATEGORY, TEXT, VAE, CameraInput, TextEmbeds, VAEHandle
from .progress import show_on_node

log = logging.getLogger(__name__)

_ids = itertools.count(1)


class StaleStateError(RuntimeError):
    """A state whose cache was overwritten by another continuation (or lost)."""


class KVStore:
    """The parked cache of a chain of states, and which states it still holds (`lineage`, in order)."""

    def __init__(self, parked: ParkedKV, state_id: int, evicting: bool):
        self.parked: Optional[ParkedKV] = parked
        self.lineage: list[int] = [state_id]
        self.evicting = evicting
        self.lost: Optional[str] = None

    @property
    def nbytes(self) -> int:
        return self.parked.nbytes if self.parked is not None else 0

    def check(self, handle: "FastStateHandle") -> None:
        if self.lost:
            raise StaleStateError(f"LingBot Fast Continue: the video's saved cache was lost ({self.lost}); run LingBot "
                                  "Fast Sampler again")
        if handle.id not in self.lineage or self.parked is None:
            raise StaleStateError(
                "LingBot Fast Continue: this state's cache was overwritten by another continuation of an earlier "
                "state of the same video (the steps of one video share one cache to keep RAM bounded; two branches "
                "from one state cannot both be kept). Queue this branch again: its earlier steps run again")

    def take(self, handle: "FastStateHandle") -> ParkedKV:
        """The parked cache as `handle`'s state had it. Without eviction the cache moves into the run (the store is
        empty until `put`), cut back to that state; with eviction it is copied and stays."""
        self.check(handle)
        st = handle.state
        if self.evicting:
            if (self.parked.global_end, self.parked.local_end) != (st.kv_global_end, st.kv_local_end):
                raise StaleStateError("LingBot Fast Continue: the saved cache does not match this state")
            return self.parked
        source = self.parked.truncated(st.kv_global_end, st.kv_local_end)
        del self.lineage[self.lineage.index(handle.id) + 1:]
        self.parked = None
        return source

    def put(self, parked: ParkedKV, state_id: Optional[int]) -> None:
        self.parked = parked
        if state_id is not None:
            self.lineage.append(state_id)


@dataclass(eq=False)
class FastStateHandle:
    """LINGBOT_FAST_STATE: a Fast video after some chunks (`state`), the model and I2V input it was made with, and
    the store of its cache. `state` is None when the Sampler did not keep it (nothing took its state output)."""

    state: Optional[FastState]
    model: Any  # FastModel
    i2v: Any  # I2VCondition (the first frame and the VAE: the conditioning of later frames)
    store: Optional[KVStore] = None
    id: int = field(default_factory=lambda: next(_ids))

    @classmethod
    def first(cls, state: FastState, parked: ParkedKV, model, i2v) -> "FastStateHandle":
        h = cls(state, model, i2v)
        h.store = KVStore(parked, h.id, state.settings.evicting)
        return h

    @classmethod
    def empty(cls, model, i2v) -> "FastStateHandle":
        return cls(None, model, i2v)

    def __repr__(self) -> str:  # ComfyUI may log outputs; never print tensors
        if self.state is None:
            return "FastStateHandle(empty)"
        return f"FastStateHandle({self.state.frames} frames, {self.state.chunks} chunks)"


def state_output_used(prompt: Optional[dict], unique_id: Optional[str], output: int = 1) -> bool:
    """Whether any node of the queued prompt takes output `output` of node `unique_id` (True when unknown)."""
    if not isinstance(prompt, dict) or unique_id is None:
        return True
    me = str(unique_id)
    for node in prompt.values():
        for value in (node.get("inputs") or {}).values() if isinstance(node, dict) else ():
            if isinstance(value, (list, tuple)) and len(value) == 2 and str(value[0]) == me and value[1] == output:
                return True
    return False


class LingBotFastContinue:
    """Continues a Fast video from a state with new keys or a new camera; outputs the video so far and the state."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "state": (FAST_STATE, {"tooltip": "From LingBot Fast Sampler or another LingBot Fast Continue"}),
                "frames": ("INT", {"default": 0, "min": 0, "max": 1200, "step": CHUNK_VIDEO_FRAMES, "tooltip": (
                    "New frames, in whole chunks of 12. 0 = as long as the keys / camera (one chunk without "
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
            raise ValueError("state must come from LingBot Fast Sampler or LingBot Fast Continue")
        if handle.state is None:
            raise ValueError(
                "LingBot Fast Continue: the Fast Sampler did not keep its state (nothing was connected to its state "
                "output when it ran, so its K/V cache was freed); change any input of the Sampler (e.g. the seed) "
                "or press 'Free model and node cache', then queue again")
        handle.store.check(handle)
        st = handle.state
        settings = st.settings
        fast_model = handle.model
        if text is not None:
            check_text(text, fast_model.config)
        part = plan_next_part(st, camera_source(camera), int(frames) or None)
        if part.note:
            log.warning("LingBot-World Fast Continue: %s", part.note)
        condition = self._condition(handle)
        y = condition.frames(st.latent_frames, part.latent_frames)
        device = mm.get_torch_device()
        context = text.positive if text is not None else st.context
        prompt_text = text.prompt if text is not None else st.prompt
        ctx = pad_context([context], fast_model.config.text_len).to(device)
        keep = state_output_used(prompt, unique_id, 2)
        store = handle.store
        source = store.take(handle)
        move = not store.evicting
        fill = lambda i, k, v: source.fill(i, k, v, move=move)  # noqa: E731
        new_handle: Optional[FastStateHandle] = None
        label = camera.label if camera is not None else ("none (standing still)" if st.has_camera else "none")

        def make_run(model, cache, **kw):
            # the last chunk's context pass only feeds a continuation: skipped when nothing takes the state
            return start_part(model, part, settings, y, ctx, cache, st, device=device, final_context=keep, **kw)

        def after(run, placement, ok: bool):
            nonlocal new_handle
            if ok:
                new = finish_part(run, part, settings, st, context=context, prompt=prompt_text, label=label)
                new_handle = FastStateHandle(new, fast_model, handle.i2v)
                if move and keep:  # the chain's cache grows by this part
                    store.put(park(placement), new_handle.id)
                    new_handle.store = store
                elif move:  # nobody continues this part: the cache goes back as the input state had it
                    store.put(park(placement, st.kv_global_end, st.kv_local_end), None)
                elif keep:  # a window: this state gets its own copy
                    new_handle.store = KVStore(park(placement), new_handle.id, True)
            elif move:  # stopped: the input state keeps its cache (nothing was evicted)
                try:
                    store.put(park(placement, st.kv_global_end, st.kv_local_end), None)
                except ParkedKVError as e:
                    store.lost = str(e)

        log.info("LingBot-World Fast Continue: %d frames so far + %d (%d chunks), camera=%s", st.frames, part.frames,
                 part.chunks, label)
        z_before = st.latent()
        try:
            z, summary = run_fast_part(fast_model, settings, next_layout(st, part), part, preview_vae, make_run, after=after,
                                       fill=fill, restore=source.restore_counters, z_before=z_before,
                                       so_far=st.frames)
        except BaseException as e:
            if move and store.parked is None:
                if source.complete:  # it never left: nothing was restored yet
                    store.put(source, None)
                else:  # the cache left the store and did not come back
                    store.lost = f"{type(e).__name__}: {e}"[:200]
            raise
        z = z.detach().to("cpu", torch.float32)
        i2v = handle.i2v
        whole = torch.cat([z_before, z], dim=2)
        from ..wan.vae.streaming import context_latents

        n_ctx = context_latents(i2v.vae.model.cfg, z_before.shape[2]) if i2v.vae is not None else z_before.shape[2]
        segment = {"samples": i2v.to_raw_latent(torch.cat([z_before[:, :, z_before.shape[2] - n_ctx:], z], dim=2)),
                   CONTEXT_KEY: n_ctx}
        out = new_handle if (keep and new_handle is not None) else FastStateHandle.empty(fast_model, i2v)
        if out.store is not None:
            show_on_node(f"{summary}\n{state_line(out.store.nbytes, shared=not out.store.evicting)}")
        return ({"samples": i2v.to_raw_latent(whole).to(mm.intermediate_device())}, segment, out)

    @staticmethod
    def _condition(handle: FastStateHandle):
        """The I2V conditioning of later frames: built once per video (one VAE encode of ~117 frames), kept."""
        st = handle.state
        if st.condition is not None:
            return st.condition
        i2v = handle.i2v
        if i2v is not None and i2v.track is not None:  # ComfyUI's cached I2V output: built for an earlier video
            st.condition = i2v.track
            return st.condition
        if i2v is None or i2v.vae is None or i2v.image is None:
            raise ValueError("LingBot Fast Continue: the video's LingBot Image To Video input was not made with "
                             "LingBot VAE Loader's VAE (a native Load VAE cannot encode the later frames' "
                             "conditioning); connect LingBot VAE Loader to LingBot Image To Video and queue again")
        from ..wan.i2v import ConditionTrack
        from ..wan.vae.footprint import vae_work_bytes
        from .i2v_nodes import load_vae_to_device
        from ..wan.vae.reach import encoder_reach

        cfg = i2v.vae.model.cfg
        frames = cfg.temporal_factor * (encoder_reach(cfg) + 1) + 1
        model = load_vae_to_device(i2v.vae, vae_work_bytes(cfg, i2v.height, i2v.width, frames, i2v.tiled, 256))
        st.condition = i2v.track = ConditionTrack.build(model, i2v.image, i2v.height, i2v.width, tiled=i2v.tiled,
                                                        have=i2v.y)
        return st.condition

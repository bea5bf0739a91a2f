"""LingBot Fast Continue: a Fast video goes on with new keys (or a new camera) from the state of the node before it.

LingBot Fast Sampler -> Fast Continue -> Fast Continue ...: each node adds whole chunks (12 frames each), shows its
chunks as they come (progress, previews), and outputs the whole video so far, the new part alone and the state.
Each part runs through the World session (nodes/fast_host.py); how the states of one chain share one K/V cache in
RAM: nodes/fast_state_store.py.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ..memory.kv_park import ParkedKVError
from ..wan.sampling.fast_state import CHUNK_VIDEO_FRAMES, plan_next_part
from .adapters.fast_host import FAST_STATE, camera_source, check_text, condition_track, open_fast_world, run_fast_part
from .adapters.fast_state_store import FastStateHandle, KVStore, StaleStateError, state_line, state_output_used
from .image import CONTEXT_KEY
from .adapters.payloads import CAMERA, CATEGORY, TEXT, VAE, CameraInput, TextEmbeds, VAEHandle
from .adapters.progress import show_on_node

log = logging.getLogger(__name__)

__all__ = ["LingBotFastContinue", "StaleStateError"]


class _Restore:
    """A parked cache put back into the new placement: moved (the chain's one cache) or copied (a window)."""

    def __init__(self, parked, move: bool):
        self.parked, self.move = parked, move

    def fill(self, i, k, v) -> None:
        self.parked.fill(i, k, v, move=self.move)

    def restore_counters(self, cache) -> None:
        self.parked.restore_counters(cache)


class LingBotFastContinue:
    """Continues a Fast video from a state with new keys or a new camera; outputs the video so far and the state."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "state": (FAST_STATE, {"tooltip": (
                    "From LingBot Fast Sampler, another LingBot Fast Continue or LingBot Play")}),
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
            raise ValueError("state must come from LingBot Fast Sampler, LingBot Fast Continue or LingBot Play")
        if handle.state is None:
            raise ValueError("LingBot Fast Continue: " + (handle.why or (
                "the Fast Sampler did not keep its state (nothing was connected to its state output when it ran, so "
                "its K/V cache was freed); change any input of the Sampler (e.g. the seed) or press 'Free model and "
                "node cache', then queue again")))
        handle.store.check(handle)
        st = handle.state
        fast_model = handle.model
        if text is not None:
            check_text(text, fast_model.config)
        source = camera_source(camera)
        part = plan_next_part(st, source, int(frames) or None)
        if part.note:
            log.warning("LingBot-World Fast Continue: %s", part.note)
        st.condition = self._condition(handle)
        keep = state_output_used(prompt, unique_id, 2)
        store = handle.store
        parked = store.take(handle)
        move = not store.evicting
        new_handle: Optional[FastStateHandle] = None
        label = camera.label if camera is not None else ("none (standing still)" if st.has_camera else "none")
        log.info("LingBot-World Fast Continue: %d frames so far + %d (%d chunks), camera=%s", st.frames, part.frames,
                 part.chunks, label)

        def after(world, ok: bool):
            nonlocal new_handle
            if ok:
                new_handle = FastStateHandle(world.state, fast_model, handle.i2v)
                if move and keep:  # the chain's cache grows by this part
                    store.put(world.park(), new_handle.id)
                    new_handle.store = store
                elif move:  # nobody continues this part: the cache goes back as the input state had it
                    world.rewind(1)
                    store.put(world.park(), None)
                elif keep:  # a window: this state gets its own copy
                    new_handle.store = KVStore(world.park(), new_handle.id, True)
            elif move and world.cache is not None:  # stopped: the input state keeps its cache (nothing evicted)
                try:
                    store.put(world.park(), None)
                except (ParkedKVError, ValueError) as e:
                    store.lost = str(e)

        z_before = st.latent()
        try:
            world, summary = open_fast_world(fast_model, st.settings, st.latent_frames + part.latent_frames, part,
                                             preview_vae, so_far=st.frames, show=show_on_node)
            world.resume(st, _Restore(parked, move))
            if text is not None:
                world.context, world.prompt = text.positive.detach().to("cpu", torch.float32), text.prompt
            z = run_fast_part(world, part, source, int(frames) or None, preview_vae, keep=keep, after=after,
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
        """The I2V conditioning of later frames: the state's, else built once per video and kept."""
        st = handle.state
        if st.condition is None:
            try:
                st.condition = condition_track(handle.i2v)
            except ValueError as e:
                raise ValueError(f"LingBot Fast Continue: {e}") from None
        return st.condition

"""What each speed preset costs in quality: the same image, prompt, keys and seed through two or more presets, chunk
by chunk, every chunk compared with the first preset's (`lingbot-world compare`).

    variants = [Variant("exact", exact_plan), Variant("draft:steps=2", draft2_plan)]
    result = compare_presets(files, settings, variants, image, prompt, keys, chunks=3, device=device,
                             store_dir=out_dir)
    result.variants[1].chunks[2].quality.psnr        # dB against exact's frames of chunk 2
    result.variants[1].chunks[2].drift.rel_l2        # its K/V cache against exact's after chunk 2

One session per preset, one after the other (never two models in memory at once), each freed before the next:
the presets differ in what the session is opened with (the GEMMs and kernels put on the model, the FP8 cache's
placement, the decoder), not only in the chunk loop. The image is encoded and the prompt embedded once, by the
first session; the others begin their video from the same conditioning and embedding. The first preset's frames and cache go to disk at every chunk
boundary (world/compare_store.py) and the others are compared with them as they reach that boundary: frames by
PSNR and SSIM, caches layer by layer on the tokens both hold (world/quality.py).
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

from ..wan.control.actions import KeyTimeline
from .compare_store import ReferenceStore, reference_bytes
from .quality import CacheDrift, CacheSpan, Drift, FrameQuality, LayerDrift, cache_drift, frame_quality
from .settings import WorldSettings

log = logging.getLogger(__name__)

# The keys of a run without --actions: each chunk holds one combination, in this cycle (forward, forward turning
# left, forward, forward turning right), so the camera moves and turns and every chunk sees new content.
DEFAULT_KEY_CYCLE = ("w", "wj", "w", "wl")
FORMAT = "lingbot-world compare"
VERSION = 1


@dataclass(frozen=True)
class Variant:
    """One preset to run: its label (as the user wrote it), its speed plan (speed/options.SpeedPlan, levers and
    all) and the tiny decoder it decodes with (None: the VAE)."""

    label: str
    speed: object
    tiny_vae: Optional[Path] = None


@dataclass(frozen=True)
class ChunkResult:
    chunk: int
    frames: int
    quality: FrameQuality  # against the reference's frames of this chunk
    drift: Optional[CacheDrift]  # the cache after this chunk against the reference's (None: not measured)
    seconds: float  # the chunk's DiT and decode (the model was loaded before the first)


@dataclass
class VariantResult:
    variant: Variant
    window: Optional[int]  # the K/V window the session kept (latent frames; None: the whole video)
    sink: int
    steps: int  # denoising calls per chunk
    summary: str  # the speed plan in one line
    chunks: list[ChunkResult] = field(default_factory=list)
    levers: Optional[dict] = None  # read back from a compare.json (its speed plan is not rebuilt)


@dataclass
class Comparison:
    model: str  # the registry name
    title: str
    height: int
    width: int
    seed: int
    prompt: str
    keys: list[str]  # each chunk's keys as an action string
    image: str = ""
    device: str = ""
    weights: str = ""
    variants: list[VariantResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def reference(self) -> VariantResult:
        return self.variants[0]

    def to_json(self) -> dict:
        """Every number, JSON-ready (an infinite PSNR, identical frames, is null)."""
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "title": self.title,
            "size": [self.height, self.width], "seed": self.seed, "image": self.image, "prompt": self.prompt,
            "chunk_keys": self.keys, "device": self.device, "weights": self.weights,
            "reference": self.reference.variant.label,
            "metrics": METRICS_DOC,
            "presets": [_variant_json(v) for v in self.variants],
            "notes": self.notes,
        }


    @classmethod
    def from_json(cls, data: dict) -> "Comparison":
        """A comparison read back from its compare.json (to draw its picture again); the presets' speed plans are
        not rebuilt: each variant keeps its label, tiny decoder and one-line summary. ValueError for another file."""
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} file of version {VERSION}")
        h, w = data["size"]
        out = cls(data["model"], data["title"], int(h), int(w), int(data["seed"]), data["prompt"],
                  list(data["chunk_keys"]), data.get("image", ""), data.get("device", ""), data.get("weights", ""),
                  notes=list(data.get("notes", [])))
        for p in data["presets"]:
            tiny = Path(p["tiny_vae"]) if p.get("tiny_vae") else None
            v = VariantResult(Variant(p["label"], None, tiny), p["window"], p["sink"], p["steps_per_chunk"], p["speed"])
            v.chunks = [_chunk_from_json(c) for c in p["chunks"]]
            v.levers = p.get("levers")
            out.variants.append(v)
        return out


def _inf(x) -> float:
    return float("inf") if x is None else float(x)


def _chunk_from_json(c: dict) -> ChunkResult:
    quality = FrameQuality(_inf(c["psnr"]), c["ssim"], tuple(_inf(p) for p in c["psnr_per_frame"]),
                           tuple(c["ssim_per_frame"]))
    drift = None
    if c.get("kv_tokens") is not None:
        drift = CacheDrift(tuple(LayerDrift(Drift(d["k_cosine"], d["k_rel_l2"]), Drift(d["v_cosine"], d["v_rel_l2"]))
                                 for d in c["kv_layers"]), c["kv_tokens"])
    return ChunkResult(c["chunk"], c["frames"], quality, drift, c["seconds"])


METRICS_DOC = {
    "psnr": "dB of the chunk's uint8 frames against the reference's, peak 255, from the mean squared error over "
            "all their pixels and channels; null: identical frames (infinite)",
    "ssim": "mean over the chunk's frames of the Gaussian-window SSIM (Wang et al. 2004: 11x11, sigma 1.5, K1 0.01, "
            "K2 0.03, valid positions only) of the luma (BT.601)",
    "kv_cosine": "cosine similarity of the cache's float32 K and V against the reference's after the chunk, per "
                 "layer the mean of K's and V's, then the mean over layers (1: identical)",
    "kv_rel_l2": "|a - b| / |b| of the same tensors, b the reference's, averaged the same way (0: identical)",
    "kv_tokens": "video tokens both caches hold, the ones compared (a shorter window holds fewer)",
    "kv_*": "null: the drift was not measured (--kv-drift off)",
    "seconds": "the chunk's DiT and decode time (the model loaded before the first chunk)",
}


def _num(x: float):
    return None if x == float("inf") else float(x)


def _variant_json(v: VariantResult) -> dict:
    return {
        "label": v.variant.label, "speed": v.summary,
        "levers": v.levers if v.variant.speed is None else _levers(v.variant.speed),
        "tiny_vae": str(v.variant.tiny_vae) if v.variant.tiny_vae else None,
        "window": v.window, "sink": v.sink, "steps_per_chunk": v.steps,
        "chunks": [{
            "chunk": c.chunk, "frames": c.frames, "seconds": round(c.seconds, 4),
            "psnr": _num(c.quality.psnr), "ssim": c.quality.ssim,
            "kv_cosine": c.drift.cosine if c.drift else None, "kv_rel_l2": c.drift.rel_l2 if c.drift else None,
            "kv_tokens": c.drift.tokens if c.drift else None,
            "psnr_per_frame": [_num(p) for p in c.quality.psnr_per_frame],
            "ssim_per_frame": list(c.quality.ssim_per_frame),
            "kv_layers": [{"k_cosine": d.k.cosine, "v_cosine": d.v.cosine, "k_rel_l2": d.k.rel_l2,
                           "v_rel_l2": d.v.rel_l2} for d in (c.drift.layers if c.drift else ())],
        } for c in v.chunks],
    }


def _levers(speed) -> Optional[dict]:
    levers = getattr(speed, "levers", None)
    if levers is None:
        return None
    from dataclasses import asdict

    return {**asdict(levers), "compile": speed.compile, "compute": speed.compute, "attention": speed.attention,
            "preset": speed.preset}


# ---- keys ---------------------------------------------------------------------------------------------------------
def chunk_keys(keys: Optional[KeyTimeline], first: int, per_chunk: int, chunks: int) -> tuple[list[KeyTimeline],
                                                                                            list[str]]:
    """The keys of each chunk (the first takes `first` frames, the others `per_chunk`) and notes: `keys` cut into
    chunks (padded with no key past its end), or without keys the default cycle."""
    sizes = [first] + [per_chunk] * (chunks - 1)
    if keys is None:
        return [KeyTimeline.from_string(f"{DEFAULT_KEY_CYCLE[c % len(DEFAULT_KEY_CYCLE)]}-{n}")
                for c, n in enumerate(sizes)], []
    need, notes = sum(sizes), []
    if keys.frames < need:
        notes.append(f"the keys cover {keys.frames} frames, {chunks} chunks take {need}: the last "
                     f"{need - keys.frames} frames have no key")
        keys = keys + KeyTimeline.none(need - keys.frames)
    elif keys.frames > need:
        notes.append(f"the keys cover {keys.frames} frames, {chunks} chunks take {need}: the last "
                     f"{keys.frames - need} are not played")
    out, start = [], 0
    for n in sizes:
        out.append(keys[start:start + n])
        start += n
    return out, notes


# ---- the runs -----------------------------------------------------------------------------------------------------
def compare_presets(files, settings: WorldSettings, variants: Sequence[Variant], image: Union[str, Path],
                    prompt: str, keys: Optional[KeyTimeline], *, chunks: int, device, store_dir: Path,
                    kv_drift: bool = True,
                    check_store: Optional[Callable[[int], None]] = None,
                    on_chunk: Optional[Callable[[int, ChunkResult], None]] = None,
                    on_variant: Optional[Callable[[int, Variant], None]] = None) -> Comparison:
    """Run every variant for `chunks` chunks (see the module docstring); the first is the reference.

    settings: the run's world settings (size, seed, noise, weights, text, ...); each variant's speed plan and tiny
    decoder go over them. kv_drift=False: frames only (the reference's caches are not kept: for a big model at a
    large size that saves tens of GB of disk). check_store(bytes): called with the reference store's estimated size
    once the first session is open (headers read, nothing loaded), to refuse a disk that cannot hold it.
    on_variant(index, variant) before each session opens, on_chunk(index, result) after each chunk is compared."""
    from .assembly import open_session, video_settings

    if len(variants) < 2:
        raise ValueError("compare needs two presets or more: the first is the reference")
    if chunks < 1:
        raise ValueError(f"chunks={chunks}: compare at least one chunk")
    device = torch.device(device)
    result: Optional[Comparison] = None
    per_chunk: list[KeyTimeline] = []
    store = None
    start = None  # (conditioning track, prompt embedding) of the first session, reused by the others
    try:
        for n, variant in enumerate(variants):
            if on_variant is not None:
                on_variant(n, variant)
            session = open_session(files, replace(settings, speed=variant.speed, tiny_vae=variant.tiny_vae,
                                                  play=True), device=device)
            try:
                if store is None:
                    cfg = session.opened.checked.config
                    itemsize = torch.empty(0, dtype=getattr(torch, session.settings.cache_dtype)).element_size()
                    if check_store is not None:
                        check_store(reference_bytes(session.settings, cfg.num_layers if kv_drift else 0, cfg.dim,
                                                    chunks, itemsize))
                    store = ReferenceStore(store_dir)
                if start is None:
                    session.start(image, prompt)  # the text encoder and the VAE's encode of the image, once
                    start = session.condition, session.context
                else:  # the same conditioning and prompt embedding; this preset's video settings (its window cap)
                    opened = session.opened
                    session.begin(*start, prompt, video_settings(opened.checked, opened.settings, device,
                                                                 result.height, result.width))
                if result is None:
                    per_chunk, notes = chunk_keys(keys, session.keys_for_next_chunk(), session.chunk_video_frames,
                                                  chunks)
                    entry = session.opened.checked.entry
                    result = Comparison(entry.name, entry.title, session.height, session.width, session.settings.seed,
                                        prompt, [k.to_string() for k in per_chunk], str(image), str(device),
                                        settings.weights, notes=notes)
                    for note in notes:
                        log.warning("keys: %s", note)
                session.load()
                ran = replace(variant, speed=session.opened.settings.speed)  # as fitted to the model (its compile)
                vr = VariantResult(ran, session.settings.window, session.settings.sink, session.steps_per_chunk,
                                   _summary(ran))
                result.variants.append(vr)
                for c in range(chunks):
                    chunk = _run_chunk(session, per_chunk[c], c, store, reference=n == 0, kv_drift=kv_drift)
                    vr.chunks.append(chunk)
                    if on_chunk is not None:
                        on_chunk(n, chunk)
            finally:
                session.close()
                del session
                _free(device)
    finally:
        if store is not None:
            store.close()
    return result


def _run_chunk(session, keys: KeyTimeline, c: int, store: ReferenceStore, reference: bool,
               kv_drift: bool) -> ChunkResult:
    from ..memory.kv_park import placement_layers

    t = time.perf_counter()
    frames = np.concatenate([batch.frames for batch in session.step(keys)])
    seconds = time.perf_counter() - t
    cache = session.cache
    span = CacheSpan(cache.global_end, cache.local_end, cache.sink_tokens)
    if reference:
        store.write(c, frames, span, placement_layers(session.placement.placement) if kv_drift else ())
    ref_frames = store.frames(c)
    if ref_frames.shape != frames.shape:
        raise RuntimeError(f"chunk {c}: frames {tuple(frames.shape)} against the reference's "
                           f"{tuple(ref_frames.shape)}; the presets must make the same frames")
    quality = frame_quality(frames, ref_frames)
    del ref_frames
    drift = None
    if kv_drift:
        drift = cache_drift(placement_layers(session.placement.placement), span, store.layers(c), store.span(c))
    return ChunkResult(c, int(frames.shape[0]), quality, drift, seconds)


def _summary(variant: Variant) -> str:
    speed = variant.speed
    line = speed.summary() if speed is not None else "compile=off, compute=bf16, attention=sdpa"
    levers = getattr(speed, "levers", None)
    if levers is not None:
        line += f", {levers.steps} steps per chunk"
        on = [name for name in ("fold_context", "kv_fp8") if getattr(levers, name)]
        if levers.decode_dtype != "float32":
            on.append(f"decode in {levers.decode_dtype}")
        if levers.window_frames is not None:
            on.append(f"window cap {levers.window_frames}")
        if on:
            line += ", " + ", ".join(on)
    if variant.tiny_vae is not None:
        line += f", tiny decoder {Path(variant.tiny_vae).name}"
    return line


def _free(device: torch.device) -> None:
    """What a closed session held goes before the next one opens."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

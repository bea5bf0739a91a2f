"""Fast state files: a Fast video saved after a part, to be continued later (`--save-state` / `--continue-from`).

One safetensors file (no pickle): the small tensors (generator state, prompt embedding, latents so far, camera
track, the I2V conditioning of later frames) and, per layer, the K/V cache's filled slots in bf16 as the run
keeps them; `__metadata__` holds the JSON description (format name and version, the settings the video was
started with, counters, a checksum of every tensor). Written tensor by tensor through a temp file that replaces
the target only when complete (loaders/atomic.py), so a full cache never sits in RAM twice and an interrupted save
leaves the old file alone.

Size: the cache dominates: layers x 2 x tokens x heads x head_dim x 2 bytes, e.g. 26.8 GB for 81 frames at 480x832
(32,760 tokens, 40 layers x 40 heads x 128), 0.33 GB per latent frame; with `--max-attention` / a window only the
kept tokens. The latents add 0.4 MB per latent frame, the conditioning 15 MB.

Checked when opening (before any model loads): the format, the version, the header against the file size
(truncation), the JSON, the checksums of the small tensors; `check_continue` then refuses another Fast model (a
fingerprint of its config, tensor headers and sampled bytes), another weights mode or compute dtype. The cache's
checksums are checked as each layer is read back. Multi-GPU: each layer's K/V may be stored as several head ranges
(`kv.{layer}.k.h{first_head}`), concatenated on load; this version writes one range (all heads).
"""
from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Iterable, Optional, Union

import torch

from ..wan.control.camera_track import CameraTrack
from ..wan.i2v import ConditionTrack
from ..wan.sampling.fast_state import FastSettings, FastState, StateMismatchError
from .expert_format import ExpertFormat
from .safetensors_stream import SafetensorsFormatError, SafetensorsWriter, _host_bytes, iter_tensors, read_header

FORMAT = "lingbot-world-fast-state"
VERSION = 1
HEADER_RESERVE_BYTES = 1 << 20  # room for the JSON header, written last (part of every file's size)
SAMPLES_PER_FILE = 16
SAMPLE_BYTES = 64 * 1024
PathLike = Union[str, Path]


class StateFileError(ValueError):
    """A state file that cannot be used; the message names the file and what to do."""


# ---- which model ----------------------------------------------------------------------------------------------
def model_fingerprint(fmt: ExpertFormat) -> str:
    """sha256 of the model's config, file sizes, tensor headers and 16 x 64 KB sampled from each file: the same
    files give the same value in a fraction of a second; other weights of the same shapes (a random demo model, a
    fine-tune) almost surely another."""
    h = hashlib.sha256(json.dumps(fmt.config.to_json(), sort_keys=True).encode())
    for path in fmt.files:
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        header = fmt.headers.get(path)
        if header is not None:
            h.update(json.dumps({k: [str(e.dtype), e.shape, e.begin] for k, e in header.entries.items()},
                                sort_keys=True).encode())
        with open(path, "rb") as f:
            for j in range(SAMPLES_PER_FILE):
                f.seek(max(0, (size - SAMPLE_BYTES) * j // max(1, SAMPLES_PER_FILE - 1)))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def model_label(fmt: ExpertFormat) -> str:
    return f"{fmt.path.name} ({fmt.kind})"


# ---- writing ---------------------------------------------------------------------------------------------------
def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(_host_bytes(t.detach().to("cpu").contiguous()))


def small_tensors(state: FastState) -> dict[str, torch.Tensor]:
    cam, _ = state.camera.to_state()
    out = {"generator": state.generator, "context": state.context, "latents": state.latent()}
    out.update({f"camera.{k}": v for k, v in cam.items()})
    if state.condition is not None:
        out["condition.y"] = state.condition.y
    return out


def describe(state: FastState) -> dict:
    _, cam = state.camera.to_state()
    return {
        "settings": state.settings.to_json(), "chunks": state.chunks, "frames": state.frames,
        "prompt": state.prompt, "has_camera": state.has_camera, "camera": cam,
        "kv": {"global_end": state.kv_global_end, "local_end": state.kv_local_end},
        "condition": None if state.condition is None else {"stationary_from": state.condition.stationary_from},
        "parts": list(state.parts),
    }


def kv_bytes(tokens: int, num_layers: int, heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * tokens * heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def save_state(path: PathLike, state: FastState, layers: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Path:
    """Write `state` and its cache (`layers`: each layer's K, V `[B, local_end, heads, head_dim]`, host tensors,
    in order, e.g. from memory/kv_park.placement_layers) to `path`, atomically."""
    if state.condition is None:
        raise ValueError("the state has no conditioning track; build it before saving (ConditionTrack.build)")
    info = describe(state)
    crcs: dict[str, int] = {}
    writer = SafetensorsWriter(path, header_reserve=HEADER_RESERVE_BYTES)
    try:
        for name, t in small_tensors(state).items():
            t = t.detach().to("cpu").contiguous()
            crcs[name] = _crc(t)
            writer.add(name, t)
        n_layers, shape = 0, None
        for i, (k, v) in enumerate(layers):
            if k.shape[1] != state.kv_local_end or v.shape != k.shape:
                raise ValueError(f"layer {i}: K {tuple(k.shape)} / V {tuple(v.shape)} for {state.kv_local_end} tokens")
            for part, t in (("k", k), ("v", v)):
                name = f"kv.{i:03d}.{part}.h0"
                t = t.detach().to("cpu").contiguous()
                crcs[name] = _crc(t)
                writer.add(name, t)
            n_layers, shape = i + 1, tuple(k.shape)
        info["kv"].update(layers=n_layers, heads=shape[2] if shape else 0, head_dim=shape[3] if shape else 0,
                          dtype=str(k.dtype).replace("torch.", "") if n_layers else None)
        info["crc32"] = crcs
        writer.metadata = {"format": FORMAT, "version": str(VERSION), "state": json.dumps(info)}
        return writer.close()
    except BaseException:
        writer.abort()
        raise


# ---- reading ---------------------------------------------------------------------------------------------------
class StateFile:
    """An opened state file: `state` (everything but the cache), then `fill(i, k, v)` per layer as the new cache is
    allocated (the `fill` hook of `place_kv_cache`), then `restore_counters(cache)`."""

    def __init__(self, path: PathLike, legacy_recipe=None):
        """legacy_recipe: the chunk recipe of the model that wrote states before the recipe was recorded (v1 Fast's,
        from the registry: world/models.py)."""
        self.path = Path(path).expanduser()
        fix = "save the state again (--save-state) or start a new video"
        try:
            self.header = read_header(self.path)
        except FileNotFoundError:
            raise StateFileError(f"state file not found: {self.path}") from None
        except SafetensorsFormatError as e:
            raise StateFileError(f"{self.path} is not a complete Fast state file: {e}") from None
        meta = self.header.metadata
        if meta.get("format") != FORMAT:
            raise StateFileError(f"{self.path} is not a LingBot-World Fast state file (made by --save-state); "
                                 f"its format is {meta.get('format')!r}")
        version = meta.get("version", "?")
        if version != str(VERSION):
            raise StateFileError(f"{self.path}: state format version {version}, this LingBot-World reads version "
                                 f"{VERSION}; continue it with the version that saved it, or start a new video")
        try:
            self.info = json.loads(meta["state"])
            settings = FastSettings.from_json(self.info["settings"], legacy_recipe)
            kv = self.info["kv"]
            self.crcs = {str(k): int(v) for k, v in self.info["crc32"].items()}
            self.num_layers, self.heads, self.head_dim = int(kv["layers"]), int(kv["heads"]), int(kv["head_dim"])
        except (KeyError, TypeError, ValueError) as e:
            raise StateFileError(f"{self.path}: its description is damaged ({type(e).__name__}: {e}); {fix}") from None
        small = [n for n in self.header.entries if not n.startswith("kv.")]
        tensors = {}
        for name, t in iter_tensors(self.header, "cpu", names=small):
            self._check(name, t)
            tensors[name] = t
        try:
            cam = CameraTrack.from_state({k[7:]: v for k, v in tensors.items() if k.startswith("camera.")},
                                         self.info["camera"])
            cond = self.info.get("condition")
            condition = ConditionTrack(tensors["condition.y"], int(cond["stationary_from"])) if cond else None
            lat = tensors["latents"]
            self.state = FastState(settings, int(self.info["chunks"]), tensors["generator"], tensors["context"],
                                   str(self.info["prompt"]), cam, bool(self.info["has_camera"]), (lat,),
                                   int(kv["global_end"]), int(kv["local_end"]), condition, list(self.info["parts"]))
        except (KeyError, TypeError, ValueError) as e:
            raise StateFileError(f"{self.path}: its contents are damaged ({type(e).__name__}: {e}); {fix}") from None
        if lat.shape[2] != self.state.latent_frames:
            raise StateFileError(f"{self.path}: {lat.shape[2]} latent frames saved for {self.state.chunks} chunks; {fix}")
        self.shards = self._shards()

    def _check(self, name: str, t: torch.Tensor) -> None:
        want = self.crcs.get(name)
        if want is None or _crc(t) != want:
            raise StateFileError(f"{self.path}: tensor {name!r} is damaged (checksum mismatch); the state file is "
                                 "corrupted: save it again or start a new video")

    def _shards(self) -> dict[tuple[int, str], list[str]]:
        out: dict[tuple[int, str], list[str]] = {}
        for name in self.header.entries:
            if name.startswith("kv."):
                _, layer, part, head = name.split(".")
                out.setdefault((int(layer), part), []).append(name)
        for key, names in out.items():
            names.sort(key=lambda n: int(n.rsplit(".h", 1)[1]))
        missing = [i for i in range(self.num_layers) for p in ("k", "v") if (i, p) not in out]
        if missing or len(out) != 2 * self.num_layers:
            raise StateFileError(f"{self.path}: the K/V cache of layer(s) {sorted(set(missing))[:5]} is missing; the "
                                 "file is incomplete")
        return out

    @property
    def kv_bytes(self) -> int:
        return sum(self.header.entries[n].nbytes for names in self.shards.values() for n in names)

    @property
    def file_bytes(self) -> int:
        return self.header.file_size

    def kv_dtype(self) -> torch.dtype:
        return self.header.entries[self.shards[(0, "k")][0]].dtype

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's K and V as host tensors (head ranges joined), checked against their checksums."""
        out = []
        for part in ("k", "v"):
            names = self.shards[(i, part)]
            pieces = []
            for name, t in iter_tensors(self.header, "cpu", names=names):
                self._check(name, t)
                pieces.append(t)
            out.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
        return out[0], out[1]

    def fill(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        sk, sv = self.layer(i)
        n = self.state.kv_local_end
        if sk.shape[1] != n or k.shape[1] < n or sk.shape[2:] != k.shape[2:]:
            raise StateFileError(f"{self.path}: saved K/V {tuple(sk.shape)} of layer {i} do not fit the cache "
                                 f"{tuple(k.shape)}")
        k[:, :n].copy_(sk)
        v[:, :n].copy_(sv)

    def restore_counters(self, cache) -> None:
        if self.state.kv_local_end > cache.capacity:
            raise StateFileError(f"{self.path}: {self.state.kv_local_end} saved tokens do not fit a cache of "
                                 f"{cache.capacity}")
        cache.global_end, cache.local_end, cache.plan = self.state.kv_global_end, self.state.kv_local_end, None

    def check_model(self, num_layers: int, heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Refuse a model whose cache is shaped differently (before anything loads)."""
        got = (self.num_layers, self.heads, self.head_dim)
        if got != (num_layers, heads, head_dim):
            raise StateMismatchError(f"{self.path} holds the cache of a model with {got[0]} layers x {got[1]} heads x "
                                     f"{got[2]}; this model has {num_layers} x {heads} x {head_dim}")
        if self.kv_dtype() != dtype:
            raise StateMismatchError(f"{self.path} holds a {self.kv_dtype()} cache; this run computes in {dtype} (another "
                                     "kind of device?): continue it where it was made")


def describe_size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"

"""Write experts to disk tensor by tensor: the community NF4 layout, and the official sharded layout.

- `NF4ExpertWriter` / `write_nf4_expert(state_iter, cfg, out_dir)`: float weights in, quantized on a device
  (CUDA if present) one linear at a time, written as they come; produces `model.safetensors` with the packed
  keys of spec §1.2, `config.json` and `quantization_meta.json`. Nothing but the current tensor is in memory.
- `convert_official_to_nf4(src, out_dir)`: the official release (or any plain expert) -> community layout.
- `make_random_nf4_expert(cfg, out_dir)`: random weights quantized layer by layer (benchmarks, demos, tests).
- `write_official_expert(state_iter, out_dir)`: diffusers-style shards + index (test and benchmark fixtures).
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import math
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

import torch

from ..wan.dit.model import DiTConfig, WanDiT
from .expert_format import OFFICIAL_INDEX, ExpertFormat, ExpertLoadError, detect_format
from ..quant.nf4 import NF4_BLOCKSIZE, NF4_COMPONENTS, nf4_linear_names, packed_shapes, quantize_nf4, serialize_nf4
from .atomic import write_text
from .safetensors_stream import SafetensorsWriter, iter_tensors, read_header

QUANT_RECIPE = {"format": "bnb_nf4", "double_quant": True, "compute_dtype": "bfloat16", "blocksize": NF4_BLOCKSIZE}
WEIGHTS_FILE = "model.safetensors"


def _versions() -> dict:
    out = {}
    for dist in ("torch", "bitsandbytes", "safetensors", "lingbot-world-nf4"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def default_quant_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class NF4ExpertWriter:
    """Streaming writer of one community-layout NF4 expert folder.

    add(key, float_tensor): linear weights are quantized on `device` (bf16 first), other tensors are stored
    as `plain_dtype`. add_quantized / add_raw take already-quantized pieces. close() checks completeness and
    writes config.json and quantization_meta.json.
    """

    def __init__(
        self,
        out_dir: Union[str, Path],
        cfg: DiTConfig,
        device: Optional[Union[str, torch.device]] = None,
        source: Optional[dict] = None,
        config_json: Optional[Path] = None,
        plain_dtype: torch.dtype = torch.bfloat16,
        tags: Optional[dict] = None,
    ):
        self.out_dir = Path(out_dir)
        self.tags = dict(tags or {})  # recorded in the metadata and config.json: which model, under which licence
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.device = torch.device(device) if device is not None else default_quant_device()
        self.source = source or {}
        self.config_json = config_json
        self.plain_dtype = plain_dtype
        meta_model = WanDiT(cfg, device="meta")
        self.linears = {n: (m.out_features, m.in_features) for n in nf4_linear_names(cfg.num_layers) for m in [meta_model.get_submodule(n)]}
        self.expected = {k for k in dict(meta_model.named_parameters()) if not (k.endswith(".weight") and k[:-7] in self.linears)}
        for n in self.linears:
            self.expected |= {f"{n}.weight"} | {f"{n}.weight.{c}" for c in NF4_COMPONENTS}
        reserve = sum(len(k) + 96 for k in self.expected) + 8192
        metadata = {"format": "pt", "config": json.dumps(cfg.to_json()), "quantization": json.dumps(QUANT_RECIPE),
                    **self.tags}
        self._w = SafetensorsWriter(self.out_dir / WEIGHTS_FILE, metadata, header_reserve=reserve)
        self.quantized_linears = 0
        self.quantized_bytes = 0
        self.plain_tensors = 0

    def add(self, key: str, tensor: torch.Tensor) -> None:
        if key.endswith(".weight") and key[:-7] in self.linears:
            name = key[:-7]
            if tuple(tensor.shape) != self.linears[name]:
                raise ValueError(f"{key}: shape {tuple(tensor.shape)}, the config expects {self.linears[name]}")
            packed, state = quantize_nf4(tensor.to(self.device, non_blocking=True))
            self.add_quantized(name, packed, state)
            return
        if key not in self.expected:
            raise ValueError(f"{key}: not a parameter of the expert described by the config")
        self.add_raw(key, tensor.to(self.plain_dtype) if tensor.is_floating_point() else tensor)
        self.plain_tensors += 1

    def add_quantized(self, name: str, packed: torch.Tensor, state) -> None:
        pieces = serialize_nf4(name, packed, state)
        for k, v in pieces.items():
            self.add_raw(k, v)
        self.quantized_linears += 1
        self.quantized_bytes += sum(v.numel() * v.element_size() for v in pieces.values())

    def add_raw(self, key: str, tensor: torch.Tensor) -> None:
        self._w.add(key, tensor)

    def close(self) -> dict:
        missing = sorted(self.expected - self._w.entries.keys())
        if missing:
            self._w.abort()
            raise ValueError(f"{self.out_dir}: the expert is incomplete, {len(missing)} keys never written: {missing[:5]}")
        path = self._w.close()
        config = json.loads(Path(self.config_json).read_text()) if self.config_json is not None else self.cfg.to_json()
        write_text(self.out_dir / "config.json", json.dumps({**config, **self.tags}, indent=2))
        stats = {
            "linear_layers_quantized": self.quantized_linears,
            "quantized_bytes": self.quantized_bytes,
            "plain_tensors": self.plain_tensors,
            "file_bytes": path.stat().st_size,
        }
        meta = {
            "quant": dict(QUANT_RECIPE),
            "source": {"repo": None, "sha": None, "subfolder": None, **self.source},
            "model_config": self.cfg.to_json(),
            "files": {"weights": WEIGHTS_FILE, "config": "config.json"},
            "stats": stats,
            "tool_versions": _versions(),
            "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        write_text(self.out_dir / "quantization_meta.json", json.dumps(meta, indent=2))
        return stats

    def abort(self) -> None:
        self._w.abort()

    def __enter__(self) -> "NF4ExpertWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def write_nf4_expert(
    state_iter: Iterable[tuple[str, torch.Tensor]],
    cfg: DiTConfig,
    out_dir: Union[str, Path],
    device: Optional[Union[str, torch.device]] = None,
    source: Optional[dict] = None,
    config_json: Optional[Path] = None,
    tags: Optional[dict] = None,
) -> dict:
    """Quantize and write an expert given as (key, float tensor) pairs, one tensor at a time."""
    with NF4ExpertWriter(out_dir, cfg, device, source, config_json, tags=tags) as w:
        for key, t in state_iter:
            w.add(key, t)
            del t
        return w.close()


def convert_official_to_nf4(
    src: Union[str, Path, "ExpertFormat"],
    out_dir: Union[str, Path],
    device: Optional[Union[str, torch.device]] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    tags: Optional[dict] = None,
) -> dict:
    """Official (or any plain) expert -> community NF4 folder. Tensors stream to `device` and are quantized there.
    src: a path, or its ExpertFormat (a config-less model's marked with its kind: expert_format.assume_model_kind).
    tags: what the copy records of its model (its registry name and licence, world/detect.py)."""
    fmt = src if isinstance(src, ExpertFormat) else detect_format(src)
    src = fmt.path
    if fmt.quantized:
        raise ExpertLoadError(f"{src} is already quantized ({fmt.kind}); convert the official float folder")
    device = torch.device(device) if device is not None else default_quant_device()
    total = fmt.file_bytes
    prefix = fmt.key_prefix

    def tensors():
        done = 0
        for f in fmt.files:
            for k, t in iter_tensors(fmt.headers.get(f) or read_header(f), device):
                done += t.numel() * t.element_size()
                yield (k[len(prefix):] if prefix else k), t
                if progress is not None:
                    progress(done, total)

    cfg_file = fmt.path / "config.json" if fmt.path.is_dir() else None
    source = {"subfolder": fmt.path.name, "path": str(fmt.path), "format": fmt.kind}
    return write_nf4_expert(tensors(), fmt.config, out_dir, device, source,
                            cfg_file if cfg_file and cfg_file.is_file() else None, tags=tags)


# ---- synthetic experts ----------------------------------------------------------------------------------
def random_plain_tensor(key: str, shape, gen: torch.Generator, device) -> torch.Tensor:
    """Plausible random values for a non-linear parameter (norm weights near 1, small biases)."""
    if key.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")):
        return 1 + 0.05 * torch.randn(shape, generator=gen, device=device)
    if key.endswith("modulation"):
        return torch.randn(shape, generator=gen, device=device) / math.sqrt(shape[-1])
    if key == "patch_embedding.weight":
        return torch.randn(shape, generator=gen, device=device) / math.sqrt(math.prod(shape[1:]))
    return 0.02 * torch.randn(shape, generator=gen, device=device)


def random_expert_state(cfg: DiTConfig, device="cpu", seed: int = 0, dtype=torch.float32):
    """(key, tensor) pairs of a random float expert, generated one tensor at a time on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    linears = set(nf4_linear_names(cfg.num_layers))
    for key, p in WanDiT(cfg, device="meta").named_parameters():
        shape = tuple(p.shape)
        if key.endswith(".weight") and key[:-7] in linears:
            t = torch.randn(shape, generator=gen, device=device, dtype=dtype) / math.sqrt(shape[1])
        else:
            t = random_plain_tensor(key, shape, gen, device).to(dtype)
        yield key, t


def make_random_nf4_expert(
    cfg: DiTConfig,
    out_dir: Union[str, Path],
    device: Optional[Union[str, torch.device]] = None,
    seed: int = 0,
    reuse_per_shape: bool = False,
    tags: Optional[dict] = None,
) -> dict:
    """A random NF4 expert on disk in the community layout, written with `NF4ExpertWriter`.

    Each linear's random weight is generated and quantized on `device` (CUDA if present), then written; host
    memory holds one linear's packed bytes at a time. reuse_per_shape=True quantizes one weight per distinct
    shape and repeats it (valid data, much faster on a CPU; for memory tests of big synthetic files).
    """
    device = torch.device(device) if device is not None else default_quant_device()
    gen = torch.Generator(device=device).manual_seed(seed)
    cache: dict = {}
    with NF4ExpertWriter(out_dir, cfg, device, {"repo": "random", "seed": seed}, tags=tags) as w:
        for key, p in WanDiT(cfg, device="meta").named_parameters():
            shape = tuple(p.shape)
            name = key[:-7]
            if key.endswith(".weight") and name in w.linears:
                if reuse_per_shape and shape in cache:
                    for comp, v in cache[shape].items():
                        w.add_raw(f"{name}.weight{comp}", v)
                    w.quantized_linears += 1
                    w.quantized_bytes += sum(v.numel() * v.element_size() for v in cache[shape].values())
                    continue
                weight = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16) / math.sqrt(shape[1])
                packed, state = quantize_nf4(weight)
                del weight
                if reuse_per_shape:
                    pieces = serialize_nf4("", packed, state)
                    cache[shape] = {k[len(".weight"):]: v.cpu() for k, v in pieces.items()}
                w.add_quantized(name, packed, state)
            else:
                w.add(key, random_plain_tensor(key, shape, gen, device))
        return w.close()


def nf4_expert_bytes(cfg: DiTConfig) -> int:
    """Approximate size of an NF4 expert file for `cfg` (packed codes + statistics + plain bf16 tensors)."""
    meta = WanDiT(cfg, device="meta")
    total = 0
    linears = set(nf4_linear_names(cfg.num_layers))
    for key, p in meta.named_parameters():
        if key.endswith(".weight") and key[:-7] in linears:
            total += sum(math.prod(s) * (4 if c in ("quant_map", "nested_absmax", "nested_quant_map") else 1) for c, s in packed_shapes(*p.shape).items()) + 200
        else:
            total += p.numel() * 2
    return total


# ---- official layout -----------------------------------------------------------------------------------
def write_official_expert(
    state_iter: Iterable[tuple[str, torch.Tensor]],
    cfg: DiTConfig,
    out_dir: Union[str, Path],
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = 10 * 1024**3,
    *,
    shard_prefix: str = "diffusion_pytorch_model",
    config: Optional[dict] = None,
    write_config: bool = True,
) -> list[Path]:
    """A release's DiT folder: config.json, `<shard_prefix>-0000k-of-0000N.safetensors` shards and their index
    (`<shard_prefix>.safetensors.index.json`), written tensor by tensor (a new shard starts when the current one
    would pass the limit). The diffusers layout of v1 by default; v2 names its shards `model-…` (shard_prefix
    "model"), and the v2 1.3B ships no config.json (write_config=False). config: extra config.json entries."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if write_config:
        (out / "config.json").write_text(json.dumps({**cfg.to_json(), "_diffusers_version": "0.35.0",
                                                     **(config or {})}, indent=2))
    shards: list[Path] = []
    weight_map: dict[str, int] = {}
    writer, size, total = None, 0, 0
    try:
        for key, t in state_iter:
            t = t.to(dtype)
            n = t.numel() * t.element_size()
            if writer is None or (size and size + n > max_shard_bytes):
                if writer is not None:
                    shards.append(writer.close())
                writer = SafetensorsWriter(out / f"shard-{len(shards):05d}.tmp", {"format": "pt"})
                size = 0
            writer.add(key, t)
            weight_map[key] = len(shards)
            size += n
            total += n
        if writer is not None:
            shards.append(writer.close())
            writer = None
    finally:
        if writer is not None:
            writer.abort()
    names = [f"{shard_prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    final = []
    for p, name in zip(shards, names):
        p.replace(out / name)
        final.append(out / name)
    index = {"metadata": {"total_size": total}, "weight_map": {k: names[i] for k, i in weight_map.items()}}
    (out / f"{shard_prefix}.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return final

"""The causal models' tiny random-weight demos, each in its release's own layout, so `--demo --model NAME` drives
exactly the code paths a real download of NAME does (the picture is noise).

- v1 Fast: `lingbot_world_fast_bnb_nf4/` inside the base demo (loaders/demo_checkpoint.py), as the release puts
  `lingbot_world_fast/` inside the base-cam package; its NF4 copy is tagged with the model's name.
- v2 14B: its own folder with the release's `transformers/` (float32 `model-*.safetensors` shards, their index and a
  WanModelFast config with window 18 and sink 6), quantized to NF4 while loading, and the shared umT5 / tokenizer /
  VAE files beside it.
- v2 1.3B: its own folder holding only the DiT in `transformers/` (float32 shards without config.json, where
  upstream's README puts the release); the umT5, tokenizer and VAE are found in the v1 demo beside it, as a real
  1.3B borrows them from another download. Its width is 128 (one head of 128), so the config inferred from the
  shapes follows the release's rule (heads = dim / 128).

`--weights fp8 / int8` add the stored copy next to the DiT once (from its float or NF4 weights).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..loaders.demo_checkpoint import DEMO_SHARED_FILES, build_demo_checkpoint, default_demo_dir, demo_configs
from ..quant.lowp_kinds import LOWP_WEIGHTS
from .detect import model_tags
from .models import V1_FAST, ModelEntry

DEMO_SEED = 0


def demo_root(entry: ModelEntry, demo_dir: Optional[Path] = None) -> Path:
    """Where `entry`'s demo lives: `demo_dir` (the base demo folder for v1 Fast, the model's own folder otherwise),
    else the cache's folder of that name."""
    if demo_dir is not None:
        return Path(demo_dir).expanduser()
    return default_demo_dir().parent / entry.demo.folder


def build_demo(entry: ModelEntry, demo_dir: Optional[Path] = None, weights: str = "nf4",
               shared_dir: Optional[Path] = None) -> Path:
    """The folder of `entry`'s demo (built once, then reused; with `weights` fp8 / int8 its stored copy too).
    shared_dir: where the v1 demo whose umT5 / tokenizer / VAE the v2 demos use is (built there if missing; default:
    beside the demo, as the cache lays them out; ComfyUI's demo folders name theirs)."""
    root = demo_root(entry, demo_dir)
    if entry is V1_FAST:
        build_demo_checkpoint(root, DEMO_SEED)
        _ensure(root / entry.files.stored_dir("nf4"), lambda out: _write_nf4_dit(entry, out))
    else:
        if shared_dir is None:
            shared_dir = default_demo_dir() if demo_dir is None else root.parent / V1_FAST.demo.folder
        shared = build_demo_checkpoint(Path(shared_dir), DEMO_SEED)
        root.mkdir(parents=True, exist_ok=True)
        if entry.files.shared_files:
            _link_shared(Path(shared.root), root)
        official = root / entry.files.official_dir if entry.files.official_dir else root
        if not any(official.glob("model*.safetensors*")):
            _write_official_dit(entry, official)
    if weights in LOWP_WEIGHTS:
        add_stored_copy(entry, root, weights)
    return root


def add_stored_copy(entry: ModelEntry, root: Path, weights: str) -> Path:
    """The demo's DiT converted to FP8 / INT8 beside it (`convert-fp8` / `convert-int8`), once; its folder."""
    source = root / (entry.files.stored_dir("nf4") if entry is V1_FAST else entry.files.official_dir)
    out = root / entry.files.stored_dir(weights)
    _ensure(out, lambda tmp: _convert(source, tmp, weights, entry))
    return out


def demo_ready(entry: ModelEntry, demo_dir: Optional[Path] = None, weights: str = "nf4") -> bool:
    """Is the demo (in `weights`' format) there already, so that nothing has to be built (no quantizing)?"""
    root = demo_root(entry, demo_dir)
    dit = root / (entry.files.stored_dir("nf4") if entry is V1_FAST else entry.files.official_dir)
    ready = dit.is_dir() and any(dit.glob("*.safetensors"))
    return ready and (weights not in LOWP_WEIGHTS or (root / entry.files.stored_dir(weights) / "config.json").is_file())


def demo_config(entry: ModelEntry):
    """The tiny DiT config of `entry`'s demo."""
    cfg = replace(demo_configs()[0], causal=True)
    if not entry.files.has_config:  # a config-less release: the heads come from the shapes (dim / 128)
        cfg = replace(cfg, dim=128, num_heads=1, ffn_dim=256)
    return cfg


def _ensure(out: Path, write) -> None:
    """Write a folder once: into a temp folder, renamed when complete (another process may finish first)."""
    if out.is_dir():
        return
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        if not out.exists():
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_nf4_dit(entry: ModelEntry, out: Path) -> None:
    from ..loaders.nf4_writer import make_random_nf4_expert

    make_random_nf4_expert(demo_config(entry), out, device="cpu", seed=DEMO_SEED + 2, tags=model_tags(entry))


def _write_official_dit(entry: ModelEntry, official: Path) -> None:
    """The release's float32 shards (two, so the index is exercised), as upstream names them."""
    from ..loaders.nf4_writer import random_expert_state, write_official_expert

    cfg = demo_config(entry)
    state = random_expert_state(cfg, seed=DEMO_SEED + 3)
    with_config = entry.files.has_config
    extra = {"local_attn_size": entry.window or -1, "sink_size": entry.sink}
    tmp = official.parent / f".{official.name or 'dit'}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        total = sum(t.numel() * 4 for _, t in random_expert_state(cfg, seed=DEMO_SEED + 3))
        write_official_expert(state, cfg, tmp, max_shard_bytes=total // 2 + 1, shard_prefix="model",
                              config=extra, write_config=with_config)
        official.mkdir(parents=True, exist_ok=True)
        for p in sorted(tmp.iterdir()):
            if not (official / p.name).exists():
                os.replace(p, official / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _link_shared(source: Path, root: Path) -> None:
    """The umT5 encoder, tokenizer, VAE and the demo's manifest (its VAE config) beside the model: hard links where
    the file system allows, copies otherwise."""
    for name in DEMO_SHARED_FILES:
        src, dst = source / name, root / name
        if dst.exists() or not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, dst)
            continue
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _convert(source: Path, out: Path, weights: str, entry: ModelEntry) -> None:
    from ..loaders.lowp_writer import convert_to_lowp

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        convert_to_lowp(source, out, weights, device="cpu", tags=model_tags(entry))
    except FileExistsError:  # another process converted it first
        pass


def demo_inputs() -> tuple[Path, str]:
    """The demos' start image and prompt (the release's example); its Act input (action.npy + poses.npy) is in
    `act_example()`."""
    from ..loaders.demo_checkpoint import DEMO_IMAGE, DEMO_PROMPT

    return DEMO_IMAGE, DEMO_PROMPT


def act_example() -> Path:
    """The release's Act example input (examples/05: action.npy + poses.npy + intrinsics.npy)."""
    from ..loaders.demo_checkpoint import DEMO_IMAGE

    return DEMO_IMAGE.parent / "examples" / "05"


def tiny_forward() -> tuple[tuple, bool, float]:
    """The install check: a tiny random-weight DiT's forward on the CPU; (the output's shape, whether it is finite,
    seconds)."""
    import time

    import torch

    from ..wan.dit.model import DiTConfig, WanDiT

    torch.manual_seed(0)
    cfg = DiTConfig.tiny()
    model = WanDiT(cfg).eval()
    f, h, w = 3, 8, 8
    x = torch.randn(1, cfg.out_dim, f, h, w)
    y = torch.randn(1, cfg.in_dim - cfg.out_dim, f, h, w)
    ctx = torch.randn(1, 7, cfg.text_dim)
    cam = torch.randn(1, 384, f, h, w)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(x, torch.tensor([999]), ctx, y, camera=cam)
    return tuple(out.shape), bool(out.isfinite().all()), time.perf_counter() - t0

"""Benchmark: what a rank-64 LoRA on every linear costs a full-size NF4 expert, per step and in VRAM.

    PYTHONPATH=/path/to/ComfyUI python -m lingbot_world.bench.bench_lora --out bench/results/lora_h100.json   # H100
    python -m lingbot_world.bench.bench_lora --tiny --device cpu --out /tmp/lora.json                           # smoke

Two ways in, chosen by what imports (the JSON's "path" says which was measured):
- "comfyui" (ComfyUI importable): the expert as the native MODEL (`LingBotWorldModel` under our `ExpertPatcher`),
  loaded with `comfy.model_management.load_models_gpu`; the LoRA goes on with `ModelPatcher.add_patches` on a
  clone (what LoraLoaderModelOnly does) and the patcher hangs it on the NF4 linears; each step is one
  `BaseModel.apply_model` call with cond+uncond batched (B=2), as ComfyUI's sampler runs it when memory allows.
  ComfyUI's model code imports torchvision at import time (for model classes this pack never builds); where it
  is not installed the bench puts an empty stand-in module in its place and says so in the JSON.
- "hook" (no ComfyUI): the same expert loaded with `load_expert`, the same LoRA through `quant.lora.apply_lora`
  (the very hook the patcher installs), the same batched forward.
Cases, in one process on one loaded expert: no LoRA, the LoRA on the fly, the LoRA merged into NF4 (re-quantized
once), and back to no LoRA (on the fly: hooks removed, no reload). s/step is the mean of --calls timed calls after
one warm-up call. VRAM: allocated bytes with the expert loaded, with the LoRA factors attached, and the peak of a
step. The expert is a random full-size NF4 expert written once to --workdir (8 s on an H100).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import sys
import time
import types
from pathlib import Path

import torch

from ..loaders.expert_format import detect_format
from ..loaders.lora_files import dit_weight_shapes, parse_lora
from ..quant.nf4 import nf4_linear_names
from ..wan.dit.model import DiTConfig
from .common import machine_info, peak_vram_bytes, reset_peak_vram, table, write_json

log = logging.getLogger("lingbot_world.bench.lora")


def bench_config(tiny: bool) -> DiTConfig:
    return DiTConfig.tiny() if tiny else DiTConfig()


def random_lora(cfg: DiTConfig, rank: int, device: torch.device, seed: int = 0) -> dict:
    """A ComfyUI-format LoRA on all 569-style linears (camera layers included), bf16 factors on the CPU, alpha =
    rank, magnitudes like a trained LoRA's (|dW| a few % of |W|)."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = dit_weight_shapes(cfg)
    sd = {}
    for name in nf4_linear_names(cfg.num_layers):
        out_f, in_f = shapes[f"{name}.weight"]
        down = torch.randn(rank, in_f, generator=g, device=device) / in_f**0.5
        up = torch.randn(out_f, rank, generator=g, device=device) * (0.05 / rank**0.5)
        sd[f"diffusion_model.{name}.lora_down.weight"] = down.to(torch.bfloat16).cpu()
        sd[f"diffusion_model.{name}.lora_up.weight"] = up.to(torch.bfloat16).cpu()
        sd[f"diffusion_model.{name}.alpha"] = torch.tensor(float(rank))
    return sd


def inputs(cfg: DiTConfig, frames: int, height: int, width: int, device, dtype=torch.float32, batch: int = 2):
    g = torch.Generator(device="cpu").manual_seed(1)
    f, h, w = (frames - 1) // 4 + 1, height // 8, width // 8
    ctx = torch.randn(batch, cfg.text_len, cfg.text_dim, generator=g)
    ctx[:, 40:] = 0
    return dict(
        x=torch.randn(batch, 16, f, h, w, generator=g).to(device),
        y=torch.randn(batch, cfg.in_dim - 16, f, h, w, generator=g).to(device),
        context=ctx.to(device),
        camera=torch.randn(batch, 384, f, h, w, generator=g).to(device),
        sigma=torch.full((batch,), 0.9, device=device),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _alloc(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def time_calls(step, device: torch.device, calls: int) -> dict:
    with torch.no_grad():
        first = step().float().cpu()  # warm-up (kernels, allocator); kept to compare the cases
        _sync(device)
        reset_peak_vram(device) if device.type == "cuda" else None
        before = _alloc(device)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            out = step()
            _sync(device)
            times.append(time.perf_counter() - t0)
            del out
    peak = peak_vram_bytes(device) if device.type == "cuda" else 0
    return {"s_per_step": sum(times) / len(times), "calls": times, "alloc_before": before,
            "peak_step_bytes": max(peak - before, 0) if device.type == "cuda" else None, "output": first}


# ---- the ComfyUI path ----------------------------------------------------------------------------------------
def import_comfy(device: torch.device) -> dict:
    """Import ComfyUI's model management for `device`; returns notes (what had to be stood in)."""
    notes = {}
    if importlib.util.find_spec("comfy") is None:
        raise ImportError("ComfyUI is not importable (put the ComfyUI checkout on PYTHONPATH)")
    if importlib.util.find_spec("torchvision") is None:
        stub = types.ModuleType("torchvision")
        stub.transforms = types.ModuleType("torchvision.transforms")
        sys.modules["torchvision"], sys.modules["torchvision.transforms"] = stub, stub.transforms
        notes["torchvision"] = "not installed: an empty stand-in module (only unused ComfyUI model classes import it)"
    from comfy.cli_args import args

    args.cpu = device.type == "cpu"
    import comfy.model_management  # noqa: F401  (reads args.cpu now)

    return notes


def run_comfy(fmt, lora_sd, cfg, device, video, calls) -> dict:
    import comfy.model_management as mm

    from ..nodes.adapters.expert_weights import ExpertWeights, compute_dtype_for
    from ..nodes.adapters.lora_patches import patches_from_lora
    from ..nodes.adapters.native_model import LingBotWorldModel
    from ..nodes.adapters.patchers import ExpertPatcher

    w = ExpertWeights("high", fmt, "nf4")
    dtype = compute_dtype_for(device, "nf4")
    base = ExpertPatcher(LingBotWorldModel(w, dtype), device, torch.device("cpu"), size=w.device_bytes(device))
    inp = inputs(cfg, *video, device)
    lora = parse_lora(lora_sd, dit_weight_shapes(cfg), "random rank LoRA")
    out: dict = {"path": "comfyui"}

    def step_of(patcher):
        return lambda: patcher.model.apply_model(inp["x"], inp["sigma"], c_concat=inp["y"],
                                                 c_crossattn=inp["context"], camera_conditions=inp["camera"])

    def load(patcher, what):
        t0 = time.perf_counter()
        mm.load_models_gpu([patcher])
        _sync(device)
        out.setdefault("load_seconds", {})[what] = time.perf_counter() - t0
        return _alloc(device)

    alloc0 = _alloc(device)
    out["alloc_expert"] = load(base, "expert (stream from disk)") - alloc0
    out["none"] = time_calls(step_of(base), device, calls)
    on = base.clone()
    on.add_patches(patches_from_lora(lora), 1.0)
    out["alloc_lora_factors"] = load(on, "LoRA on the fly (attach)") - alloc0 - out["alloc_expert"]
    out["on_the_fly"] = time_calls(step_of(on), device, calls)
    w.lora_merge = True
    merged = base.clone()
    merged.add_patches(patches_from_lora(lora), 1.0)
    load(merged, "LoRA merged (re-quantize 569 linears)")
    out["merged"] = time_calls(step_of(merged), device, calls)
    w.lora_merge = False
    load(base, "back to no LoRA (reload after a merge)")
    out["none_again"] = time_calls(step_of(base), device, calls)
    out["loads_from_disk"] = w.loads_from_disk
    mm.unload_all_models()
    return out


# ---- the direct path -----------------------------------------------------------------------------------------
def run_hook(fmt, lora_sd, cfg, device, video, calls) -> dict:
    from ..loaders.expert_loader import load_expert
    from ..loaders.lora_files import lora_hooks
    from ..quant.lora import apply_lora

    inp = inputs(cfg, *video, device)
    lora = parse_lora(lora_sd, dit_weight_shapes(cfg), "random rank LoRA")
    out: dict = {"path": "hook"}
    alloc0 = _alloc(device)
    t0 = time.perf_counter()
    model = load_expert(fmt, device)
    out["load_seconds"] = {"expert (stream from disk)": time.perf_counter() - t0}
    out["alloc_expert"] = _alloc(device) - alloc0
    dtype = model.compute_dtype

    def step():
        x = inp["x"].to(dtype)
        return model(x, inp["sigma"] * 1000, inp["context"].to(dtype), inp["y"].to(dtype),
                     camera=inp["camera"].to(dtype)).float()

    out["none"] = time_calls(step, device, calls)
    hooks, plain = lora_hooks([(lora, 1.0)], nf4_linear_names(cfg.num_layers))
    t0 = time.perf_counter()
    applied = apply_lora(model, hooks, plain, dtype=dtype, device=device)
    _sync(device)
    out["load_seconds"]["LoRA on the fly (attach)"] = time.perf_counter() - t0
    out["alloc_lora_factors"] = _alloc(device) - alloc0 - out["alloc_expert"]
    out["on_the_fly"] = time_calls(step, device, calls)
    applied.remove()
    out["none_again"] = time_calls(step, device, calls)
    t0 = time.perf_counter()
    apply_lora(model, hooks, plain, merge_linears=True, dtype=dtype, device=device)
    _sync(device)
    out["load_seconds"]["LoRA merged (re-quantize 569 linears)"] = time.perf_counter() - t0
    out["merged"] = time_calls(step, device, calls)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="tiny config and video (CPU smoke run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/lora_bench"))
    p.add_argument("--expert", type=Path, default=None, help="use this NF4 expert instead of writing a random one")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--size", default="464*832", help="video H*W (default: the reference's 480p for a 16:9 image)")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--calls", type=int, default=3, help="timed steps per case (after one warm-up)")
    p.add_argument("--path", choices=("auto", "comfyui", "hook"), default="auto")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    device = torch.device(args.device)
    cfg = bench_config(args.tiny)
    if args.tiny:
        video = (5, 32, 48)
    else:
        h, w = (int(v) for v in args.size.split("*"))
        video = (args.frames, h, w)
    expert = args.expert
    if expert is None:
        expert = args.workdir / ("tiny_expert" if args.tiny else "high_noise_model_bnb_nf4")
        if not (expert / "model.safetensors").is_file():
            from ..loaders.nf4_writer import make_random_nf4_expert

            t0 = time.perf_counter()
            make_random_nf4_expert(cfg, expert, device=device if device.type == "cuda" else "cpu")
            log.info("random expert written to %s in %.1f s", expert, time.perf_counter() - t0)
    fmt = detect_format(expert)
    cfg = fmt.config
    lora_sd = random_lora(cfg, args.rank, device if device.type == "cuda" else torch.device("cpu"))
    lora_params = sum(v.numel() for k, v in lora_sd.items() if not k.endswith(".alpha"))

    result = {"machine": machine_info(), "device": str(device), "tiny": args.tiny, "video_fhw": list(video),
              "batch": 2, "lora": {"rank": args.rank, "linears": len(nf4_linear_names(cfg.num_layers)),
                                   "params": lora_params, "bf16_bytes": 2 * lora_params},
              "expert": str(expert), "config": dataclasses.asdict(cfg)}
    path = args.path
    if path in ("auto", "comfyui"):
        try:
            result["comfyui_notes"] = import_comfy(device)
            path = "comfyui"
        except ImportError as e:
            if args.path == "comfyui":
                raise
            result["comfyui_notes"] = {"not used": f"{type(e).__name__}: {e}"}
            path = "hook"
            log.info("ComfyUI not importable (%s): measuring the LoRA hook directly", e)
    run = run_comfy if path == "comfyui" else run_hook
    result.update(run(fmt, lora_sd, cfg, device, video, args.calls))
    base = result["none"]["s_per_step"]
    result["overhead"] = {k: result[k]["s_per_step"] / base for k in ("on_the_fly", "merged", "none_again")}
    outs = {k: result[k].pop("output") for k in ("none", "on_the_fly", "merged", "none_again")}

    def rel(a, b):
        return ((outs[a] - outs[b]).norm() / outs[b].norm()).item()

    # The LoRA changes the output; merging differs from on the fly by NF4 rounding only; removing the hooks
    # gives back exactly the LoRA-free output.
    result["checks"] = {"lora_effect": rel("on_the_fly", "none"), "merged_vs_on_the_fly": rel("merged", "on_the_fly"),
                        "none_again_vs_none": rel("none_again", "none"),
                        "finite": all(bool(o.isfinite().all()) for o in outs.values())}
    write_json(args.out, result)
    rows = [(k, f"{result[k]['s_per_step']:.3f}", f"{result[k]['s_per_step'] / base:.3f}x",
             "-" if result[k]["peak_step_bytes"] is None else f"{result[k]['peak_step_bytes'] / 1e9:.2f} GB")
            for k in ("none", "on_the_fly", "merged", "none_again")]
    print(table(rows, ["case", "s/step", "vs none", "step peak"]))
    print(f"checks: {result['checks']}")
    print(f"path: {result['path']}; expert {result['alloc_expert'] / 1e9:.2f} GB, LoRA factors "
          f"{result['alloc_lora_factors'] / 1e9:.3f} GB on the device; loads: {result['load_seconds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

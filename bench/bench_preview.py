"""Cost of the whole-clip latent preview (nodes/adapters/previews.py) per sampling step.

CPU, tiny demo (what the issue asks to measure):   python -m lingbot_world.bench.bench_preview --tiny --out preview_cpu.json
GPU (preview cost at the real latent sizes):       python -m lingbot_world.bench.bench_preview --out preview_gpu.json

--tiny samples the demo's random-weight experts (8 steps, 17x64x112, both experts resident on the CPU) with the
sampler's callback off and with the preview ComfyUI would run each step (every latent frame decoded latent-to-RGB,
laid out as a grid, JPEG-encoded as the server does), alternating runs; it reports the median of each and, robust to
other load on the machine, the share of the sampling time spent inside the preview callback. Both modes
also time the preview alone for 480p and 720p clips of 81 frames on the device. The decoder is a per-pixel linear
map like ComfyUI's Latent2RGBPreviewer (random factors: the cost does not depend on their values).
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from ..nodes.adapters.previews import ClipPreview
from .common import machine_info

CLIPS = {"480p_81": (21, 60, 104), "720p_81": (21, 90, 160)}  # latent frames, height, width


def rgb_decoder(device: torch.device):
    """Latent2RGB-like: linear 16 -> 3 on the device, uint8 on the CPU, PIL image."""
    factors = torch.randn(16, 3, device=device) * 0.2

    def decode(x0: torch.Tensor) -> Image.Image:
        rgb = torch.nn.functional.linear(x0[0].movedim(0, -1), factors.T)
        ubyte = ((rgb + 1.0) / 2.0).clamp(0, 1).mul(255).to(device="cpu", dtype=torch.uint8)
        return Image.fromarray(ubyte.numpy())

    return decode


def jpeg(image: Image.Image) -> int:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=95)  # what ComfyUI's server does with each preview
    return buf.tell()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_preview(device: torch.device, repeats: int = 10) -> dict:
    out = {}
    for name, (t, h, w) in CLIPS.items():
        x0 = torch.randn(1, 16, t, h, w, device=device)
        preview = ClipPreview(rgb_decoder(device), max_side=512)
        jpeg(preview(x0))  # warm-up (and the decoder's scale probe)
        grid_s, jpeg_s = [], []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            image = preview(x0)
            t1 = time.perf_counter()
            jpeg(image)
            grid_s.append(t1 - t0)
            jpeg_s.append(time.perf_counter() - t1)
        out[name] = {"latent": [t, h, w], "grid_px": list(image.size), "grid_ms": 1e3 * statistics.median(grid_s),
                     "jpeg_ms": 1e3 * statistics.median(jpeg_s)}
    return out


def demo_sampling(runs: int = 3, steps: int = 8) -> dict:
    """Median seconds of the tiny demo's sampling with no callback and with the preview callback."""
    from ..loaders.demo_checkpoint import build_demo_checkpoint, demo_configs
    from ..memory.placement import make_provider
    from ..wan.dit.model import pad_context
    from ..wan.sampling.sampler import SamplingSettings, make_noise, sample

    torch.set_num_threads(max(1, torch.get_num_threads()))
    dit, _, _ = demo_configs()
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="lingbot-preview-bench-") as tmp:
        files = build_demo_checkpoint(Path(tmp) / "demo")
        provider = make_provider("resident", files.high, files.low, device)
        frames_lat, h, w = 5, 8, 14  # 17 x 64 x 112 pixels
        noise = make_noise((1, dit.out_dim, frames_lat, h, w), 42, "cpu")
        y = torch.randn(1, dit.in_dim - dit.out_dim, frames_lat, h, w)
        ctx = pad_context([torch.randn(12, dit.text_dim)], dit.text_len)
        neg = pad_context([torch.randn(20, dit.text_dim)], dit.text_len)
        settings = SamplingSettings(steps=steps, cfg_mode="sequential")
        preview = ClipPreview(rgb_decoder(device), max_side=512)
        in_preview: list[float] = []

        def with_preview(info) -> None:
            t0 = time.perf_counter()
            jpeg(preview(info.x0.float()))
            in_preview.append(time.perf_counter() - t0)

        times = {"no_callback": [], "preview": []}
        with torch.inference_mode():
            sample(provider, noise, ctx, neg, y, None, settings, device=device)  # warm-up, loads both experts
            for _ in range(runs):
                for name, callback in (("no_callback", None), ("preview", with_preview)):
                    t0 = time.perf_counter()
                    sample(provider, noise, ctx, neg, y, None, settings, device=device, callback=callback)
                    times[name].append(time.perf_counter() - t0)
        close = getattr(provider, "close", None)
        if close is not None:
            close()
    base, prev = statistics.median(times["no_callback"]), statistics.median(times["preview"])
    # The A/B medians are at the mercy of other load on the machine; the time spent inside the preview callback,
    # measured in the same runs, is not.
    spent = sum(in_preview)
    return {"steps": steps, "video": "17x64x112", "runs": runs, "seconds": times,
            "median_s": {"no_callback": base, "preview": prev}, "step_ms": 1e3 * base / steps,
            "preview_ms_per_step": 1e3 * statistics.median(in_preview),
            "preview_share_pct": 100.0 * spent / sum(times["preview"]),
            "ab_overhead_pct": 100.0 * (prev - base) / base}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU: also time the tiny demo's sampling with/without previews")
    parser.add_argument("--device", default=None, help="device for the preview timings (default: cuda if present)")
    parser.add_argument("--runs", type=int, default=3, help="sampling runs per mode (--tiny)")
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    res = {"machine": machine_info(), "torch_threads": torch.get_num_threads(), "device": str(device),
           "preview_alone": time_preview(device)}
    if args.tiny:
        res["demo_sampling_cpu"] = demo_sampling(args.runs)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One DiT expert loaded once, and what the load took (`check-expert`): the format found, the parameters, the bytes
on the device, the seconds and GB/s read, the peak growth of the host's RSS (VmHWM from /proc/self/status, reset just
before the load) and the peak VRAM. The model is dropped afterwards."""
from __future__ import annotations

from typing import Optional

from ..quant.lowp_kinds import LOWP_WEIGHTS


def load_stats(path: str, device: Optional[str] = None, mode: str = "nf4") -> dict:
    """Load the expert at `path` (a folder or one .safetensors) in `mode` ("nf4" | "bf16" | "fp8" | "int8") on
    `device` (default: cuda when available) and return the statistics as JSON-ready values."""
    import torch

    from ..loaders.expert_format import detect_format
    from ..loaders.expert_loader import load_expert_with_info
    from ..memory.memstats import PeakRSS, peak_vram_bytes, reset_peak_vram

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.is_available():
        torch.empty(1, device="cuda")  # the CUDA context's own host memory is not the loader's
        reset_peak_vram()
    fmt = detect_format(path)
    if mode in LOWP_WEIGHTS:
        from ..quant.compute import check_lowp_weights

        check_lowp_weights(mode, torch.device(device))
    with PeakRSS() as rss:
        model, info = load_expert_with_info(fmt, device, mode)
    out = {"ok": True, **info.to_json(), "config": fmt.config.to_json(), "files": [str(p) for p in fmt.files],
           "file_bytes": fmt.file_bytes, "peak_rss_growth_bytes": rss.growth}
    if device == "cuda":
        out["peak_vram_bytes"] = peak_vram_bytes()
    del model
    return out

"""bench_speed's cases: each a speed path on the full-size expert (or the attention kernels, or the tiny error
check), the layered and camera-cache twins they are compared with, the targets, and the cards the kernel split is
projected onto."""
from __future__ import annotations

from typing import Optional

SMALL_VIDEO = (17, 240, 416)  # the 4-step error run
TINY_VIDEO = (9, 32, 48)
TINY_SMALL_VIDEO = (9, 48, 64)  # 36 tokens: the low-precision paths need more than 16 rows
REFERENCE = "eager"

FORWARD = "forward"
CASES: dict[str, dict] = {
    "baseline": dict(kind=FORWARD, legacy=True),
    "eager": dict(kind=FORWARD, profile=True),
    "compile": dict(kind=FORWARD, compile="blocks", profile=True),
    "compile_warm": dict(kind=FORWARD, compile="blocks"),
    # compile as before eager's bf16 casts were emulated (inductor keeps fused bf16 intermediates in float32): the
    # error that emulation removes, measured in the same session (not in the default cases)
    "compile_noemulate": dict(kind=FORWARD, compile="blocks", inductor_options={}, profile=True),
    "fp8_compile_noemulate": dict(kind=FORWARD, compute="fp8", compile="blocks", inductor_options={}, profile=True),
    "fp8": dict(kind=FORWARD, compute="fp8"),
    "fp8_compile": dict(kind=FORWARD, compute="fp8", compile="blocks", profile=True),
    "int8": dict(kind=FORWARD, compute="int8"),
    "int8_compile": dict(kind=FORWARD, compute="int8", compile="blocks", profile=True),
    "fp16acc": dict(kind=FORWARD, compute="fp16acc"),  # its error; an H100 gains no speed from it
    "sage": dict(kind=FORWARD, attention="sage"),
    # cuDNN FP8 attention for the video self-attention (Hopper+, nvidia-cudnn-frontend): with exact GEMMs, and the
    # whole FP8 path (FP8 GEMMs + FP8 attention, what `--compute fp8` picks with `--attention auto` on Hopper)
    "compile_fp8attn": dict(kind=FORWARD, compile="blocks", attention="fp8", profile=True),
    "fp8_compile_fp8attn": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", profile=True),
    # compiled phases with the FFN's GELU in the first GEMM's cuBLASLt epilogue (now their default) and without
    "compile_epilogue": dict(kind=FORWARD, compile="blocks", gelu_epilogue=True, profile=True),
    "compile_no_epilogue": dict(kind=FORWARD, compile="blocks", gelu_epilogue=False, profile=True),
    # the exact path with bf16 attention through cudnn-frontend on cuDNN's fastest plan (issue 15's 6.3 s/step)
    "compile_cudnn": dict(kind=FORWARD, compile="blocks", attention="cudnn", profile=True),
    # layered CFG (issue 15): a step is ONE model call whose cond and uncond samples run one after the other inside
    # each block (camera FiLM, weight preparation and block 0's self-attention shared); bit-identical to its twin
    "eager_layered": dict(kind=FORWARD, cfg="layered", profile=True),
    "compile_layered": dict(kind=FORWARD, compile="blocks", cfg="layered", profile=True),
    "fp8_compile_fp8attn_layered": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", cfg="layered",
                                        profile=True),
    # the camera FiLM cache in pinned host memory (wan/dit/film_cache.py, memory/film_stream.py): the camera layers
    # run in the first forward only; later forwards read their values, one block ahead; bit-identical to the twin
    "eager_filmcache": dict(kind=FORWARD, film="host", profile=True),
    "compile_filmcache": dict(kind=FORWARD, compile="blocks", film="host", profile=True),
    "fp8_compile_fp8attn_filmcache": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8", film="host",
                                          profile=True),
    "compile_layered_filmcache": dict(kind=FORWARD, compile="blocks", cfg="layered", film="host", profile=True),
    "fp8_compile_fp8attn_layered_filmcache": dict(kind=FORWARD, compute="fp8", compile="blocks", attention="fp8",
                                                  cfg="layered", film="host", profile=True),
    "attention": dict(kind="attention"),
    "tiny": dict(kind="tiny"),
}
LAYERED_SUFFIX = "_layered"  # a layered case's twin (same options, sequential CFG) is its name without it
FILM_SUFFIX = "_filmcache"  # a camera-cache case's twin (same options, no cache) is its name without it
DEFAULT_CASES = ["baseline", "eager", "compile", "attention", "fp8", "fp8_compile", "int8", "int8_compile",
                 "compile_warm", "fp16acc", "sage", "tiny"]

TARGETS = {  # issue 15, H100, s/step at 464x832x81, sequential CFG, swap on a 24 GB cap
    "eager": ("s_per_step", 7.8),
    "compile": ("s_per_step", 6.3),
    "fp8_compile": ("s_per_step", 4.6),
    "fp8_compile_fp8attn": ("s_per_step", 4.6),
    "eager_filmcache": ("s_per_step", 7.8),
    "compile_filmcache": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_filmcache": ("s_per_step", 4.6),
    "compile_layered_filmcache": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_layered_filmcache": ("s_per_step", 4.6),
    "compile_cudnn": ("s_per_step", 6.3),
    "eager_layered": ("s_per_step", 7.8),
    "compile_layered": ("s_per_step", 6.3),
    "fp8_compile_fp8attn_layered": ("s_per_step", 4.6),
}
# layered vs its sequential twin in the same run: the FiLM GEMMs (~5 % of a step on an H100) and half the weight
# preparation saved; and the same output bit for bit
LAYERED_RATIO_TARGET = 0.97
# the camera cache vs its twin: the camera layers' four GEMMs per block are ~a quarter of a forward's GEMM time
FILM_RATIO_TARGET = 0.95
RATIO_TARGETS = {LAYERED_SUFFIX: LAYERED_RATIO_TARGET, FILM_SUFFIX: FILM_RATIO_TARGET}


def twin_of(name: str) -> Optional[str]:
    """The case a layered or camera-cache case is compared with: the same options without its last suffix."""
    for suffix in (FILM_SUFFIX, LAYERED_SUFFIX):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return None
SWAP_VRAM_TARGET = 13e9

# ---- consumer-card projection -------------------------------------------------------------------------------
# Published dense peaks (no sparsity). H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet. RTX 4090: NVIDIA Ada
# Lovelace architecture whitepaper v1.1, Appendix A (GeForce cards run bf16/fp16 and fp8 GEMMs with float32
# accumulation at half the fp16-accumulate rate). RTX 3090: NVIDIA Ampere GA102 GPU architecture whitepaper,
# Table 9 (same float32-accumulate halving).
PROJECTION_CARDS = {  # dense TFLOP/s (TOPS for int8); fp16acc = fp16 with fp16 accumulation
    "H100 SXM5": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp16acc": 989.4, "bw_gbs": 3350},
    "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "fp16acc": 330.3, "bw_gbs": 1008},
    "RTX 3090": {"bf16": 71.0, "fp8": None, "int8": 284.0, "fp16acc": 142.0, "bw_gbs": 936},
}
MEASURED_ON = "H100 SXM5"

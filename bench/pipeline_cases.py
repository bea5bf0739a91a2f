"""bench_pipeline's cases: each a memory mode on a simulated card (or a special case: the expert switch, NF4 vs
bf16, the CFG modes, the VAE), the video sizes, the 70-step schedule the steps are extrapolated to, and the targets."""
from __future__ import annotations

STEPS_HIGH, STEPS_LOW = 26, 44  # the default 70-step schedule (spec §5.5)

V480 = (81, 464, 832)
V720 = (81, 720, 1280)
TINY_VIDEO = (9, 32, 48)

# name -> what the case does. kind "sample": the real sampler over a short schedule; others are special.
CASES: dict[str, dict] = {
    "swap24": dict(kind="sample", video=V480, mode="swap", cap_gib=24, high=3, low=1),
    "resident24": dict(kind="sample", video=V480, mode="resident", cap_gib=24, high=3, low=1),
    "blockswap16": dict(kind="sample", video=V480, mode="block_swap", cap_gib=16, high=3, low=1),
    "blockswap12": dict(kind="sample", video=V480, mode="block_swap", cap_gib=12, high=3, low=1),
    "blockswap8": dict(kind="sample", video=V480, mode="block_swap", cap_gib=8, high=3, low=1),
    "swap720": dict(kind="sample", video=V720, mode="swap", cap_gib=24, high=2, low=1),
    "blockswap16_720": dict(kind="sample", video=V720, mode="block_swap", cap_gib=16, high=2, low=1, ref="swap720"),
    "switch": dict(kind="switch", cap_gib=24),
    "nf4_vs_bf16": dict(kind="bf16", video=V480),
    "cfg": dict(kind="cfg", video=V480),
    "vae": dict(kind="vae", video=V480),
}
DEFAULT_CASES = list(CASES)
SAMPLE_CASES = [n for n, c in CASES.items() if c["kind"] == "sample"]
BLOCK_SWAP_CASES = [n for n in SAMPLE_CASES if CASES[n]["mode"] == "block_swap"]
# the whole-expert case a block-swap case is compared with (same video size)
REFERENCE = {n: CASES[n].get("ref", "resident24") for n in BLOCK_SWAP_CASES}

TARGETS = {
    "swap24": "runs; peak VRAM <= 13 GB; peak RSS <= 4 GB",
    "resident24": "runs; peak VRAM <= 22.5 GB",
    "blockswap16": "runs; s/step <= 1.3x resident",
    "blockswap12": "runs; s/step <= 1.3x resident",
    "blockswap8": "runs (beyond the issue: an 8 GB card)",
    "swap720": "runs",
    "blockswap16_720": "runs (beyond the issue: 720p on a 16 GB card)",
    "switch": "switch from disk <= 5 s, from pinned RAM <= 1.5 s",
    "nf4_vs_bf16": "NF4 s/step <= 1.05x bf16",
    "cfg": "reported (issue 7)",
    "vae": "reported",
}

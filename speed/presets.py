"""Speed presets (`--speed exact|fast|draft|auto`, issue 26): what each one turns on, as plain data.

    preset = PRESETS["fast"]
    preset.options       # SpeedOptions (compile, compute, attention), resolved per GPU by resolve_speed
    preset.levers        # ChunkLevers of the Fast chunk loop (steps, context pass, window)

- exact: the reference numerics: eager bf16 GEMMs and exact attention, the release's chunk schedule, the VAE decode
  in float32 (the release's).
- auto: the fastest *exact* path for the card: the per-token work compiled where the compiler runs (within 1e-3 of
  eager per forward, bf16 rounding in another order), bf16 GEMMs, torch SDPA with the GPU's fastest exact kernel;
  the release's schedule; the VAE decode in fp16 on a CUDA GPU (frames within 3e-3 of float32's on random weights,
  less than one bf16 rounding; twice as fast on tensor cores: v2 1.3B chunk 0.31 -> 0.19 s on an H200,
  bench/results/v2_1.3b_decode_fp16*_h200.json). This is also what the speed flags give when no preset is named.
- fast: low-precision GEMMs where the card has them (FP8 on Ada / Hopper+, INT8 on Ampere), compiled; exact
  attention (FP8 attention gained nothing measurable beside FP8 GEMMs for chunk queries over a long cache: H100,
  2.36 s per chunk with it, 2.29 and 2.35 without, three machines); the K/V cache in FP8 (the same speed within
  the noise on an H100, 2.27 / 2.05 s against 2.31 / 2.04 s, and 13 GB less RAM: RSS 19.6 GB instead of 32.5 GB
  at 480x832 on a 24 GB card, bench/results/fast_chunk_fast_kv_ab*_h100.json); the release's schedule.
  Approximate.
- draft (opt-in): fast plus the chunk-schedule levers: 3 steps, the context pass folded into the last step, a
  15-frame window, the K/V cache in FP8 (half the RAM and link bytes; an 81-frame video's chunk 6 % faster on one
  H100, a rolled chunk as fast within the noise on another: bench/results/fast_*kvfp8*_h100.json), and the VAE
  decode in fp16 as auto's (bf16 before: as fast, 8x further from float32). Changes the video visibly more than
  fast; for previews and real-time play. Its attention stays exact: FP8 attention made its chunk slower (H100,
  24 GB cap: 1.72 s against 1.35 s; bench/results/fast_chunk_final_h100.json).

The decode on a side stream (ChunkLevers.decode_overlap) is in no preset: with today's decoder it saved 0.06 s of
`auto`'s 2.47 s chunk and nothing of `draft`'s on an H100, and took nvidia-smi from 21.0 to 22.1-22.2 GB on the
24 GB cap (the side stream's memory is not shared with the DiT's; bench/results/fast_chunk_overlap_h100.json).

A flag given explicitly (--compile, --compute, --attention) wins over the preset's value for it, and
--chunk-steps (2, 3 or 4 denoising calls per Fast chunk) over the preset's step count: `draft` in 2 steps took
0.91 s per chunk against 1.16 s in 3 on one H100 (a rolled chunk 0.98 against 1.28 s;
bench/results/fast_chunk_steps2_h100.json).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .levers import STEP_CHOICES, ChunkLevers
from .options import SpeedOptionError, SpeedOptions, SpeedPlan, resolve_speed

PRESET_NAMES = ("exact", "fast", "draft", "auto")
CHUNK_STEP_CHOICES = STEP_CHOICES  # --chunk-steps: 4 (the release's), 3, 2
HALF_DECODE = "fp16"  # every preset but exact decodes in fp16 on a CUDA GPU
DRAFT_LEVERS = ChunkLevers(steps=3, fold_context=True, window_frames=15, decode_dtype=HALF_DECODE, kv_fp8=True)


@dataclass(frozen=True)
class SpeedPreset:
    name: str
    options: SpeedOptions
    levers: ChunkLevers
    exact: bool  # True: nothing beyond bf16 rounding changes the output
    summary: str


PRESETS = {
    "exact": SpeedPreset("exact", SpeedOptions(compile="off", compute="bf16", attention="sdpa"), ChunkLevers(), True,
                         "reference numerics: eager, bf16 GEMMs, exact attention, float32 VAE decode"),
    "auto": SpeedPreset("auto", SpeedOptions(compile="auto", compute="bf16", attention="auto"),
                        ChunkLevers(decode_dtype=HALF_DECODE), True,
                        "the fastest exact path for this card (compiled per-token work where the compiler runs, "
                        "the VAE decode in fp16)"),
    "fast": SpeedPreset("fast", SpeedOptions(compile="auto", compute="auto", attention="sdpa"),
                        ChunkLevers(kv_fp8=True, decode_dtype=HALF_DECODE), False,
                        "FP8 (Ada/Hopper+) or INT8 (Ampere) GEMMs where they run, exact attention, the K/V cache in "
                        "FP8; approximate"),
    "draft": SpeedPreset("draft", SpeedOptions(compile="auto", compute="auto", attention="sdpa"), DRAFT_LEVERS, False,
                         "fast + 3 steps per chunk, the context pass folded into the last step, a 15-frame window, "
                         "the K/V cache in FP8, the VAE decode in fp16"),
}
FLAG_NAMES = ("compile", "compute", "attention")


def preset_options(name: str, explicit: dict | None = None) -> SpeedOptions:
    """The preset's SpeedOptions with any explicitly chosen flag ({"compute": "bf16"}) put over it."""
    preset = _get(name)
    given = {k: v for k, v in (explicit or {}).items() if k in FLAG_NAMES and v is not None}
    return dataclasses.replace(preset.options, **given)


def attach_preset(plan: SpeedPlan, name: str | None, chunk_steps: int | None = None) -> SpeedPlan:
    """The plan with the preset's name and chunk levers recorded (levers only for the Fast model's chunk loop; no
    preset: auto's, as the flags' defaults are auto's options); chunk_steps (--chunk-steps) replaces the preset's
    denoising calls per chunk (None: the preset's). Off a CUDA GPU the decode stays float32: half-precision
    convolutions are slower than float32 there (a CPU's autocast)."""
    if chunk_steps is not None and chunk_steps not in CHUNK_STEP_CHOICES:
        raise SpeedOptionError(f"chunk steps {chunk_steps!r}: the Fast model's schedule has "
                               f"{', '.join(map(str, CHUNK_STEP_CHOICES))} steps per chunk")
    notes = []
    levers = PRESETS["auto"].levers
    if name is not None:
        preset = _get(name)
        levers = preset.levers
        notes.append(f"speed preset {name}: {preset.summary}")
    if levers.decode_dtype != "float32" and not plan.device.startswith("cuda"):
        levers = dataclasses.replace(levers, decode_dtype="float32")
    if chunk_steps is not None and chunk_steps != levers.steps:
        whose = f"preset {name}'s" if name else "release's"
        notes.append(f"chunk steps {chunk_steps}: {chunk_steps} denoising calls per Fast chunk instead of the {whose} "
                     f"{levers.steps}")
        levers = dataclasses.replace(levers, steps=chunk_steps)
    notes += [f"speed preset {name}: {d}" if name else f"speed: {d}" for d in levers.describe()]
    return dataclasses.replace(plan, preset=name, levers=levers, notes=notes + list(plan.notes))


def resolve_preset(name: str, device, weights: str = "nf4", explicit: dict | None = None,
                   chunk_steps: int | None = None) -> SpeedPlan:
    """resolve_speed of the preset's options (explicit flags over them), with the preset (and chunk_steps over its
    step count) recorded on the plan."""
    return attach_preset(resolve_speed(preset_options(name, explicit), device, weights=weights), name, chunk_steps)


def _get(name: str) -> SpeedPreset:
    if name not in PRESETS:
        raise SpeedOptionError(f"speed preset {name!r} does not exist; choose one of {', '.join(PRESET_NAMES)}")
    return PRESETS[name]

"""The floor under a Fast chunk on this GPU: its GEMMs and attention timed alone, at the best kernel for each shape.

Issue 26's conditions: 480x832, an 81-frame video (7 chunks, window 21 + sink 3: the whole video), the camera on
and its FiLM kept per chunk. bench/chunk_work.py lists every GEMM and attention call of each chunk for a preset's
schedule; each distinct shape is timed here on its own (CUDA events, warm, inputs already in place):
- GEMMs: cuBLAS bf16 (`F.linear`) or FP8 (`_scaled_mm`, rowwise scales, activations quantized beforehand, as
  quant/fp8.py runs it, where its shape rules allow it);
- attention: the fastest exact kernel (torch SDPA in the device's order, or cudnn-frontend's tuned bf16 plan) or
  cuDNN's FP8 kernel alone (its inputs quantized beforehand).
The sum over a chunk, averaged over the video, is the time the chunk would take if the GPU ran nothing else: no
per-token work (norms, RoPE, modulation, residuals), no NF4 dequantization, no K/V or FiLM copies, no launch gaps,
no all-to-all. A target below that sum plus the chunk's VAE decode cannot be met with these kernels. Beside it: the
same FLOPs at the datasheet's dense peak (no kernel is faster), and, from a bench_fast_speed result of the same
GPU (`--measured`), each preset's measured DiT time and decode, and its host->GPU bytes per chunk over the pinned
copy rate measured here (the 24 GB plan streams the cache and FiLM from RAM beside the kernels).

    python -m lingbot_world.bench.bench_floor --measured bench/results/fast_chunk_today_h200.json \\
        --out bench/results/chunk_floor_h200.json     # about a minute; GPU only

The v2 models (`--model`, bench_models.py): chunks of 4 latent frames (6,240 query tokens at 480x832), the
77-frame video's 5 chunks, the play window 18 + sink 6 (the 5th chunk attends to 18 frames; `draft` caps it at 15);
the 1.3B is 1536 wide with 12 heads of 128, 30 blocks, FFN 8960. Issue 48's targets where it has one (the exact
row against `auto`'s, `draft_steps2_tiny_vae`); --measured must be a bench_fast_speed JSON of the same model:

    python -m lingbot_world.bench.bench_floor --model v2-1.3b --measured bench/results/v2_1.3b_chunk_h200.json \\
        --out bench/results/v2_1.3b_floor_h200.json
    python -m lingbot_world.bench.bench_floor --model v2-14b --measured bench/results/v2_14b_chunk_h200.json \\
        --out bench/results/v2_14b_floor_h200.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..speed.levers import ChunkLevers
from ..speed.presets import DRAFT_LEVERS
from ..wan.dit.model import DiTConfig
from . import chunk_work as cw
from .bench_models import BenchModel, add_model_argument, parse_model
from .fast_speed_cases import TARGETS

HEIGHT, WIDTH, LATENT_FRAMES, WINDOW = 480, 832, 21, 21  # v1 Fast: 81 frames; window 21 + sink 3
FRAME_TOKENS = (HEIGHT // 16) * (WIDTH // 16)


@dataclass(frozen=True)
class Geometry:
    """The video whose chunks the floor sums: its latent frames, the K/V window, the chunk size, the model."""

    model: str = "v1-fast"
    latent_frames: int = LATENT_FRAMES
    window: int = WINDOW
    chunk_frames: int = 3
    frame_tokens: int = FRAME_TOKENS

    @classmethod
    def of(cls, bm: BenchModel) -> "Geometry":
        h, w = bm.size
        return cls(bm.name, bm.latent_frames, bm.window, bm.chunk_frames, (h // 16) * (w // 16))


V1 = Geometry()
# Dense tensor-core peaks, TFLOP/s (NVIDIA H100 SXM5 / H200 datasheets: the same arithmetic).
PEAKS = {"H100": {"bf16": 989.0, "fp8": 1979.0}, "H200": {"bf16": 989.0, "fp8": 1979.0}}


@dataclass(frozen=True)
class Row:
    name: str
    levers: ChunkLevers
    gemm: str  # "bf16" | "fp8"
    attention: str  # "bf16" | "fp8"
    target_s: float
    measured: Optional[str]  # the bench_fast_speed case measured with these levers (its decode is added)
    decode_of: Optional[str] = None  # a case whose decode stands in (no measured case of this row's own)
    shards: int = 1
    note: str = ""


ROWS = [
    Row("exact", ChunkLevers(), "bf16", "bf16", 1.6, "auto", note="exact and auto: the same GEMMs and attention"),
    Row("fast", ChunkLevers(kv_fp8=True), "fp8", "bf16", 1.0, "fast"),
    Row("fast_fp8_attention", ChunkLevers(kv_fp8=True), "fp8", "fp8", 1.0, None, "fast",
        note="fast with cuDNN's FP8 attention kernel alone (no quantizing) for every self-attention"),
    Row("draft", DRAFT_LEVERS, "fp8", "bf16", 0.75, "draft"),
    Row("draft_steps2_tiny_vae", dataclasses.replace(DRAFT_LEVERS, steps=2), "fp8", "bf16", 0.75,
        "draft_steps2_tiny_vae"),
    Row("exact_2gpu", ChunkLevers(), "bf16", "bf16", 1.0, None, "auto", shards=2,
        note="one rank's share under Ulysses; its all-to-alls and rank 0's decode wait not counted"),
]


def row_target(row: Row, geo: Geometry) -> Optional[float]:
    """The row's target: issue 26's for v1 Fast; for another model its bench_fast_speed target of the measured
    case (one GPU only; None where the model has none)."""
    if geo.model == "v1-fast":
        return row.target_s
    return TARGETS.get(geo.model, {}).get(row.measured) if row.shards == 1 else None


def row_video(row: Row, cfg: DiTConfig, geo: Geometry = V1) -> list[cw.Work]:
    return cw.video_work(cfg, geo.frame_tokens, geo.latent_frames, chunk_frames=geo.chunk_frames,
                         steps=row.levers.steps, fold_context=row.levers.fold_context,
                         window_frames=row.levers.window(geo.window, geo.latent_frames), shards=row.shards)


def row_rolled(row: Row, cfg: DiTConfig, geo: Geometry = V1) -> cw.Work:
    """A played chunk's work once the window is full (every later chunk makes the same calls)."""
    window = row.levers.window(geo.window)
    return cw.chunk_work(cfg, geo.frame_tokens, window, chunk_frames=geo.chunk_frames, steps=row.levers.steps,
                         fold_context=row.levers.fold_context, window_frames=window, shards=row.shards)


def fp8_gemm_applies(m: int, n: int, k: int) -> bool:
    """quant/nf4.py's rule: `_scaled_mm` needs K and N multiples of 16, and the linear takes more than 16 rows."""
    return m >= 17 and n % 16 == 0 and k % 16 == 0


def gemm_key(g: cw.Gemm, precision: str) -> str:
    prec = precision if precision == "bf16" or fp8_gemm_applies(*g.shape) else "bf16"
    return f"gemm {g.m}x{g.n}x{g.k} {prec}"


def attention_key(a: cw.Attention, kind: str) -> str:
    return f"attention {a.queries}x{a.keys} h{a.heads} {kind}"


def work_keys(work: cw.Work, row: Row, text_len: int) -> list[tuple[str, object]]:
    """(timing key, call) of each call of a chunk; the cross-attention over the text stays bf16."""
    out = []
    for w in work:
        if isinstance(w, cw.Gemm):
            out.append((gemm_key(w, row.gemm), w))
        else:
            kind = "bf16" if w.keys == text_len else row.attention
            out.append((attention_key(w, kind), w))
    return out


@dataclass
class Floor:
    gemm_s: float = 0.0
    attention_s: float = 0.0
    gemm_flops: float = 0.0
    attention_flops: float = 0.0
    missing: list = field(default_factory=list)

    @property
    def kernels_s(self) -> float:
        return self.gemm_s + self.attention_s


def chunk_floor(work: cw.Work, row: Row, text_len: int, ms: dict[str, float]) -> Floor:
    """The chunk's GEMM and attention seconds from per-call milliseconds `ms` (keys as gemm_key/attention_key)."""
    f = Floor()
    for key, w in work_keys(work, row, text_len):
        if key not in ms:
            f.missing.append(key)
            continue
        if isinstance(w, cw.Gemm):
            f.gemm_s += w.calls * ms[key] / 1e3
            f.gemm_flops += w.flops
        else:
            f.attention_s += w.calls * ms[key] / 1e3
            f.attention_flops += w.flops
    return f


def mean_floor(video: list[cw.Work], row: Row, text_len: int, ms: dict[str, float]) -> Floor:
    floors = [chunk_floor(c, row, text_len, ms) for c in video]
    n = len(floors)
    return Floor(sum(f.gemm_s for f in floors) / n, sum(f.attention_s for f in floors) / n,
                 sum(f.gemm_flops for f in floors) / n, sum(f.attention_flops for f in floors) / n,
                 sorted({k for f in floors for k in f.missing}))


def peak_seconds(f: Floor, row: Row, peaks: Optional[dict]) -> Optional[float]:
    if not peaks:
        return None
    return f.gemm_flops / (peaks[row.gemm] * 1e12) + f.attention_flops / (peaks[row.attention] * 1e12)


def summarize(cfg: DiTConfig, ms: dict[str, float], measured: dict, h2d_gbps: Optional[float],
              peaks: Optional[dict], geo: Geometry = V1) -> dict:
    """Each row's floor (seconds per chunk, the video's mean and a rolled chunk's), and beside it the measured
    case's DiT time, decode and link bytes; `reachable` is whether the floor plus the decode (and the link, where
    it is longer than the kernels) stays within the target (None: the row has no target)."""
    out = {}
    for row in ROWS:
        video = mean_floor(row_video(row, cfg, geo), row, cfg.text_len, ms)
        rolled = chunk_floor(row_rolled(row, cfg, geo), row, cfg.text_len, ms)
        case = measured.get(row.measured or "", {})
        decode_case = measured.get(row.measured or row.decode_of or "", {})
        target = row_target(row, geo)
        r = {"target_s": target, "gemm": row.gemm, "attention": row.attention, "shards": row.shards,
             "steps": row.levers.steps, "fold_context": row.levers.fold_context,
             "window_frames": row.levers.window(geo.window, geo.latent_frames), "note": row.note,
             "gemm_s": round(video.gemm_s, 4), "attention_s": round(video.attention_s, 4),
             "kernels_s": round(video.kernels_s, 4), "tflop": round((video.gemm_flops + video.attention_flops) / 1e12, 1),
             "rolled_kernels_s": round(rolled.kernels_s, 4)}
        peak = peak_seconds(video, row, peaks)
        r["peak_s"] = None if peak is None else round(peak, 4)
        if video.missing or rolled.missing:
            r["missing"] = sorted(set(video.missing) | set(rolled.missing))
        if case:
            r["measured_dit_s"] = case.get("mean_dit_s")
            r["measured_chunk_s"] = case.get("mean_chunk_s")
            if case.get("mean_dit_s"):
                r["measured_over_floor"] = round(case["mean_dit_s"] / video.kernels_s, 2)
        decode = decode_case.get("mean_decode_s")
        link = None
        if h2d_gbps and case.get("uploaded_gb_per_chunk"):
            link = case["uploaded_gb_per_chunk"] / h2d_gbps
            r["link_s"] = round(link, 4)
        if decode is not None:
            r["decode_s"] = decode
            r["floor_s"] = round(max(video.kernels_s, link or 0.0) + decode, 4)
            r["reachable"] = None if target is None else r["floor_s"] <= target
        out[row.name] = r
    return out


# ---- the GPU side ---------------------------------------------------------------------------------------------
def _gemm_call(m: int, n: int, k: int, precision: str) -> Callable[[], torch.Tensor]:
    import torch.nn.functional as F

    from ..quant import fp8

    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    if precision == "bf16":
        return lambda: F.linear(x, w, b)
    w8, ws = fp8.quantize_weight(w)
    x8, xs = fp8.quantize_rows(x)
    return lambda: fp8.scaled_mm(x8, w8.t(), xs, ws, b, torch.bfloat16)


def _attention_calls(lq: int, lk: int, heads: int, kind: str) -> dict[str, Callable]:
    from ..wan.dit import attention as attn
    from ..wan.dit import attention_fp8
    from ..wan.dit.attention_cudnn import CudnnAttention
    from .bench_attention_fp8 import HEAD_DIM, fp8_kernel_only

    g = torch.Generator(device="cuda").manual_seed(lq + lk + heads)
    q, k, v = (torch.randn(1, n, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
               for n in (lq, lk, lk))
    if kind == "fp8":
        return {"cudnn_fp8_kernel": fp8_kernel_only(attention_fp8.FP8Attention(), q, k, v)}
    calls = {"sdpa": lambda: attn.sdpa(q, k, v, attn.sdpa_kernel_order(q.device))}
    if attention_fp8.unavailable_reason(q.device) is None:  # cudnn-frontend present (its tuned bf16 plan)
        exact = CudnnAttention()
        calls["cudnn_frontend"] = lambda: exact(q, k, v)
    return calls


def needed_shapes(cfg: DiTConfig, geo: Geometry = V1) -> dict[str, object]:
    """Every distinct GEMM and attention shape the rows' chunks make, by timing key (one call of each)."""
    needed: dict[str, object] = {}
    for row in ROWS:
        for work in row_video(row, cfg, geo) + [row_rolled(row, cfg, geo)]:
            for key, w in work_keys(work, row, cfg.text_len):
                needed.setdefault(key, w)
    return needed


def time_shapes(cfg: DiTConfig, iters: int, geo: Geometry = V1) -> tuple[dict[str, float], dict[str, dict]]:
    """ms per call of every distinct shape the rows need (attention: the fastest kernel of its kind)."""
    from .common import cuda_ms

    ms, detail = {}, {}
    for key, w in needed_shapes(cfg, geo).items():
        if isinstance(w, cw.Gemm):
            ms[key] = cuda_ms(_gemm_call(*w.shape, key.rsplit(" ", 1)[1]), iters)
            detail[key] = {"ms": round(ms[key], 4), "tflops": round(2 * w.m * w.n * w.k / ms[key] / 1e9, 1)}
        else:
            kernels = {name: cuda_ms(fn, iters) for name, fn in
                       _attention_calls(w.queries, w.keys, w.heads, key.rsplit(" ", 1)[1]).items()}
            ms[key] = min(kernels.values())
            flops = 4 * w.queries * w.keys * w.heads * w.head_dim
            detail[key] = {"ms": round(ms[key], 4), "tflops": round(flops / ms[key] / 1e9, 1),
                           "kernels_ms": {n: round(t, 4) for n, t in kernels.items()}}
        torch.cuda.empty_cache()
    return ms, detail


def pinned_h2d_gbps(gib: float = 1.0, iters: int = 5) -> float:
    """Host->GPU copy rate from pinned memory (GB/s), as the K/V stream copies."""
    from .common import cuda_ms

    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    ms = cuda_ms(lambda: dst.copy_(src, non_blocking=True), iters)
    return n / ms / 1e6


def machine_peaks(name: str) -> Optional[dict]:
    return next((p for key, p in PEAKS.items() if key in name), None)


def measured_cases(path: Optional[str], model: str = "v1-fast") -> dict:
    """The summary of a bench_fast_speed JSON of `model` (ValueError for another model's: results written before
    --model are v1 Fast's)."""
    if not path:
        return {}
    with open(path) as f:
        res = json.load(f)
    if res.get("model", "v1-fast") != model:
        raise ValueError(f"its cases ran {res.get('model', 'v1-fast')}, not {model}")
    return res.get("summary", {})


def list_work(cfg: DiTConfig, geo: Geometry) -> None:
    """What the rows sum, without a GPU: each row's chunk FLOPs (the video's mean and a rolled chunk's) and the
    distinct shapes the timing would take."""
    for row in ROWS:
        video = row_video(row, cfg, geo)
        mean = sum(cw.flops(c) for c in video) / len(video)
        rolled = cw.flops(row_rolled(row, cfg, geo))
        print(f"{row.name:>22}: {mean / 1e12:.1f} TFLOP per chunk (rolled {rolled / 1e12:.1f}), "
              f"target {row_target(row, geo)}")
    shapes = needed_shapes(cfg, geo)
    print(f"{len(shapes)} shapes to time: " + ", ".join(shapes))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results JSON")
    p.add_argument("--measured", default=None,
                   help="a bench_fast_speed results JSON of the same GPU and model (its cases' DiT time, decode, "
                        "link bytes)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per shape")
    p.add_argument("--list", action="store_true", help="print the rows' FLOPs and the shapes to time, and stop "
                   "(no GPU needed)")
    add_model_argument(p)
    args = p.parse_args(argv)
    bm = parse_model(p, args.model, tiny=False)
    geo = Geometry.of(bm)
    if args.list:
        list_work(bm.cfg, geo)
        return 0
    try:
        measured = measured_cases(args.measured, bm.name)
    except (OSError, ValueError) as e:
        print(f"bench_floor: --measured {args.measured}: cannot read it as a bench_fast_speed JSON of {bm.name} "
              f"({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_floor: needs a CUDA GPU (it times the chunk's kernels there)", file=sys.stderr)
        return 2
    from ..wan.dit import attention_fp8

    reason = attention_fp8.unavailable_reason(torch.device("cuda"))
    if reason:
        print(f"bench_floor: the FP8 rows need cuDNN's FP8 attention: {reason}", file=sys.stderr)
        return 2
    from .common import machine_info, write_json

    cfg = bm.cfg
    ms, detail = time_shapes(cfg, args.iters, geo)
    h2d = pinned_h2d_gbps()
    name = torch.cuda.get_device_name()
    rows = summarize(cfg, ms, measured, h2d, machine_peaks(name), geo)
    h, w = bm.size
    results = {"bench": "chunk_floor", "device": name, "machine": machine_info(), "torch": torch.__version__,
               "model": bm.name, "recipe": bm.recipe.to_json(), "config": cfg.to_json(),
               "video": {"height": h, "width": w, "latent_frames": geo.latent_frames, "window": geo.window,
                         "sink": bm.sink, "chunk_frames": geo.chunk_frames, "frame_tokens": geo.frame_tokens},
               "measured_from": args.measured, "pinned_h2d_gbps": round(h2d, 2), "rows": rows, "shapes": detail}
    for n, r in rows.items():
        print(f"{n:>22}: kernels {r['kernels_s']:.3f} s (GEMM {r['gemm_s']:.3f} + attention {r['attention_s']:.3f}; "
              f"at peak {r['peak_s']}; rolled {r['rolled_kernels_s']:.3f}) + decode {r.get('decode_s')} "
              f"= {r.get('floor_s')} vs target {r['target_s']}; measured DiT {r.get('measured_dit_s')} "
              f"({r.get('measured_over_floor')}x the floor), link {r.get('link_s')} s")
    print(f"pinned host->GPU {h2d:.1f} GB/s")
    if args.out:
        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

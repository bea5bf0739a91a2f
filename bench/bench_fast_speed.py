"""Benchmark: a causal model's speed presets and levers, per chunk (issue 26: v1 Fast's 12-frame chunks; issue 48:
the v2 models' 16-frame chunks; `--model`, default v1 Fast).

    # one H100 session, four calls (bench/results/fast_chunk_*_h100.json; each call on a fresh machine writes the
    # Fast expert again, ~20 s, and every case takes 40-65 s)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fast,draft,auto_profile --workdir /tmp/lwfs \
        --keep --fresh --budget-s 430 --min-case-s 45 --out bench/results/fast_chunk_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases exact,decode,auto_overlap,draft_overlap,fast_overlap,\
fold,steps3,window15,fp8_gemm,fp8_attn --workdir /tmp/lwfs --fresh --budget-s 470 --min-case-s 42 \
        --out bench/results/fast_chunk_levers_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases exact,fast,draft --workdir /tmp/lwfs --fresh \
        --budget-s 175 --out bench/results/fast_chunk_presets_h100.json      # draft ran in a 4th call, same machine
    python -m lingbot_world.bench.bench_fast_speed --tiny --out /tmp/fast_speed_tiny.json     # CPU smoke run
    # stored FP8 / INT8 weights (--weights fp8|int8; each copy is converted once from the random NF4 expert)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,int8_weights,fast_fp8_weights,\
draft_fp8_weights --workdir /tmp/lwf --keep --budget-s 560 --min-case-s 45 \
        --out bench/results/fast_chunk_lowp_weights_h100.json
    # today's 24 GB table and where a chunk's time goes (profiles split by the compute stream's idle gaps)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,draft_fp8_weights,draft,draft_profile,\
fast_fp8_weights_profile --workdir /tmp/lwf --keep --budget-s 900 --min-case-s 40 \
        --out bench/results/fast_chunk_spare3_h100.json
    # (its whole-card profiles; its capped rows ran with a 2.5 GiB spare, before today's 3 GiB)
    python -m lingbot_world.bench.bench_fast_speed --cases exact,auto,fp8_weights,fast_fp8_weights,draft_fp8_weights,\
draft_whole_card_profile,fast_fp8_weights_whole_card_profile --workdir /tmp/lwf --keep --budget-s 900 \
        --min-case-s 40 --out bench/results/fast_chunk_fp8_plan_h100.json
    # with the VAE decoder's FrameRings: the 24 GB table, its FP8-weight rows, and the host's share of the idle time
    python -m lingbot_world.bench.bench_fast_speed --cases draft,auto,fast,exact --workdir /tmp/lwf --keep --fresh \
        --budget-s 420 --min-case-s 40 --out bench/results/fast_chunk_ring_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases fp8_weights,draft_fp8_weights --workdir /tmp/lwf --keep \
        --fresh --budget-s 330 --min-case-s 40 --out bench/results/fast_chunk_ring_fp8w_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases draft_host_gaps,auto_host_gaps,fast --workdir /tmp/lwf \
        --keep --fresh --budget-s 400 --min-case-s 40 --out bench/results/fast_chunk_host_gaps_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases decode --workdir /tmp/lwo --budget-s 100 \
        --out bench/results/decode_ring_h100.json        # the chunk decode alone (decode_old_h100.json: before)
    python -m lingbot_world.bench.fast_projection --out bench/results/fast_chunk_projection.json  # RTX projections
    # CUDA graphs once the window rolls (16-chunk videos; *_graphs set LINGBOT_CUDA_GRAPHS=1 in their child)
    python -m lingbot_world.bench.bench_fast_speed --cases draft_rolling,draft_rolling_graphs --workdir /tmp/lwf --keep \
        --fresh --budget-s 260 --min-case-s 40 --out bench/results/fast_rolling_draft_h100.json
    # draft in 2 steps, fast with the FP8 cache, the FP8 cache's integer kernels (BENCHMARKS "draft in 2 steps")
    python -m lingbot_world.bench.bench_fast_speed --cases draft,draft_again,draft_kv_bits,draft_profile,\
draft_steps2_profile --workdir /tmp/lwf --keep --fresh --budget-s 520 --min-case-s 40 \
        --out bench/results/fast_chunk_kv_bits_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases draft_steps2,draft_rolling,draft_rolling_steps2 \
        --workdir /tmp/lwf --keep --budget-s 400 --min-case-s 40 --out bench/results/fast_chunk_steps2_h100.json
    python -m lingbot_world.bench.bench_fast_speed --cases fast_kv_bf16,fast_kv_fp8 --workdir /tmp/lwf --keep \
        --budget-s 200 --min-case-s 40 --out bench/results/fast_chunk_fast_kv_ab1_h100.json
    # the v2 models (issue 48; bench_models.py: 480x832, 77 frames = 5 chunks of 4 latent frames, the play window
    # 18 + sink 6, the model's recipe and camera form). Each model's expert has its own folder in the workdir
    # (v2-1.3b_bnb_nf4: ~0.9 GB, written in ~10 s; v2-14b_bnb_nf4: ~9.6 GB, ~25 s). The 1.3B's presets and its
    # profiles (for fast_projection --model v2-1.3b), then the 14B on the 24 GB cap (a case ~60-75 s there)
    python -m lingbot_world.bench.bench_fast_speed --model v2-1.3b --cases exact,auto,fast,draft,draft_steps2_tiny_vae \
        --workdir /tmp/lwv2 --keep --budget-s 400 --out bench/results/v2_1.3b_chunk_h200.json
    python -m lingbot_world.bench.bench_fast_speed --model v2-1.3b --cases auto_profile,draft_steps2_tiny_vae_profile \
        --workdir /tmp/lwv2 --keep --budget-s 150 --out bench/results/v2_1.3b_chunk_profiles_h200.json
    python -m lingbot_world.bench.bench_fast_speed --model v2-14b --cases exact,auto,draft_steps2_tiny_vae \
        --workdir /tmp/lwv2 --keep --budget-s 300 --min-case-s 60 --out bench/results/v2_14b_chunk_h200.json
    python -m lingbot_world.bench.bench_fast_speed --model v2-1.3b --tiny --cases exact,draft_steps2_tiny_vae \
        --out /tmp/fast_speed_v2_tiny.json                                           # CPU smoke run

Conditions of issue 26's table: 480x832, 81 frames (7 chunks of 3 latent frames), a 24 GB card (the process capped
with set_per_process_memory_fraction, memory planned by `plan_fast_memory` as the CLI does, the VAE's streaming
decode counted in), window 21 + sink 3, camera on. The v2 models the same with their recipe (bench_models.py): 77
frames (5 chunks of 4), window 18 + sink 6 (the 5th chunk is the first past the window), the v2 camera form;
`chunks=N` cases make N chunks (4 * (chunk * N - 1) + 1 frames). A results file holds one model's cases (--out of
another model's is refused: give another file, or --fresh); it records the model, its recipe, window, sink and
video. Targets (`met`): issue 26's for v1 Fast, issue 48's for v2 (fast_speed_cases.TARGETS).

Every case runs in its own child process: the model loads, the speed plan of its preset is applied
(`speed.presets.resolve_preset`, explicit flags over it where the case says), two warm-up chunks run (compile,
cuDNN plans, the decoder's first frames) and are forgotten (the cache's counters go back to 0: every slot a chunk
attends to is written again by the timed run before it is read), then the whole video runs timed, each chunk's
DiT work followed by its streaming VAE decode on the same stream (the frames are ready when the chunk's time ends).
Every chunk runs its context pass (the player's case: the video continues).

Per case: seconds per chunk (DiT + decode, and each part), their mean over the video, peak VRAM and RSS, and the
outputs (the first model call's velocity and every chunk's x0) saved in --workdir; the parent compares them with
the `exact` case's (relative L2): `error_forward` (the very first call: same inputs in every case), `error_chunks`
(each chunk's x0, errors carried through the cache included), `error_video` (the whole latent).

`fp8_weights*` / `int8_weights` cases load the FP8 / INT8 copy of the same expert (`lingbot-world convert-fp8` /
`convert-int8` of the NF4 folder, made once in --workdir by a child process): e4m3 / int8 weights read as stored by
the GEMMs, no NF4 dequantization; their errors are against `exact`, the NF4 model, so they measure what the stored
weights and low-precision activations change.

`*_profile` cases: the middle chunk (v1 Fast's 4th of 7, v2's 3rd of 5) under torch.profiler instead (device
seconds by kernel category, top kernels and operators, the device's busy share of the chunk's unprofiled wall time,
and the compute stream's idle gaps by size, those ending with a host->device copy counted as waits on it: what CUDA
graphs could give back at most).
`*_host_gaps` cases: the same with Python stacks, each host-bound gap charged to the code the host was in
(trace_gaps.host_gap_sources).
`*_whole_card*` cases run without the 24 GB cap (the cache on the GPU, nothing streamed).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..quant.lowp_kinds import LOWP_WEIGHTS
from .bench_models import BenchModel, add_model_argument, parse_model
from .expert_files import PACKAGE, random_experts
from .common import (
    CaseLoop,
    add_case_arguments,
    case_ok,
    child_main,
    earlier_results,
    in_gb,
    mib_in_gb,
    parse_cases,
    run_case_child,
    tiny_children,
)
from .fast_speed_cases import CASES, DEFAULT_CASES, TARGETS, TARGETS_S  # noqa: F401  (TARGETS_S: v1's, the tests')
from .fast_speed_child import CHILDREN, output_path, rel_l2

MODULE = __spec__.name if __spec__ is not None else __name__
V1 = "v1-fast"
REFERENCE = "exact"
FRAMES_REFERENCE = "auto"  # the decode levers change frames, not latents: compared with auto's frames


# ---- the parent --------------------------------------------------------------------------------------------------
def errors_against_reference(workdir: Path, name: str, chunk: int = 3, model: str = V1) -> dict:
    """Relative L2 of the case's saved outputs against its reference case's (`exact` unless the case names
    another), both of `model`: first call, each chunk (`chunk` latent frames), the video."""
    from safetensors.torch import load_file

    reference = CASES.get(name, {}).get("reference", REFERENCE)
    mine, ref = output_path(workdir, "outputs", name, model), output_path(workdir, "outputs", reference, model)
    if name == reference or not mine.is_file() or not ref.is_file():
        return {}
    a, b = load_file(str(mine)), load_file(str(ref))
    la, lb = a["latent"], b["latent"]
    if la.shape != lb.shape:  # another video length: nothing to compare
        return {}
    out = {"error_reference": reference, "error_forward": round(rel_l2(a["first_call"], b["first_call"]), 6),
           "error_chunks": [round(rel_l2(la[:, :, i:i + chunk], lb[:, :, i:i + chunk]), 6)
                            for i in range(0, lb.shape[2], chunk)],
           "error_video": round(rel_l2(la, lb), 6)}
    mine, ref = output_path(workdir, "frames", name, model), output_path(workdir, "frames", FRAMES_REFERENCE, model)
    if name != FRAMES_REFERENCE and mine.is_file() and ref.is_file():  # every 4th frame
        out["error_frames_vs_auto"] = round(rel_l2(load_file(str(mine))["frames"], load_file(str(ref))["frames"]), 6)
    return out


def summarize(res: dict, workdir: Path) -> dict:
    model = res.get("model", V1)  # results written before --model: v1 Fast's
    chunk = (res.get("recipe") or {}).get("chunk_frames", 3)
    targets = TARGETS.get(model, {})
    s: dict = {}
    for name, r in res["cases"].items():
        if not case_ok(r):
            continue
        if CASES.get(name, {}).get("kind") == "decode":
            s[name] = {k: v for k, v in r.items() if isinstance(v, dict) and "s_per_chunk" in v}
            continue
        if CASES.get(name, {}).get("kind") == "link":
            s[name] = {k: v["gb_per_s_each_way"] for k, v in r.items() if isinstance(v, dict)}
            continue
        if r.get("profile"):
            pr = r["profile"]
            split = dict(pr["split"]["seconds"])
            # host<->device copies run on the copy engines beside the kernels; profile_split counts them as
            # "elementwise": take them out so the split and the busy share are the compute engines' alone
            copies = sum(v for k, v in pr["split"]["top_kernels"] if k.startswith("Memcpy"))
            split["elementwise"] = round(split["elementwise"] - copies, 4)
            kernels = round(pr["split"]["kernel_seconds"] - copies, 4)
            wall = pr["wall_s_around"]
            s[name] = {"device_s": kernels, "copies_s": round(copies, 4), "wall_s_around": wall,
                       "device_busy_share": round(kernels / wall, 3) if wall else None, "device_split_s": split,
                       "compute_stream": pr["split"].get("compute_stream"), "host_gaps": pr["split"].get("host_gaps")}
            continue
        chunks = r["chunk_s"]
        mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
        # the whole video (every frame decoded) over its chunks: with an overlapped decode a chunk's own time
        # holds the decode of the chunk before, so only the video's time compares across cases
        row = {"preset": r["speed"]["preset"], "weights": r.get("weights", "nf4"),
               "speed": {k: r["speed"][k] for k in ("compile", "compute", "attention")},
               "levers": r["speed"]["levers"], "mean_chunk_s": round(r["video_s"] / len(chunks), 4),
               "mean_dit_s": mean(r["dit_s"]), "mean_decode_s": mean(r["decode_s"]), "first_chunk_s": chunks[0],
               "calls_per_chunk": r["calls_per_chunk"],
               "s_per_call": round(mean(r["dit_s"]) / r["calls_per_chunk"], 4),
               "fps": round(4 * chunk / mean(chunks), 2), "peak_reserved_gb": in_gb(r.get("peak_reserved")),
               "smi_peak_gb": mib_in_gb(r.get("smi_peak_used_mib")), "peak_rss_gb": in_gb(r.get("peak_rss")),
               "cache_layers_on_gpu": r["plan"].get("cache_layers_on_gpu"), "warm_up_s": r.get("warm_up_s"),
               "warm_chunk_s": r.get("warm_chunk_s"),
               "full_window_chunk_s": chunks[-1],
               "uploaded_gb_per_chunk": round(r.get("uploaded_bytes_timed", 0) / 1e9 / len(chunks), 2),
               "film_blocks": [r["plan"].get("film_blocks", 0), r["plan"].get("film_host_blocks", 0)]}
        rolled = r.get("rolled_from_chunk")
        steady = None if rolled is None else _steady_from(rolled, r.get("captures_by_chunk"))
        if steady is not None and steady < len(chunks):  # the rolled chunks after the ones that capture
            row.update(rolling_chunk_s=mean(chunks[steady:]), rolling_dit_s=mean(r["dit_s"][steady:]),
                       rolling_decode_s=mean(r["decode_s"][steady:]), capture_chunk_s=chunks[rolled],
                       rolling_chunks=len(chunks) - steady, graphs=r.get("graphs"))
        row.update(errors_against_reference(workdir, name, chunk, model))
        target = targets.get(name)
        if target is not None:
            row["target_s"] = target
            row["met"] = row["mean_chunk_s"] <= target
        s[name] = row
    return s


def _steady_from(rolled: int, captures: list | None) -> int:
    """The first chunk of the steady state: after the chunk where the window rolled (its first rolled shape runs
    eagerly and the next captures) and after any later chunk that captured graphs (with the camera FiLM kept, a
    chunk's first call has graphs of its own, captured in the chunk after the roll)."""
    start = rolled + 1
    if captures:
        for i in range(rolled + 1, len(captures)):
            if captures[i] > captures[i - 1]:
                start = i + 1
    return start


def print_report(res: dict) -> None:
    print("\n| case | preset / options / levers | s per chunk (DiT + decode) | DiT | decode | steady: s per chunk (DiT + "
          "decode) | fps | error per forward | error per chunk (first / last) | peak reserved | nvidia-smi | RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | ERROR: {r['error'][:160]} | | | | | | | | | | |")
            continue
        row = res.get("summary", {}).get(name, {})
        if CASES.get(name, {}).get("kind") in ("decode", "link"):
            print(f"| {name} | {CASES[name]['kind']} alone: {json.dumps(row)} | | | | | | | | | | |")
            continue
        if r.get("profile"):
            print(f"| {name} | profiled chunk: kernels {row.get('device_s')} s of ~{row.get('wall_s_around')} s "
                  f"(busy {row.get('device_busy_share')}), copies {row.get('copies_s')} s beside them, "
                  f"{json.dumps(row.get('device_split_s'))} | | | | | | | | | | |")
            continue
        errs = row.get("error_chunks") or []
        # a rolled video's steady state: the chunks after the last that captured CUDA graphs (the video's mean
        # holds the chunks before the roll and the captures)
        steady = (f"{row['rolling_chunk_s']} ({row['rolling_dit_s']} + {row['rolling_decode_s']})"
                  if "rolling_chunk_s" in row else "-")
        print(f"| {name} | {row['preset']} {row.get('weights', 'nf4')} weights {json.dumps(row['speed'])} "
              f"{json.dumps(row['levers'])} | "
              f"{row['mean_chunk_s']} | {row['mean_dit_s']} | {row['mean_decode_s']} | {steady} | {row['fps']} | "
              f"{row.get('error_forward', '-')} | {errs[0] if errs else '-'} / {errs[-1] if errs else '-'} | "
              f"{row['peak_reserved_gb']} GB | {row['smi_peak_gb']} GB | {row['peak_rss_gb']} GB |")


def run(args, bm: BenchModel) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg, recipe = bm.cfg, bm.recipe
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = CaseLoop(args, "fast_speed", device, lambda res: res.update(summary=summarize(res, workdir)),
                    config=cfg.to_json(), **bm.describe(),
                    notes=[f"per chunk ({bm.chunk_frames} latent frames, {bm.chunk_video_frames} video frames): the "
                           "chunk's DiT calls (steps + its context pass) and its streaming VAE decode, timed after "
                           "two warm-up chunks; mean over the video",
                           f"errors: relative L2 against the '{REFERENCE}' case's outputs (same seed and inputs)"])
    paths = {"fast": bm.expert_dir(workdir)}
    experts = random_experts(loop, paths, {"fast": cfg}, device)
    lowp_paths = {kind: bm.expert_dir(workdir, kind) for kind in LOWP_WEIGHTS}
    for kind in sorted({CASES[c].get("weights") for c in args.cases} & set(LOWP_WEIGHTS)):
        loop.res[f"{kind}_copy"] = lowp_copy(paths["fast"], lowp_paths[kind], kind, device,
                                             timeout=max(60.0, loop.remaining()))
        loop.save()

    def run_case(name: str, timeout: float) -> dict:
        c = CASES[name]
        video = bm.video(c.get("chunks"))  # chunks=N: a longer video of the same size, N of the model's chunks
        spec = {"case": name, "kind": c.get("kind", "fast_speed"), "device": device, "tiny": args.tiny,
                "video": list(video), "config": cfg.to_json(), "fast": experts["paths"]["fast"], "workdir": str(workdir),
                "model": bm.name, "recipe": recipe.to_json(),
                "fast_lowp": {kind: str(p) for kind, p in lowp_paths.items()},
                "cap_gib": c.get("cap_gib", 24) if device == "cuda" else None, "context_gib": args.context_gib,
                "window": bm.window, "sink": bm.sink, "expandable_segments": True,
                **{k: v for k, v in c.items() if k in ("preset", "compile", "compute", "attention", "levers",
                                                       "profile", "save_frames", "weights", "host_gaps",
                                                       "graphs", "film", "film_host", "vae_plan_f32", "fp8_kernel",
                                                       "tiny_vae", "tiny_plan_as_vae", "env", "warm_video",
                                                       "kv_codes_on_gpu", "resident")}}
        if args.tiny:
            spec.pop("compile", None)
            if spec.get("levers", {}).get("decode_dtype", "float32") != "float32" and device == "cpu":
                spec["levers"] = {**spec["levers"], "decode_dtype": "float32"}  # CPU autocast: minutes on 2 cores
        return run_case_child(spec, workdir, timeout, MODULE)

    return loop.run(run_case, workdir, written=[*paths.values(), *lowp_paths.values()])


def lowp_copy(nf4: Path, out: Path, kind: str, device: str, timeout: float) -> dict:
    """The FP8 / INT8 copy of the random NF4 expert (`lingbot-world convert-<kind>`, in a child process so this
    one never touches the GPU), reused while it is newer than the NF4 file."""
    weights = out / "model.safetensors"
    if weights.is_file() and weights.stat().st_mtime >= (nf4 / "model.safetensors").stat().st_mtime:
        return {"path": str(out), "reused": True}
    if out.exists():
        shutil.rmtree(out)  # a copy of an older NF4 expert (the converter never replaces a folder)
    print(f"[{kind}] converting {nf4.name} to {kind.upper()} in {out} ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", PACKAGE, f"convert-{kind}", str(nf4), str(out), "--device", device],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"convert-{kind} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    stats = json.loads(proc.stdout[proc.stdout.index("{"):])
    return {"path": str(out), "made_s": round(time.perf_counter() - t0, 1), "stats": stats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(p, CASES, DEFAULT_CASES, budget_s=540.0, min_case_s=40.0,
                       tiny_help="tiny config and video on the CPU (smoke run)",
                       workdir="/tmp/lingbot_fast_speed", workdir_help="where the model's expert and the outputs go "
                       "(each model's its own folder: bench_models.py)", keep_help="keep the expert for the next call")
    add_model_argument(p)
    p.add_argument("--context-gib", type=float, default=0.5, help="GiB a real card loses to the CUDA context")
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, CHILDREN)
    args.cases = parse_cases(p, args.cases, CASES)
    bm = parse_model(p, args.model, args.tiny)
    prior = earlier_results(args.out, args.fresh, "fast_speed")
    if prior.get("cases") and prior.get("model", V1) != bm.name:  # one model's cases per results file
        p.error(f"{args.out} holds cases of {prior.get('model', V1)}, not {bm.name}: "
                "give another --out, or --fresh to start it over")
    with tiny_children(args.tiny):  # one thread per child process, the caller's environment kept
        res = run(args, bm)
    print_report(res)
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

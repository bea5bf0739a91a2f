"""bench_speed's report: each path's error against eager (and its twin's), the summary rows, the consumer-card
projection from the kernel split, the targets met, and the tables printed at the end."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from .speed_cases import (
    CASES,
    FILM_SUFFIX,
    FORWARD,
    LAYERED_SUFFIX,
    MEASURED_ON,
    PROJECTION_CARDS,
    RATIO_TARGETS,
    REFERENCE,
    SWAP_VRAM_TARGET,
    TARGETS,
    twin_of,
)


def project(split_seconds: dict, compute: str, card: dict, measured: dict) -> Optional[float]:
    """Seconds on `card` for a forward whose H100 kernel split is `split_seconds`: attention and GEMMs scale with
    the tensor-core peak of their precision, dequant and elementwise work with memory bandwidth."""
    gemm_kind = compute if compute in ("fp8", "int8", "fp16acc") else "bf16"
    if card.get(gemm_kind) is None:
        return None
    t = split_seconds["attention"] * measured["bf16"] / card["bf16"]
    t += split_seconds["gemm"] * measured[gemm_kind] / card[gemm_kind]
    t += (split_seconds["dequant"] + split_seconds["elementwise"]) * measured["bw_gbs"] / card["bw_gbs"]
    return t


def _load_saved(path: Path) -> Optional[torch.Tensor]:
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))["t"]


def errors_vs_reference(res: dict, workdir: Path) -> None:
    """Relative error of every forward case against `eager` (files saved by the children, possibly by an earlier
    call with the same --workdir)."""
    for kind, prefix in (("forward", "out"), ("run4", "small")):
        ref = _load_saved(workdir / f"{prefix}_{REFERENCE}.safetensors")
        if ref is None:
            continue
        for name, r in res["cases"].items():
            if name == REFERENCE or "error" in r or CASES.get(name, {}).get("kind") != FORWARD:
                continue
            out = _load_saved(workdir / f"{prefix}_{name}.safetensors")
            if out is not None and out.shape == ref.shape:
                r.setdefault("rel_error_vs_eager", {})[kind] = ((out - ref).norm() / ref.norm()).item()
            twin = twin_of(name)
            twin_out = _load_saved(workdir / f"{prefix}_{twin}.safetensors") if twin else None
            if out is not None and twin_out is not None and out.shape == twin_out.shape:
                # layered / the camera cache must reproduce their twin bit for bit (same GEMM shapes, same kernels)
                r["twin"] = twin
                r.setdefault("bit_identical_to_twin", {})[kind] = bool(torch.equal(out, twin_out))
                r.setdefault("rel_error_vs_twin", {})[kind] = (
                    (out - twin_out).norm() / twin_out.norm().clamp_min(1e-30)).item()


def summarize(res: dict) -> dict:
    c = res["cases"]
    ok = lambda r: r is not None and "error" not in r  # noqa: E731
    s: dict = {"rows": {}, "projection": {}}
    base = c.get("baseline", {}).get("s_per_step") if ok(c.get("baseline")) else None
    eager = c.get("eager", {}).get("s_per_step") if ok(c.get("eager")) else None
    for name, r in c.items():
        if CASES.get(name, {}).get("kind") != FORWARD or not ok(r):
            continue
        row = {k: r.get(k) for k in ("s_per_step", "s_per_forward", "first_forward_seconds",
                                     "second_forward_seconds")}
        row["warmup_seconds"] = (round(r["first_forward_seconds"] - r["s_per_forward"], 2)
                                 if r.get("s_per_forward") else None)
        row["peak_allocated_gb"] = round(r["peak_allocated"] / 1e9, 2) if r.get("peak_allocated") else None
        row["peak_reserved_gb"] = round(r["peak_reserved"] / 1e9, 2) if r.get("peak_reserved") else None
        row["activation_peak_gb"] = round(r["activation_peak"] / 1e9, 2) if r.get("activation_peak") else None
        if base and r.get("s_per_step"):
            row["over_baseline"] = round(r["s_per_step"] / base, 3)
        if eager and r.get("s_per_step"):
            row["over_eager"] = round(r["s_per_step"] / eager, 3)
        row["rel_error_vs_eager"] = r.get("rel_error_vs_eager")
        twin = c.get(twin_of(name)) if twin_of(name) else None
        if ok(twin) and twin.get("s_per_step") and r.get("s_per_step"):
            row["twin"] = twin_of(name)
            row["over_twin"] = round(r["s_per_step"] / twin["s_per_step"], 3)
            if r.get("peak_allocated") and twin.get("peak_allocated"):
                row["extra_peak_gb"] = round((r["peak_allocated"] - twin["peak_allocated"]) / 1e9, 2)
        if r.get("bit_identical_to_twin") is not None:
            row["bit_identical_to_twin"] = r["bit_identical_to_twin"]
        if r.get("film_cache"):
            row["film_cache_host_gb"] = round(r["film_cache"].get("host_bytes", 0) / 1e9, 2)
            row["peak_rss_gb"] = round(r.get("peak_rss", 0) / 1e9, 2)
        s["rows"][name] = row
        prof = r.get("profile")
        if prof:
            compute = CASES[name].get("compute", "bf16")
            s["projection"][name] = projection_row(prof, compute, r)
            if compute == "bf16":  # the same kernels with fp16-accumulate GEMMs (the H100 runs those at bf16 speed)
                s["projection"][f"{name}+fp16acc (derived)"] = projection_row(prof, "fp16acc", r)
    return s


def projection_row(prof: dict, compute: str, r: dict) -> dict:
    measured = PROJECTION_CARDS[MEASURED_ON]
    proj = {"h100_kernel_split_s": prof["seconds"], "compute": compute}
    overhead = r["s_per_forward"] - prof["kernel_seconds"] if r.get("s_per_forward") else 0.0
    proj["h100_non_kernel_s"] = round(overhead, 3)
    for card, spec in PROJECTION_CARDS.items():
        if card == MEASURED_ON:
            continue
        fwd = project(prof["seconds"], compute, spec, measured)
        proj[card] = None if fwd is None else {
            "s_per_forward": round(fwd, 2), "s_per_step": round(2 * fwd, 2),
            "sampling_70_steps_min": round(70 * 2 * fwd / 60, 1)}
    return proj


def check_targets(res: dict) -> dict:
    c, t = res["cases"], {}
    for name, (key, limit) in TARGETS.items():
        r = c.get(name)
        if r is not None and "error" not in r and r.get(key) is not None:
            t[f"{name}_{key}<={limit}"] = r[key] <= limit
    for name, r in c.items():
        if CASES.get(name, {}).get("kind") == FORWARD and r and "error" not in r and r.get("peak_reserved"):
            t[f"{name}_swap_vram<=13GB"] = r["peak_reserved"] <= SWAP_VRAM_TARGET
    for name, r in c.items():
        twin = c.get(twin_of(name)) if twin_of(name) else None
        if not (r and "error" not in r and twin and "error" not in twin):
            continue
        limit = RATIO_TARGETS[FILM_SUFFIX if name.endswith(FILM_SUFFIX) else LAYERED_SUFFIX]
        if r.get("s_per_step") and twin.get("s_per_step"):
            t[f"{name}_over_{twin_of(name)}<={limit}"] = r["s_per_step"] / twin["s_per_step"] <= limit
        for kind, same in (r.get("bit_identical_to_twin") or {}).items():
            t[f"{name}_bit_identical_{kind}"] = same
    comp = c.get("compile", {}).get("rel_error_vs_eager", {}) if "error" not in c.get("compile", {"error": 1}) else {}
    if comp.get("forward") is not None:
        t["compile_error<=5e-3"] = comp["forward"] <= 5e-3
    return t


def print_report(res: dict) -> None:
    s = res.get("summary", {})
    print("\n| case | s/step | s/forward | warm-up s | peak VRAM alloc / reserved | vs baseline | err/forward | err/4 steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res["cases"].items():
        if "error" in r:
            print(f"| {name} | ERROR: {r['error'][:90]} | | | | | | |")
            continue
        row = s.get("rows", {}).get(name)
        if row is None:
            continue
        e = row.get("rel_error_vs_eager") or {}
        fmt = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
        print(f"| {name} | {row['s_per_step']} | {row['s_per_forward']} | {row['warmup_seconds']} | "
              f"{row['peak_allocated_gb']} / {row['peak_reserved_gb']} GB | {row.get('over_baseline', '-')} | "
              f"{fmt(e.get('forward'))} | {fmt(e.get('run4'))} |")
    for name, row in s.get("rows", {}).items():
        if "over_twin" in row or "bit_identical_to_twin" in row:
            print(f"{name}: {row.get('over_twin')} x {row.get('twin')}'s s/step, peak {row.get('extra_peak_gb')} GB "
                  f"more, bit-identical {row.get('bit_identical_to_twin')}"
                  + (f", host cache {row['film_cache_host_gb']} GB, peak RSS {row['peak_rss_gb']} GB"
                     if "film_cache_host_gb" in row else ""))
    for name in ("attention", "tiny"):
        if name in res["cases"]:
            print(f"\n{name}: {json.dumps(res['cases'][name], default=str)[:1500]}")
    if s.get("projection"):
        cards = [c for c in PROJECTION_CARDS if c != MEASURED_ON]
        print("\n| path | H100 kernel split (s/forward): attention / GEMM / dequant / elementwise | "
              + " | ".join(f"{c} s/step (70 steps)" for c in cards) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in cards) + " |")
        for name, proj in s["projection"].items():
            sp = proj["h100_kernel_split_s"]
            cells = []
            for c in cards:
                v = proj.get(c)
                cells.append("-" if v is None else f"{v['s_per_step']} ({v['sampling_70_steps_min']} min)")
            print(f"| {name} | {sp['attention']} / {sp['gemm']} / {sp['dequant']} / {sp['elementwise']} | "
                  + " | ".join(cells) + " |")
    print("\ntargets:", json.dumps(res.get("targets", {})))

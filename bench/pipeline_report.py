"""bench_pipeline's report: the summary of its cases (s/step against the whole-expert reference, the switch, the
end-to-end sum), the targets met, and the table printed at the end."""
from __future__ import annotations

import json

from .common import case_ok, gb, in_gb, mib_in_gb
from .pipeline_cases import BLOCK_SWAP_CASES, REFERENCE, SAMPLE_CASES, STEPS_HIGH, STEPS_LOW, TARGETS


def summarize(res: dict, args) -> dict:
    c = res["cases"]
    s: dict = {}
    resident = c.get("resident24")
    ref_step = {"resident24": resident.get("s_per_step") if case_ok(resident) else None}
    if ref_step["resident24"] is None and case_ok(c.get("cfg")):
        ref_step["resident24"] = c["cfg"]["sequential"].get("s_per_step")
    ref_step["swap720"] = c["swap720"].get("s_per_step") if case_ok(c.get("swap720")) else None
    for name in SAMPLE_CASES:
        r = c.get(name)
        if not case_ok(r):
            continue
        row = {"s_per_step": r.get("s_per_step"), "peak_reserved_gb": in_gb(r.get("peak_reserved")),
               "peak_allocated_gb": in_gb(r.get("peak_allocated")), "smi_peak_gb": mib_in_gb(r.get("smi_peak_used_mib")),
               "peak_rss_gb": in_gb(r.get("peak_rss")), "plan": r.get("plan", {}).get("reason")}
        ref = ref_step.get(REFERENCE.get(name))
        if ref and r.get("s_per_step"):
            row["over_resident"] = round(r["s_per_step"] / ref, 3)
        s[name] = row
    sw = c.get("switch")
    if case_ok(sw):
        s["switch"] = {"from_disk_s": sw["disk"]["switch_seconds"], "from_pinned_s": sw["pinned"]["switch_seconds"],
                       "released_all": sw["disk"].get("released_all") and sw["pinned"].get("released_all")}
    # end to end, 464x832x81, 70 steps, from the swap case (the consumer default) and the resident one
    vae = c.get("vae") if case_ok(c.get("vae")) else None
    vae_enc = args.vae_encode_s if args.vae_encode_s is not None else (vae or {}).get("encode_seconds")
    vae_dec = args.vae_decode_s if args.vae_decode_s is not None else (vae or {}).get("decode_seconds")
    for name in ("swap24", "resident24"):
        r = c.get(name)
        if not case_ok(r) or not r.get("s_per_step"):
            continue
        parts = {
            "t5_s": args.t5_seconds,
            "vae_encode_s": vae_enc,
            "load_first_expert_s": r.get("first_load_seconds"),
            "sampling_70_steps_s": round(r["s_per_step"] * (STEPS_HIGH + STEPS_LOW), 1),
            "switch_s": r.get("switch_seconds"),
            "vae_decode_s": vae_dec,
        }
        parts["total_s"] = round(sum(v for v in parts.values() if v), 1)
        parts["missing"] = [k for k, v in parts.items() if v is None]
        s[f"end_to_end_{name}"] = parts
    return s


def check_targets(res: dict) -> dict:
    c, s = res["cases"], res.get("summary", {})
    t: dict = {}
    if "swap24" in c:
        r = c["swap24"]
        t["swap24_runs"] = case_ok(r)
        if case_ok(r) and r.get("peak_reserved") is not None:
            t["swap24_peak_vram<=13GB"] = r["peak_reserved"] <= 13e9
            t["swap24_rss<=4GB"] = (r.get("peak_rss") or 0) <= 4e9
    if "resident24" in c:
        r = c["resident24"]
        t["resident24_runs"] = case_ok(r)
        if case_ok(r) and r.get("peak_reserved") is not None:
            t["resident24_peak_vram<=22.5GB"] = r["peak_reserved"] <= 22.5e9
    for name in BLOCK_SWAP_CASES:
        if name in c:
            t[f"{name}_runs"] = case_ok(c[name])
            if s.get(name, {}).get("over_resident") is not None:
                ref = REFERENCE[name].removesuffix("24")
                t[f"{name}_<=1.3x_{ref}"] = s[name]["over_resident"] <= 1.3
    if "swap720" in c:
        t["swap720_runs"] = case_ok(c["swap720"])
    if "switch" in s:
        t["switch_disk<=5s"] = s["switch"]["from_disk_s"] <= 5
        t["switch_pinned<=1.5s"] = s["switch"]["from_pinned_s"] <= 1.5
        t["release_frees_all"] = bool(s["switch"]["released_all"]) if s["switch"]["released_all"] is not None else None
    if case_ok(c.get("nf4_vs_bf16")):
        t["nf4<=1.05x_bf16"] = c["nf4_vs_bf16"]["nf4_over_bf16"] <= 1.05
    return t


def print_report(res: dict) -> None:
    rows = []
    for name, r in res["cases"].items():
        if "error" in r:
            rows.append([name, "ERROR: " + r["error"][:70], "-", "-", "-", "-", TARGETS.get(name, "")])
            continue
        if name == "switch":
            val = f"disk {r['disk']['switch_seconds']} s, pinned {r['pinned']['switch_seconds']} s"
            rows.append([name, val, "-", "-", "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "nf4_vs_bf16":
            val = f"nf4 {r['nf4']['s_per_step']} s, bf16 {r['bf16']['s_per_step']} s, x{r['nf4_over_bf16']}"
            rows.append([name, val, r["nf4"]["s_per_step"], "-", "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "cfg":
            val = (f"seq {r['sequential'].get('s_per_step')} s, batch {r['batched'].get('s_per_step')} s, "
                   f"unchunked {r['sequential_unchunked'].get('s_per_step')} s, "
                   f"layered {r.get('layered', {}).get('s_per_step')} s")
            rows.append([name, val, r["sequential"].get("s_per_step"), gb(r["sequential"].get("activation_peak")),
                         "-", gb(r.get("peak_rss")), TARGETS[name]])
        elif name == "vae":
            rows.append([name, f"encode {r['encode_seconds']} s, decode {r['decode_seconds']} s", "-",
                         gb(r.get("decode_peak_allocated")), "-", gb(r.get("peak_rss")), TARGETS[name]])
        else:
            plan = r.get("plan", {})
            mode = plan.get("mode", "?") + (f" {plan.get('blocks_on_gpu')}" if plan.get("mode") == "block_swap" else "")
            smi = mib_in_gb(r.get("smi_peak_used_mib"))
            rows.append([name, f"{mode}, {plan.get('cfg_mode')} CFG", r.get("s_per_step"),
                         f"{gb(r.get('peak_allocated'))} / {gb(r.get('peak_reserved'))}",
                         "-" if smi is None else f"{smi:.2f} GB", gb(r.get("peak_rss")), TARGETS.get(name, "")])
    print()
    print("| case | result | s/step | peak VRAM alloc / reserved | nvidia-smi peak | peak RSS | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    for k in ("end_to_end_swap24", "end_to_end_resident24"):
        if k in res.get("summary", {}):
            e = res["summary"][k]
            print(f"\n{k} (70 steps extrapolated): " + ", ".join(f"{a}={b}" for a, b in e.items()))
    print("\ntargets:", json.dumps(res.get("targets", {})))

"""RTX 5090 / 4090 / 3090 per-chunk PROJECTIONS for a causal model's presets, from a data-centre GPU's measured kernel
split (issue 26's method; `--model`, default v1 Fast).

    python -m lingbot_world.bench.fast_projection --out bench/results/fast_chunk_projection.json
    # another model (or v1 Fast from new files): its bench_fast_speed results on one H100 / H200, each preset's
    # unprofiled row and its `<preset>_profile` case (in one file or several), e.g. the v2 1.3B's
    python -m lingbot_world.bench.fast_projection --model v2-1.3b --results bench/results/v2_1.3b_chunk_h200.json \\
        --results bench/results/v2_1.3b_chunk_profiles_h200.json --out bench/results/v2_1.3b_projection.json

Not measurements: each H100 kernel category is scaled by the ratio of the cards' datasheet rates, the host-streamed
K/V copies by the link, and the worst of compute and copies is taken (the copies run beside the kernels):

  matrix work (GEMMs, attention)      x H100 rate / card rate (dense bf16 with fp32 accumulation; FP8 and INT8 at
                                        the card's rate for those, on the GEMMs only)
  memory-bound work (dequant, elementwise, the VAE decode)  x H100 bandwidth / card bandwidth (a lower bound for the
                                        decode, whose convolutions are partly matrix work: its upper bound scales with
                                        the tensor rate)
  host -> GPU K/V copies              bytes per chunk (measured) / the card's link (PCIe 4.0 x16, ~25 GB/s in practice)
  CPU gaps                            the H100's wall minus its kernels, unchanged
  the camera FiLM kept in pinned RAM  (today's plan on a 24 GB card with the RAM for it; the profiles predate it)
                                        the GEMM seconds x (1 - 0.26 x (calls - 1) / calls): its 4 GEMMs are 26 % of
                                        a call's GEMM FLOPs and run in a chunk's first call only; its values (40 x
                                        96 MB) cross the link in every other call, beside the K/V

The measuring card's rates (the H100's or the H200's: the same tensor rates, the H200's memory faster) are those the
split is scaled from. The cards' figures are their datasheets' dense rates (the RTX 5090's from NVIDIA's Blackwell
GeForce whitepaper: bf16 209.5, FP8 419 TFLOP/s with fp32 accumulation, INT8 838 TOPS, 1,792 GB/s; its PCIe 5.0 x16
link taken as ~50 GB/s in practice, twice the 4090's, not measured). The bytes streamed per chunk are those of the
24 GB plan the row ran under: a 32 GB RTX 5090 would keep more of the cache on the card (its copies column is an
upper bound).

With --results (any model): each preset P with a row and a `P_profile` case in the files is projected from that
profile's split, its row's DiT seconds (host = DiT minus the profiled kernels), decode seconds and uploaded bytes,
its GEMMs at the row's compute precision (FP8 rows at the card's FP8 rate, INT8 where it has none); the profiles
already include the camera FiLM as the plan keeps it (no FiLM adjustment).

Inputs of the default v1 projection, all from today's code on one H100 with the 24 GB cap: the kernel split of a
mid-video chunk (`fast_chunk_profiles_h100.json`: `auto_profile`, compiled bf16; `draft_profile`, FP8 GEMMs and the
draft levers),
the unprofiled rows' DiT seconds, decode seconds and uploaded bytes per chunk (`fast_chunk_fused_h100.json` for
`auto`, `fast_chunk_today_h100.json` for `fast` and `draft`). The host's share is the unprofiled DiT seconds minus
the profiled kernels (the profiler's own gaps are left out). `fast` has no NF4 profile: its FP8 GEMM seconds are
the `auto` split's GEMM seconds minus what `fast` saved on the H100. `draft` in 3 and in 2 steps (`--chunk-steps
2`) also come from a later session's profiles (`fast_chunk_kv_bits_h100.json`, `fast_chunk_steps2_h100.json`),
made with the camera FiLM kept in pinned RAM and the FP8 K/V cache; with the tiny decoder from
`fast_chunk_tiny_vae_ab_h100.json`, and with the NF4 weights prepared in one kernel from a profile on one H100
(`fast_rolling_kv_codes_b_h100.json`) and its unprofiled row on another the same day (`fast_chunk_kv_codes_h100.json`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).resolve().parent / "results"
FILM_GEMM_SHARE = 0.26  # the camera FiLM's 4 GEMMs in a block's GEMM FLOPs on the video tokens
FILM_GB_PER_CALL = 40 * 0.0958  # 40 blocks x 96 MB at 480x832
# dense tensor TFLOP/s (bf16 with fp32 accumulation; fp8 with fp32 accumulation; int8 TOPS; fp16 with fp16
# accumulation: --compute fp16acc, twice bf16 on GeForce cards, the same on data-centre ones), GB/s, host link GB/s
CARDS = {
    "H100 SXM": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp16acc": 989.4, "bandwidth": 3352, "link": 55},
    "H200 SXM": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp16acc": 989.4, "bandwidth": 4800, "link": 55},
    "RTX 5090": {"bf16": 209.5, "fp8": 419.0, "int8": 838.0, "fp16acc": 419.0, "bandwidth": 1792, "link": 50},
    "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "fp16acc": 330.3, "bandwidth": 1008, "link": 25},
    "RTX 3090": {"bf16": 71.0, "fp8": None, "int8": 284.0, "fp16acc": 142.0, "bandwidth": 936, "link": 25},
}
SOURCES = ("H100 SXM", "H200 SXM")  # the cards measured on: what a projection scales from
PROJECTED = [name for name in CARDS if name not in SOURCES]


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def source_card(gpu: str) -> str:
    """The CARDS entry of the GPU a results file ran on (its machine's name); the H100's where it is no H200."""
    return "H200 SXM" if "H200" in (gpu or "") else "H100 SXM"


def project(split: dict, host_s: float, decode_s: float, uploaded_gb: float, card: dict, *,
            gemm_h100: str = "bf16", gemm_card: str = "bf16", gemm_share: float = 1.0,
            film_calls: int = 0, source: str = "H100 SXM", attention: str = "bf16") -> dict:
    """One chunk on `card` from the `source` card's kernel split (seconds; the H100's by default). Its GEMM seconds
    (times gemm_share) ran at its `gemm_h100` rate and run at the card's `gemm_card` rate; attention in bf16, or
    "int8" (SageAttention: INT8 q.k and fp16 p.v with fp16 accumulation, scaled by the INT8 rates; on these cards
    fp16 with fp16 accumulation has the same ratio as INT8: 989/330 on the RTX 4090, 989/142 on the 3090, 989/419 on
    the 5090). film_calls: the chunk's model calls when the camera FiLM is kept in RAM (0: as profiled)."""
    if film_calls:
        gemm_share *= 1 - FILM_GEMM_SHARE * (film_calls - 1) / film_calls
        uploaded_gb += FILM_GB_PER_CALL * (film_calls - 1)
    h100 = CARDS[source]
    if card[gemm_card] is None:
        return {"note": f"no {gemm_card} tensor cores"}
    tc = h100["bf16"] / card["bf16"]
    bw = h100["bandwidth"] / card["bandwidth"]
    gemm = split["gemm"] * gemm_share * h100[gemm_h100] / card[gemm_card]
    attn = h100["int8"] / card["int8"] if attention == "int8" else tc
    compute = gemm + split["attention"] * attn + (split["dequant"] + split["elementwise"]) * bw + max(0.0, host_s)
    copies = uploaded_gb / card["link"]
    dit = max(compute, copies)
    return {"dit_s": round(dit, 2), "compute_s": round(compute, 2), "copies_s": round(copies, 2),
            "decode_s": [round(decode_s * bw, 2), round(decode_s * tc, 2)],
            "chunk_s": [round(dit + decode_s * bw, 2), round(dit + decode_s * tc, 2)]}


def _kernels(split: dict) -> float:
    return sum(split.values())


def run() -> dict:
    profiles = _load("fast_chunk_profiles_h100.json")["summary"]
    auto = _load("fast_chunk_fused_h100.json")["summary"]["auto"]
    today = _load("fast_chunk_today_h100.json")["summary"]
    fast, draft = today["fast"], today["draft"]
    a_split = profiles["auto_profile"]["device_split_s"]
    d_split = profiles["draft_profile"]["device_split_s"]
    # FP8's GEMM seconds as a share of bf16's on the H100: what fast saved, all of it put on the GEMMs
    fp8_share = max(0.1, (a_split["gemm"] - (auto["mean_dit_s"] - fast["mean_dit_s"])) / a_split["gemm"])
    out = {"method": __doc__.strip().splitlines()[0], "cards": CARDS, "h100_split_s": {"auto": a_split,
           "draft": d_split}, "fp8_gemm_share_of_bf16_h100": round(fp8_share, 3), "rows": {}}
    host = {"auto": auto["mean_dit_s"] - _kernels(a_split), "draft": draft["mean_dit_s"] - _kernels(d_split)}
    out["h100_host_s"] = {k: round(v, 3) for k, v in host.items()}
    for name in PROJECTED:
        card = CARDS[name]
        low = "fp8" if card["fp8"] else "int8"  # INT8 taken to reach FP8's share of its peak (not measured)
        for film, calls_auto, calls_draft, tag in ((False, 0, 0, ""), (True, 5, 3, ", FiLM in RAM")):
            rows = out["rows"].setdefault(name, {})
            rows[f"auto (exact, compiled){tag}"] = project(a_split, host["auto"], auto["mean_decode_s"],
                                                           auto["uploaded_gb_per_chunk"], card, film_calls=calls_auto)
            rows[f"fast ({low} GEMMs){tag}"] = project(a_split, host["auto"], fast["mean_decode_s"],
                                                       fast["uploaded_gb_per_chunk"], card, gemm_h100="fp8",
                                                       gemm_card=low, gemm_share=fp8_share, film_calls=calls_auto)
            rows[f"draft ({low} GEMMs + levers){tag}"] = project(d_split, host["draft"], draft["mean_decode_s"],
                                                                 draft["uploaded_gb_per_chunk"], card,
                                                                 gemm_h100="fp8", gemm_card=low,
                                                                 film_calls=calls_draft)
    # draft in 3 and 2 steps from one later H100 session, profiled with the plan of today (the camera FiLM kept in
    # pinned RAM, the FP8 K/V cache): those profiles include the FiLM already (film_calls 0), right-hand columns only
    later = _load("fast_chunk_kv_bits_h100.json")["summary"]
    steps2 = _load("fast_chunk_steps2_h100.json")["summary"]["draft_steps2"]
    tiny = _load("fast_chunk_tiny_vae_ab_h100.json")["summary"]  # the tiny decoder instead of the VAE (--tiny-vae)
    # the NF4 weights prepared for the FP8 GEMMs in one kernel (quant/nf4_rows.py): a profile of today's plan on a
    # machine with RAM to spare (bf16 cache layers on the card) and the unprofiled row of another H100 the same day
    rows_profile = _load("fast_rolling_kv_codes_b_h100.json")["summary"]["draft_steps2_tiny_vae_bf16_layers_profile"]
    rows_row = _load("fast_chunk_kv_codes_h100.json")["summary"]["draft_steps2_tiny_vae_bf16_layers"]
    for tag, profile, row in (("draft, profiled with today's plan", later["draft_profile"], later["draft"]),
                              ("draft --chunk-steps 2", later["draft_steps2_profile"], steps2),
                              ("draft --chunk-steps 2 --tiny-vae", tiny["draft_steps2_tiny_vae_profile"],
                               tiny["draft_steps2_tiny_vae"]),
                              ("draft --chunk-steps 2 --tiny-vae, NF4 to FP8 rows in one kernel", rows_profile,
                               rows_row)):
        split = profile["device_split_s"]
        for name in PROJECTED:
            card = CARDS[name]
            low = "fp8" if card["fp8"] else "int8"
            out["rows"][name][f"{tag} ({low} GEMMs), FiLM in RAM"] = project(
                split, row["mean_dit_s"] - _kernels(split), row["mean_decode_s"], row["uploaded_gb_per_chunk"], card,
                gemm_h100="fp8", gemm_card=low)
    out["h100_measured"] = {"auto": auto["mean_chunk_s"], "fast": fast["mean_chunk_s"],
                            "draft": draft["mean_chunk_s"], "draft (later session)": later["draft"]["mean_chunk_s"],
                            "draft --chunk-steps 2": steps2["mean_chunk_s"],
                            "draft --chunk-steps 2 --tiny-vae": tiny["draft_steps2_tiny_vae"]["mean_chunk_s"],
                            "draft --chunk-steps 2 --tiny-vae, NF4 to FP8 rows in one kernel": rows_row["mean_chunk_s"]}
    return out


def run_results(model: str, paths, rows_for: Optional[dict] = None) -> dict:
    """The projection of every preset of `model` that has a row and a `<preset>_profile` case in the
    bench_fast_speed results `paths` (one GPU: the first file's); ValueError for another model's file or when no
    preset has both. rows_for: {preset: case} takes a profiled preset's host, decode and upload seconds from
    another case's row (the same kernels run another way, e.g. replayed from CUDA graphs once the window rolled,
    as played). A preset whose GEMMs ran in FP8 is also projected with bf16 GEMMs (its GEMM seconds at the FP8 rate
    turned into the card's bf16 rate: an upper bound, small GEMMs reach less of FP8's peak than of bf16's)."""
    summary: dict = {}
    rolled: set = set()  # profiles of a chunk after the window rolled: paired with their rows' rolled chunks
    source = None
    for path in paths:
        res = json.loads(Path(path).read_text())
        if res.get("model", "v1-fast") != model:  # results written before --model are v1 Fast's
            raise ValueError(f"{path} holds {res.get('model', 'v1-fast')}'s cases, not {model}'s")
        summary.update(res.get("summary", {}))
        rolled.update(name for name, case in (res.get("cases") or {}).items() if _profiled_rolled(case))
        source = source or source_card((res.get("machine") or {}).get("gpu", ""))
    out = {"method": __doc__.strip().splitlines()[0], "model": model, "source": source,
           "inputs": [str(p) for p in paths], "cards": CARDS, "split_s": {}, "host_s": {}, "measured": {}, "rows": {name: {} for name in PROJECTED}}
    for name, prof in summary.items():
        row = summary.get(name[:-len("_profile")]) if name.endswith("_profile") else None
        if not row or "device_split_s" not in prof or "mean_dit_s" not in row:
            continue
        preset = name[:-len("_profile")]
        split = prof["device_split_s"]
        speed = row.get("speed") or {}
        gemm = speed.get("compute", "bf16")
        attention = "int8" if speed.get("attention") == "sage" else "bf16"
        timed = row
        if (rows_for or {}).get(preset):
            timed = summary.get(rows_for[preset])
            if not timed or "mean_dit_s" not in timed:
                raise ValueError(f"no row {rows_for[preset]!r} for {preset}'s host seconds in {', '.join(map(str, paths))}")
        steady = name in rolled and "rolling_dit_s" in timed  # a rolled chunk's kernels: the rolled chunks' times
        dit_s, decode_s, chunk_s = ((timed["rolling_dit_s"], timed["rolling_decode_s"], timed["rolling_chunk_s"])
                                    if steady else (timed["mean_dit_s"], timed["mean_decode_s"], timed["mean_chunk_s"]))
        host = dit_s - _kernels(split)
        out["split_s"][preset], out["host_s"][preset] = split, round(host, 3)
        out["measured"][preset] = chunk_s
        for card_name in PROJECTED:
            card = CARDS[card_name]
            low = gemm if gemm == "bf16" or card.get(gemm) else "int8"  # INT8 where the card has no FP8
            for card_gemm in dict.fromkeys((low, "bf16" if gemm != "bf16" else low)):
                label = f"{preset} ({card_gemm} GEMMs{', SageAttention INT8' if attention == 'int8' else ''})"
                out["rows"][card_name][label] = project(
                    split, host, decode_s, timed.get("uploaded_gb_per_chunk", 0.0), card, gemm_h100=gemm,
                    gemm_card=card_gemm, source=source, attention=attention)
    if not out["measured"]:
        raise ValueError(f"no preset of {model} has both its row and its <preset>_profile case in "
                         f"{', '.join(map(str, paths))}")
    return out


def _profiled_rolled(case: dict) -> bool:
    """Was this case's profiled chunk one after its K/V window rolled (the steady state a player runs in)?"""
    profile, rolled_from = case.get("profile"), case.get("rolled_from_chunk")
    return isinstance(profile, dict) and rolled_from is not None and profile.get("chunk", -1) > rolled_from


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write the projection JSON here")
    p.add_argument("--model", default="fast", help="the causal model whose results are projected (default fast: "
                   "v1 Fast, from the committed H100 results unless --results names others)")
    p.add_argument("--results", action="append", default=None,
                   help="a bench_fast_speed results JSON of --model (repeat for several); each preset needs its row "
                        "and its <preset>_profile case")
    p.add_argument("--row", action="append", default=[], metavar="PRESET=CASE",
                   help="take a profiled preset's host and decode seconds from another case's row (repeatable), e.g. "
                        "draft_steps2_tiny_vae=draft_rolling_steps2_tiny_vae_as_played")
    args = p.parse_args(argv)
    rows_for = {}
    for spec in args.row:
        preset, sep, case = spec.partition("=")
        if not sep or not preset or not case:
            p.error(f"--row {spec}: give PRESET=CASE")
        rows_for[preset] = case
    from ..world.models import model as registry_model

    try:
        name = registry_model(args.model).name
    except KeyError as e:
        p.error(str(e).strip("'\""))
    if args.results:
        try:
            res = run_results(name, args.results, rows_for)
        except (OSError, ValueError) as e:
            p.error(str(e))
    elif name == "v1-fast":
        res = run()
    else:
        p.error(f"--model {name}: give --results (its bench_fast_speed JSONs with <preset>_profile cases)")
    for card, rows in res["rows"].items():
        for row, r in rows.items():
            print(f"{card:9s} {row:30s} {json.dumps(r)}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

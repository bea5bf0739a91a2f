"""RTX 4090 / RTX 3090 per-chunk PROJECTIONS for the Fast presets, from the H100's measured kernel split (issue 26).

    python -m lingbot_world.bench.fast_projection --out bench/results/fast_chunk_projection.json

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

Inputs, all from today's code on one H100 with the 24 GB cap: the kernel split of a mid-video chunk
(`fast_chunk_profiles_h100.json`: `auto_profile`, compiled bf16; `draft_profile`, FP8 GEMMs and the draft levers),
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

RESULTS = Path(__file__).resolve().parent / "results"
FILM_GEMM_SHARE = 0.26  # the camera FiLM's 4 GEMMs in a block's GEMM FLOPs on the video tokens
FILM_GB_PER_CALL = 40 * 0.0958  # 40 blocks x 96 MB at 480x832
# dense tensor TFLOP/s (bf16 with fp32 accumulation; fp8 with fp32 accumulation; int8 TOPS), GB/s, host link GB/s
CARDS = {
    "H100 SXM": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "bandwidth": 3352, "link": 55},
    "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "bandwidth": 1008, "link": 25},
    "RTX 3090": {"bf16": 71.0, "fp8": None, "int8": 284.0, "bandwidth": 936, "link": 25},
}


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def project(split: dict, host_s: float, decode_s: float, uploaded_gb: float, card: dict, *,
            gemm_h100: str = "bf16", gemm_card: str = "bf16", gemm_share: float = 1.0,
            film_calls: int = 0) -> dict:
    """One chunk on `card` from the H100's kernel split (seconds). The H100's GEMM seconds (times gemm_share) ran
    at its `gemm_h100` rate and run at the card's `gemm_card` rate; attention in bf16. film_calls: the chunk's
    model calls when the camera FiLM is kept in RAM (0: computed at every call, as profiled)."""
    if film_calls:
        gemm_share *= 1 - FILM_GEMM_SHARE * (film_calls - 1) / film_calls
        uploaded_gb += FILM_GB_PER_CALL * (film_calls - 1)
    h100 = CARDS["H100 SXM"]
    if card[gemm_card] is None:
        return {"note": f"no {gemm_card} tensor cores"}
    tc = h100["bf16"] / card["bf16"]
    bw = h100["bandwidth"] / card["bandwidth"]
    gemm = split["gemm"] * gemm_share * h100[gemm_h100] / card[gemm_card]
    compute = gemm + split["attention"] * tc + (split["dequant"] + split["elementwise"]) * bw + max(0.0, host_s)
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
    for name, card in CARDS.items():
        if name == "H100 SXM":
            continue
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
        for name, card in CARDS.items():
            if name == "H100 SXM":
                continue
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write the projection JSON here")
    args = p.parse_args(argv)
    res = run()
    for card, rows in res["rows"].items():
        for row, r in rows.items():
            print(f"{card:9s} {row:30s} {json.dumps(r)}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

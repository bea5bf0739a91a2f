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

Inputs: `auto_profile` (the 4th of 7 chunks, compiled, bf16; its split is taken as the video's mean chunk, since
attention grows linearly with the chunk index), the `auto`, `fast` and `draft` rows (DiT seconds, uploaded bytes per
chunk), and the decode seconds of the same rows with today's decoder (`fast_chunk_ring_h100.json`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# dense tensor TFLOP/s (bf16 with fp32 accumulation; fp8 with fp32 accumulation; int8 TOPS), GB/s, host link GB/s
CARDS = {
    "H100 SXM": {"bf16": 989.4, "fp8": 1978.9, "int8": 1978.9, "bandwidth": 3352, "link": 55},
    "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "bandwidth": 1008, "link": 25},
    "RTX 3090": {"bf16": 71.0, "fp8": None, "int8": 284.0, "bandwidth": 936, "link": 25},
}


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def project(split: dict, wall: float, decode_s: float, uploaded_gb: float, card: dict, lowp: str | None,
            lowp_gemm_share: float, calls_scale: float = 1.0, decode_scale: float = 1.0) -> dict:
    """One chunk on `card` from the H100's split (seconds). lowp: "fp8"/"int8" GEMMs at that rate (None: bf16);
    lowp_gemm_share: the share of the H100's bf16 GEMM seconds the low-precision GEMMs took there (measured)."""
    h100 = CARDS["H100 SXM"]
    tc = h100["bf16"] / card["bf16"]
    bw = h100["bandwidth"] / card["bandwidth"]
    gemm = split["gemm"] * tc
    if lowp:
        rate = card[lowp]
        if rate is None:
            return {"note": f"no {lowp} tensor cores"}
        # the H100's low-precision GEMM seconds, scaled by that precision's rate ratio
        gemm = split["gemm"] * lowp_gemm_share * (CARDS["H100 SXM"][lowp] / rate)
    compute = (gemm + split["attention"] * tc + (split["dequant"] + split["elementwise"]) * bw) * calls_scale
    gaps = max(0.0, wall - sum(split.values())) * calls_scale
    copies = uploaded_gb / card["link"]
    dit = max(compute + gaps, copies)
    dec = decode_s * decode_scale
    return {"dit_s": round(dit, 2), "compute_s": round(compute + gaps, 2), "copies_s": round(copies, 2),
            "decode_s": [round(dec * bw, 2), round(dec * tc, 2)],
            "chunk_s": [round(dit + dec * bw, 2), round(dit + dec * tc, 2)]}


def run() -> dict:
    first = _load("fast_chunk_h100.json")
    levers = _load("fast_chunk_levers_h100.json")
    presets = _load("fast_chunk_presets_h100.json")
    draft = _load("fast_chunk_draft_h100.json")
    prof = first["summary"]["auto_profile"]
    split, wall = prof["device_split_s"], prof["wall_s_around"]
    auto = first["summary"]["auto"]
    fast = presets["summary"]["fast"]
    drow = draft["summary"]["draft"]
    decode = {k: v["mean_decode_s"] for k, v in _load("fast_chunk_ring_h100.json")["summary"].items()}
    upl_full = levers["summary"]["exact"]["uploaded_gb_per_chunk"]
    # FP8's GEMM seconds as a share of bf16's on the H100: what fast saved, all of it put on the GEMMs
    fp8_share = max(0.1, (split["gemm"] - (auto["mean_dit_s"] - fast["mean_dit_s"])) / split["gemm"])
    out = {"method": __doc__.strip().splitlines()[0], "cards": CARDS, "h100_split_s": split, "h100_wall_s": wall,
           "fp8_gemm_share_of_bf16_h100": round(fp8_share, 3), "rows": {}}
    draft_scale = drow["mean_dit_s"] / fast["mean_dit_s"]  # draft's levers on the DiT, measured on the H100
    for name, card in CARDS.items():
        if name == "H100 SXM":
            continue
        low = "fp8" if card["fp8"] else "int8"
        share = fp8_share  # INT8's share of the bf16 GEMM seconds taken as FP8's (INT8 not measured on Ampere)
        out["rows"][name] = {
            "auto (exact, compiled)": project(split, wall, decode["auto"], upl_full, card, None, 1.0),
            f"fast ({low} GEMMs)": project(split, wall, decode["fast"], upl_full, card, low, share),
            f"draft ({low} GEMMs + levers)": project(split, wall, decode["draft"],
                                                     drow["uploaded_gb_per_chunk"], card, low, share,
                                                     calls_scale=draft_scale),
        }
    out["h100_measured"] = {"auto": auto["mean_chunk_s"], "fast": fast["mean_chunk_s"], "draft": drow["mean_chunk_s"]}
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

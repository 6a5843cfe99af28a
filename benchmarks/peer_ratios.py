"""Per-prompt ratios of a `paradec bench` run against a peer row (default llama.cpp): the median and
the mean of per-prompt tokens/s ratios, next to each method's ms per step and rows verified.

    python benchmarks/peer_ratios.py benchmarks/results/cpu_avx2_chat3_after [--peer llamacpp]

Prints one Markdown table per run directory (its results.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def table(run: Path, peer: str) -> str:
    result = json.loads((run / "results.json").read_text())
    by: dict[str, dict] = {}
    for rec in result["records"]:
        by.setdefault(rec["method"], {})[rec["prompt_id"]] = rec
    base = by.get(peer)
    ar_name = "ar" if "ar" in by else next((m for m in by if m.startswith("ar@")), "ar")
    ar = by.get(ar_name)  # a run with no torch `ar`: its first `ar@...`
    lines = [
        f"{run.name}: {result['machine'].get('cpu', result['machine'].get('processor'))}; formats "
        f"{result.get('formats', 'bf16 default')}",
        f"| method | tokens/s | vs {peer} (median) | vs {peer} (mean) | vs {ar_name} (median) | ms/step "
        "| rows verified/step "
        "| tau | identical to ar |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def mean(values: list) -> str:
        values = [v for v in values if v]
        return f"{statistics.mean(values):.3g}" if values else ""

    for method, recs in by.items():
        ps = list(recs)
        vs_peer = [recs[p]["tokens_per_s"] / base[p]["tokens_per_s"] for p in ps] if base else [float("nan")]
        vs_ar = [recs[p]["tokens_per_s"] / ar[p]["tokens_per_s"] for p in ps]
        same = [bool(recs[p].get("identical_to_ar")) for p in ps]
        lines.append(
            f"| {method} | {statistics.mean(recs[p]['tokens_per_s'] for p in ps):.1f} | "
            f"{statistics.median(vs_peer):.2f} | {statistics.mean(vs_peer):.2f} | {statistics.median(vs_ar):.2f} | "
            f"{mean([recs[p].get('ms_per_step') for p in ps])} | "
            f"{mean([recs[p].get('verified_per_step') for p in ps])} | {mean([recs[p].get('tau') for p in ps])} | "
            f"{sum(same)}/{len(same)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--peer", default="llamacpp")
    args = ap.parse_args()
    missing = [run for run in args.runs if not (run / "results.json").is_file()]
    if missing:  # a run still going (or stopped) has only partial.json
        ap.error(f"{missing[0]} has no results.json; give a finished `paradec bench --out` folder")
    print("\n\n".join(table(run, args.peer) for run in args.runs))


if __name__ == "__main__":
    main()

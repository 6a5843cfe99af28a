"""One results.json, summarized again over a subset of its categories, under one name.

    python benchmarks/subset.py benchmarks/results/specbench5_b1 --name mt-bench \
        --categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities

Spec-Bench's eight MT-bench categories are MT-bench's own questions (both turns, the second after
the model's own first answer), so one interleaved run gives the MT-bench table too, timed side by
side with the rest. Prints the table (same columns as `paradec bench`) and writes
RESULTS_DIR/NAME.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paradec.bench.harness import COLUMNS, summarize
from paradec.bench.report import markdown_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", help="a `paradec bench --out` directory")
    ap.add_argument("--categories", required=True, help="comma-separated category names")
    ap.add_argument("--name", required=True, help="the subset's name (its row label and file name)")
    args = ap.parse_args()
    out_dir = Path(args.results)
    result = json.loads((out_dir / "results.json").read_text())
    wanted = set(args.categories.split(","))
    missing = wanted - {r["category"] for r in result["records"]}
    if missing:
        print(f"error: no records of categories {', '.join(sorted(missing))} in {out_dir / 'results.json'}; "
              f"check --categories", file=sys.stderr)
        sys.exit(2)
    records = [dict(r, category=args.name) for r in result["records"] if r["category"] in wanted]
    methods = list(dict.fromkeys(r["method"] for r in records))
    rows = [r for r in summarize(records, methods) if r["category"] == args.name]
    for r in rows:  # P(accepted | offered) per depth, to depth 4
        r["accept_per_depth"] = "/".join(f"{a:.2f}" for a in r["accept_per_depth"][:4]) or None
    table = markdown_table(rows, COLUMNS + ["accept_per_depth"])
    (out_dir / f"{args.name}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

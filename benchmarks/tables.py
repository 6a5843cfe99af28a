"""More tables from one `paradec bench` run: a category x method grid, and subsets of categories.

    python benchmarks/tables.py benchmarks/results/specbench5_b1 \
        --subset mt-bench=writing,roleplay,reasoning,math,coding,extraction,stem,humanities

``--exclude ID,...`` drops prompts (e.g. one whose `ar` run hit a machine stall) from every
table and says so at the top. Writes RESULTS_DIR/grid.md (speedup vs `ar` per category and method, then tau) and, per
``--subset NAME=CATS``, RESULTS_DIR/NAME.md: the run summarized again over those categories with
`paradec bench`'s columns plus acceptance per depth. Spec-Bench's eight MT-bench categories are
MT-bench's own questions (both turns, the second after the model's own first answer), so one
interleaved run gives the MT-bench table too, timed side by side with the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paradec.bench.records import COLUMNS, summarize
from paradec.bench.report import markdown_table


def grid(summary: list[dict], key: str) -> str:
    """Categories down, methods across: ``key`` of each summary row."""
    methods = list(dict.fromkeys(r["method"] for r in summary))
    cats = list(dict.fromkeys(r["category"] for r in summary))
    cell = {(r["category"], r["method"]): r.get(key) for r in summary}
    rows = [{"category": c, **{m: cell.get((c, m)) for m in methods}} for c in cats]
    return markdown_table(rows, ["category", *methods])


def subset(records: list[dict], name: str, wanted: set[str]) -> str:
    """The records of categories ``wanted``, summarized as one category ``name``."""
    mine = [dict(r, category=name) for r in records if r["category"] in wanted]
    methods = list(dict.fromkeys(r["method"] for r in mine))
    rows = [r for r in summarize(mine, methods) if r["category"] == name]
    for r in rows:  # P(accepted | offered) per depth, to depth 4
        r["accept_per_depth"] = "/".join(f"{a:.2f}" for a in r["accept_per_depth"][:4]) or None
    return markdown_table(rows, COLUMNS + ["accept_per_depth"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", help="a `paradec bench --out` directory")
    ap.add_argument(
        "--subset",
        action="append",
        default=[],
        metavar="NAME=CAT,CAT,...",
        help="a table over these categories (repeatable)",
    )
    ap.add_argument("--exclude", default="", metavar="ID,...", help="prompt ids to leave out of every table")
    args = ap.parse_args()
    out_dir = Path(args.results)
    if not (out_dir / "results.json").exists():
        print(f"error: no results.json in {out_dir}; pass a `paradec bench --out` directory", file=sys.stderr)
        sys.exit(2)
    result = json.loads((out_dir / "results.json").read_text())
    excluded = set(filter(None, args.exclude.split(",")))
    records = [r for r in result["records"] if r["prompt_id"] not in excluded]
    if excluded - {r["prompt_id"] for r in result["records"]}:
        print(f"error: --exclude names prompts not in this run: {', '.join(sorted(excluded))}", file=sys.stderr)
        sys.exit(2)
    summary = summarize(records, result["config"]["methods"]) if excluded else result["summary"]
    note = f"(prompts left out: {', '.join(sorted(excluded))})\n\n" if excluded else ""
    found = {r["category"] for r in records}
    tables = {
        "grid": note
        + "Speedup vs `ar`:\n\n"
        + grid(summary, "speedup_vs_ar")
        + "\n\ntau (tokens per target pass):\n\n"
        + grid(summary, "tau")
    }
    for spec in args.subset:
        name, _, cats = spec.partition("=")
        wanted = set(filter(None, cats.split(",")))
        if not name or not wanted or wanted - found:
            print(
                f"error: --subset {spec!r}: want NAME=CAT,CAT,... with categories of this run "
                f"({', '.join(sorted(found))})",
                file=sys.stderr,
            )
            sys.exit(2)
        tables[name] = note + subset(records, name, wanted)
    for name, table in tables.items():
        (out_dir / f"{name}.md").write_text(table + "\n")
        print(f"{name}:\n{table}\n")


if __name__ == "__main__":
    main()

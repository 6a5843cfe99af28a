"""`auto` against every fixed method of one interleaved `paradec bench` run (issue 33's goals).

    python benchmarks/auto_report.py benchmarks/results/auto_specbench39

Writes RUN/auto.md and prints it:
- per method: the median and mean of per-prompt speedups vs `ar`, the worst prompt, tau;
- `auto` against the best fixed paradec method (by median per-prompt speedup; peers are not
  methods): the median of per-prompt ratios, and `auto`'s worst prompt against `ar` (the goal:
  >= 0.95x on every prompt);
- per category: mean speedup vs `ar` of every method;
- which drafters `auto` ran, as shares of its steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from paradec import methods as registry
from paradec.bench.report import markdown_table


def per_prompt(records: list[dict]) -> dict[str, dict[str, dict]]:
    """method -> prompt id -> record."""
    by: dict[str, dict[str, dict]] = {}
    for r in records:
        by.setdefault(r["method"], {})[r["prompt_id"]] = r
    return by


def speedups(by: dict, method: str) -> dict[str, float]:
    """prompt id -> tokens/s of ``method`` over `ar`'s on that prompt."""
    ar = by["ar"]
    return {p: r["tokens_per_s"] / ar[p]["tokens_per_s"] for p, r in by[method].items() if p in ar}


def report(run: Path) -> str:
    result = json.loads((run / "results.json").read_text())
    by = per_prompt(result["records"])
    methods = [m for m in result["config"]["methods"] if m in by]
    rows = []
    for m in methods:
        s = speedups(by, m)
        taus = [r["tau"] for r in by[m].values() if r.get("tau") is not None]
        same = [r["identical_to_ar"] for r in by[m].values() if r.get("identical_to_ar") is not None]
        rows.append(
            {
                "method": m,
                "prompts": len(s),
                "tokens_per_s": round(statistics.mean(r["tokens_per_s"] for r in by[m].values()), 2),
                "vs_ar_median": round(statistics.median(s.values()), 3),
                "vs_ar_mean": round(statistics.mean(s.values()), 3),
                "vs_ar_worst": round(min(s.values()), 3),
                "tau": round(statistics.mean(taus), 3) if taus else None,
                "identical_to_ar": f"{sum(same)}/{len(same)}" if same else None,
            }
        )
    lines = [
        f"{run.name}: {result['machine'].get('cpu')}; formats {result.get('formats')}",
        "",
        markdown_table(rows, list(rows[0])),
    ]
    fixed = [r for r in rows if r["method"] in registry.names() and r["method"] not in ("ar", "auto")]
    if "auto" in by and fixed:
        best = max(fixed, key=lambda r: r["vs_ar_median"])["method"]
        auto, other = speedups(by, "auto"), speedups(by, best)
        ratio = [auto[p] / other[p] for p in auto if p in other]
        lines += [
            "",
            f"auto vs the best fixed method ({best}): median of per-prompt ratios {statistics.median(ratio):.3f}, "
            f"mean {statistics.mean(ratio):.3f}; auto vs ar on its worst prompt {min(auto.values()):.3f} "
            f"({sum(v >= 0.95 for v in auto.values())}/{len(auto)} prompts >= 0.95x)",
        ]
        steps: dict[str, int] = {}
        for r in by["auto"].values():
            for k, v in (r.get("drafters") or {}).items():
                steps[k] = steps.get(k, 0) + v
        total = sum(steps.values()) or 1
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]))
        lines.append(f"auto's steps by drafter: {shares}")
    cats = list(dict.fromkeys(r["category"] for r in result["records"]))
    grid = []
    for c in cats:
        row = {"category": c}
        for m in methods:
            s = [v for p, v in speedups(by, m).items() if by[m][p]["category"] == c]
            row[m] = round(statistics.mean(s), 3) if s else None
        grid.append(row)
    lines += ["", "mean speedup vs `ar` per category:", "", markdown_table(grid, ["category", *methods])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    for run in ap.parse_args().runs:
        text = report(run)
        (run / "auto.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()

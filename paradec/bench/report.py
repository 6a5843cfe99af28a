"""Markdown tables, atomic JSON and plots for benchmark results."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import torch


def machine() -> dict:
    from paradec.cpu import cpu_info

    cpu = cpu_info()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu.kind,
        "isa": list(cpu.isa),
    }


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(obj, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


def mean_rows(results: dict[str, list[tuple]], key: str, fields: list[str]) -> list[dict]:
    """One row per label: the mean of each tuple position over its runs, named by ``fields``."""
    return [
        {key: label, **{f: statistics.mean(float(v[i]) for v in vals) for i, f in enumerate(fields)}}
        for label, vals in results.items()
    ]


def bench_plots(result: dict, out_dir: Path) -> None:
    """speedup.png (speedup vs ar per category and method) and tau_step_time.png (tau and step
    time against verified nodes, per prompt) of a `paradec bench` result; none without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional: pip install paradec[bench]
        return
    summary = result["summary"]
    cats = sorted({r["category"] for r in summary})
    methods = list(dict.fromkeys(r["method"] for r in summary))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * len(methods) / 3), 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        vals = [
            next((r["speedup_vs_ar"] or 0 for r in summary if r["method"] == m and r["category"] == c), 0) for c in cats
        ]
        ax.bar([j + i * width for j in range(len(cats))], vals, width, label=m)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20)
    ax.set_ylabel("speedup vs ar (mean per-prompt ratio)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "speedup.png", dpi=110)
    plt.close(fig)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for m in methods:
        recs = [r for r in result["records"] if r["method"] == m and r.get("nodes_per_step") is not None]
        if recs:
            a1.scatter([r["nodes_per_step"] for r in recs], [r["tau"] for r in recs], label=m, s=14)
            a2.scatter([r["nodes_per_step"] for r in recs], [r["ms_per_step"] for r in recs], label=m, s=14)
    a1.set_xlabel("tree nodes verified per step")
    a1.set_ylabel("tau (tokens per target pass)")
    a2.set_xlabel("tree nodes verified per step")
    a2.set_ylabel("ms per step")
    a1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "tau_step_time.png", dpi=110)
    plt.close(fig)

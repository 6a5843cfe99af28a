"""Markdown tables and atomic JSON for benchmark results."""

from __future__ import annotations

import json
import os
import statistics
import platform
from pathlib import Path

import torch


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine()}


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
    return [{key: label, **{f: statistics.mean(float(v[i]) for v in vals) for i, f in enumerate(fields)}}
            for label, vals in results.items()]

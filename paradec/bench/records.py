"""What ``paradec bench`` keeps: one record per (prompt, method), the summary per method and
category (Spec-Bench speedups: the mean of per-prompt throughput ratios), the Markdown table, and
the checkpoint a long run resumes from."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from paradec.bench.peers import lossless, own_loop
from paradec.bench.prompts import Prompt
from paradec.bench.report import bench_plots, markdown_table, write_json
from paradec.errors import ParadecError

PARTIAL = "partial.json"  # an unfinished run's records, in its out dir


def resume_records(path: Path, config: dict) -> tuple[list[dict], int]:
    """(records, prompt groups done) of the unfinished run at ``path``; ([], 0) if there is none.
    An unfinished run of another configuration is refused rather than mixed in or overwritten."""
    if not path.exists():
        return [], 0
    try:
        state = json.loads(path.read_text())
        same = json.dumps(state["config"], sort_keys=True) == json.dumps(config, sort_keys=True)
        records, done = state["records"], int(state["groups_done"])
    except (ValueError, KeyError, TypeError):
        raise ParadecError(f"{path} is not a paradec bench checkpoint; delete it or pass another --out") from None
    if not same:
        raise ParadecError(
            f"{path} holds an unfinished bench of another configuration; rerun that command to "
            f"finish it, or delete the file or pass another --out"
        )
    return records, done


def portable(value):
    """A config value as results.json records it: paths under the working directory relative to
    it, installed files by name, so results carry no machine's paths."""
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if not isinstance(value, str) or not Path(value).is_absolute():
        return value
    path = Path(value)
    if path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd()))
    return path.name


def record(p: Prompt, method: str, wall: float, batch: int, tokens: list[int], stats, reference) -> dict:
    rec = {
        "prompt_id": p.id,
        "category": p.category,
        "method": method,
        "batch": batch,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "tokens_per_s": len(tokens) / wall,
        "identical_to_ar": None if reference is None or not lossless(method) else tokens == reference,
    }
    for key in ("degree_of_parallelism", "well_formed", "acceptance"):
        if stats is not None and stats.extra.get(key) is not None:
            rec[key] = float(stats.extra[key])
    if stats is not None and "groups" in stats.extra:  # ASPD: PPD = share of answers with a parallel group
        rec["ppd"] = float(stats.extra["groups"] > 0)
    if stats is not None and stats.extra.get("groups"):
        rec["branches_per_group"] = stats.extra["branches"] / stats.extra["groups"]
    if stats is not None and own_loop(method):  # no tree (ASPD): tau = marked tokens per pass
        rec.update(tau=stats.tau, steps=stats.steps, ms_per_step=1000 * wall / max(1, stats.steps))
    elif stats is not None:
        rec.update(
            tau=stats.tau,
            steps=stats.steps,
            accept_per_depth=stats.accept_per_depth,
            nodes_per_step=stats.nodes / max(1, stats.steps),
            verified_per_step=stats.verified / max(1, stats.steps),
            target_share=min(1.0, stats.target_s / wall),
            ms_per_step=1000 * wall / max(1, stats.steps),
        )
        if stats.drafters:  # auto: steps per drafter
            rec["drafters"] = dict(stats.drafters)
    return rec


def summarize(records: list[dict], methods: list[str]) -> list[dict]:
    """Per method and per category (plus 'all'): means and Spec-Bench speedups."""
    by = {(r["prompt_id"], r["method"]): r for r in records}
    cats = sorted({r["category"] for r in records})
    out = []
    for cat in ["all", *cats]:
        for m in methods:
            mine = [r for r in records if r["method"] == m and cat in ("all", r["category"])]
            if not mine:
                continue
            row = {
                "category": cat,
                "method": m,
                "prompts": len(mine),
                "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in mine),
            }
            for base in ("ar", "hf", *(["seq-twin"] if "seq-twin" in methods else [])):
                ratios = [
                    r["tokens_per_s"] / by[(r["prompt_id"], base)]["tokens_per_s"]
                    for r in mine
                    if (r["prompt_id"], base) in by
                ]
                row[f"speedup_vs_{base}"] = statistics.mean(ratios) if ratios else None
            for key in (
                "tau",
                "nodes_per_step",
                "verified_per_step",
                "target_share",
                "ms_per_step",
                "nll_twin",
                "nll_base",
                "parses",
                "ppd",
                "degree_of_parallelism",
                "branches_per_group",
                "well_formed",
                "acceptance",
                *_same_tokens_keys(mine),
            ):
                vals = [r[key] for r in mine if r.get(key) is not None]
                row[key] = statistics.mean(vals) if vals else None
            depth = [r["accept_per_depth"] for r in mine if r.get("accept_per_depth")]
            row["accept_per_depth"] = [
                statistics.mean(d[i] for d in depth if len(d) > i)
                for i in range(max((len(d) for d in depth), default=0))
            ]
            ident = [r["identical_to_ar"] for r in mine if r["identical_to_ar"] is not None]
            row["identical_to_ar"] = sum(ident) / len(ident) if ident else None
            out.append(row)
    return out


def _same_tokens_keys(records: list[dict]) -> list[str]:
    """``identical_to_X`` for the methods X a method must equal where that is not `ar`
    (``Method.same_tokens_as``: aspd+spec's aspd)."""
    return sorted({k for r in records for k in r if k.startswith("identical_to_") and k != "identical_to_ar"})


COLUMNS = [
    "category",
    "method",
    "prompts",
    "tokens_per_s",
    "speedup_vs_ar",
    "speedup_vs_hf",
    "tau",
    "nodes_per_step",
    "verified_per_step",
    "ms_per_step",
    "target_share",
    "identical_to_ar",
]


def write_outputs(result: dict, out_dir: str | Path) -> str:
    out_dir = Path(out_dir)
    rows = [r for r in result["summary"] if r["category"] == "all"]
    cats = [r for r in result["summary"] if r["category"] != "all"]
    columns = COLUMNS + [
        c
        for c in (
            "speedup_vs_seq-twin",
            "ppd",
            "degree_of_parallelism",
            "branches_per_group",
            "nll_base",
            "nll_twin",
            "well_formed",
            "acceptance",
            *_same_tokens_keys(rows),
            "parses",
        )
        if any(r.get(c) is not None for r in rows)
    ]
    table = markdown_table(rows, columns)
    if len({r["category"] for r in cats}) > 1:
        table += "\n\nPer category:\n\n" + markdown_table(cats, columns)
    write_json(result, out_dir / "results.json")
    (out_dir / "results.md").write_text(table + "\n")
    bench_plots(result, out_dir)
    (out_dir / PARTIAL).unlink(missing_ok=True)
    return table

"""What the A/B scripts share (``curve_ab.py``, ``prefill_ab.py``): their options, the zoo's
companions for the default model, and runs of (method, engine) pairs interleaved per prompt, the
order rotating prompt by prompt, so the machine's drift falls on every pair alike."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

from paradec import companions
from paradec.bench.prompts import Prompt, load_prompts
from paradec.bench.report import machine, markdown_table
from paradec.zoo import default_gguf


def ab_args(methods: str, per_category: int) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=per_category)
    ap.add_argument("--methods", default=methods)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args()


def default_model() -> tuple[Path, dict]:
    """The default GGUF and the companions the zoo trained for it (``load``'s keywords)."""
    model = default_gguf()
    return model, {c.name: c.zoo(model) for c in companions.loadable() if c.zoo is not None}


def interleaved(
    engines: dict, runs: list[tuple[str, str]], prompts: list[Prompt], max_new_tokens: int
) -> Iterator[dict[tuple[str, str], tuple[float, object]]]:
    """Per prompt (its first turn, through the chat template): {(method, engine): (tokens per
    second of the whole request, its ``Generation``)}, every pair once, after one warm-up each."""
    for m, e in runs:
        engines[e].generate(prompts[0].turns[0], max_new_tokens=8, method=m, ignore_eos=True)
    for i, p in enumerate(prompts):
        conv = [{"role": "user", "content": p.turns[0]}]
        out = {}
        for m, e in runs[i % len(runs) :] + runs[: i % len(runs)]:
            t = time.perf_counter()
            g = engines[e].generate(conv, max_new_tokens=max_new_tokens, method=m, ignore_eos=True)
            out[m, e] = (max_new_tokens / (time.perf_counter() - t), g)
        yield out


def prompts_of(args: argparse.Namespace) -> list[Prompt]:
    return load_prompts(args.prompts, per_category=args.per_category)


def write_results(out: Path, head: str, result: dict, rows: list[dict]) -> None:
    """OUT/results.json (``result``, the machine and ``rows``) and OUT/results.md (``head`` and
    the rows' table), and the same table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": machine(), **result, "rows": rows}, indent=1))
    table = markdown_table(rows, list(rows[0]))
    (out / "results.md").write_text(f"{head}\n\n{table}\n")
    print(head)
    print(table)

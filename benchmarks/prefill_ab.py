"""What the dense prompt path (``paradec.cpu.prefill``) is worth: the same methods on two engines
of one process, one whose prompts take the dense weights this CPU chose, one whose prompts take
the quantized kernels (what `load` did before). Per prompt, every (method, engine) run
interleaved, the order rotating. Reports the prompt's prefill time (time to first token), and
tokens per second of the whole request (prefill included, as `paradec bench` times it), as
medians of per-prompt ratios dense / kernel.

    python benchmarks/prefill_ab.py --per-category 2 --methods ar,pld,auto --out benchmarks/results/prefill_ab

Writes OUT/results.json and OUT/results.md. Each engine's `ar` is its own reference: the two
prefills round differently, so a near-tied prompt may start another answer ("same text" counts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import paradec
import paradec.engine as engine_mod
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table
from paradec.zoo import default_gguf, zoo_drafts, zoo_eagle, zoo_heads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--methods", default="ar,pld,auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = default_gguf()
    given = {"eagle": zoo_eagle(model), "heads": zoo_heads(model), "drafts": zoo_drafts(model)}
    dense = paradec.load(model, backend="torch", **given)
    chosen = engine_mod.prefill_path
    engine_mod.prefill_path = lambda *a: None  # the second engine: prompts through the kernels
    try:
        kernel = paradec.load(model, backend="torch", **given)
    finally:
        engine_mod.prefill_path = chosen
    engines = {"dense": dense, "kernel": kernel}
    methods = args.methods.split(",")
    runs = [(m, e) for m in methods for e in engines]
    by_cat: dict[str, list] = {}
    for p in load_prompts(args.prompts):
        by_cat.setdefault(p.category, []).append(p)
    prompts = [p for ps in by_cat.values() for p in ps[: args.per_category]]
    for m, e in runs:  # warm-up
        engines[e].generate(prompts[0].turns[0], max_new_tokens=8, method=m, ignore_eos=True)
    got: dict[tuple, list] = {r: [] for r in runs}  # (tokens/s, prefill s, token ids) per prompt
    for i, p in enumerate(prompts):
        conv = [{"role": "user", "content": p.turns[0]}]
        for m, e in runs[i % len(runs) :] + runs[: i % len(runs)]:
            t = time.perf_counter()
            g = engines[e].generate(conv, max_new_tokens=args.max_new_tokens, method=m, ignore_eos=True)
            got[m, e].append((args.max_new_tokens / (time.perf_counter() - t), g.stats.prefill_s, g.token_ids))
    lengths = [len(dense.encode([{"role": "user", "content": p.turns[0]}], chat=True)) for p in prompts]
    rows = []
    for m in methods:
        d, k = got[m, "dense"], got[m, "kernel"]
        rows.append(
            {
                "method": m,
                "prefill s, dense (median)": round(statistics.median(x[1] for x in d), 3),
                "prefill s, kernel (median)": round(statistics.median(x[1] for x in k), 3),
                "prefill kernel / dense (median)": round(statistics.median(b[1] / a[1] for a, b in zip(d, k)), 2),
                "tokens/s dense / kernel (median)": round(statistics.median(a[0] / b[0] for a, b in zip(d, k)), 3),
                "(mean)": round(statistics.mean(a[0] / b[0] for a, b in zip(d, k)), 3),
                "same text": f"{sum(a[2] == b[2] for a, b in zip(d, k))}/{len(prompts)}",
            }
        )
    for e in engines:  # each engine's methods against its own `ar`
        ar = [x[2] for x in got["ar", e]] if "ar" in methods else None
        for row, m in zip(rows, methods):
            if ar is not None:
                row[f"identical to ar ({e})"] = f"{sum(x[2] == y for x, y in zip(got[m, e], ar))}/{len(prompts)}"
    args.out.mkdir(parents=True, exist_ok=True)
    head = (
        f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens (median {statistics.median(lengths):g}); "
        f"format {dense.format.name}; dense prompt path: {dense.model.prefill_path}"
    )
    result = {"machine": machine(), "format": dense.format.name, "prefill": dense.model.prefill_path}
    result |= {"prompts": len(prompts), "prompt_tokens": lengths, "rows": rows}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "results.md").write_text(f"{head}\n\n{markdown_table(rows, list(rows[0]))}\n")
    print(head)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

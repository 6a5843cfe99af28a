"""What exact bf16 costs: every lossless method with the shape-invariant numerics (default) and
with the plain fp32 attention path, interleaved per prompt, on the default model's chat prompts.

    python benchmarks/exact_cost.py --prompts ../shared/data/spec_bench/question.jsonl \
        --per-category 1 --max-new-tokens 96 --out benchmarks/results/exact_cost

Writes OUT/results.json and prints a table: tokens/s per (method, numerics), the exact/fast
ratio (mean of per-prompt ratios), and identical_to_ar per numerics (`ar` of the same numerics).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table
from paradec.zoo import default_gguf, zoo_drafts, zoo_heads

METHODS = {
    "ar": {},
    "pld": {"method": "pld"},
    "specinfer": {"method": "specinfer", "expansion": (1, 1, 1, 1)},
    "specinfer+ngram": {"method": "specinfer", "expansion": (1, 1, 1, 1), "with_ngram": True},
    "medusa": {"method": "medusa"},
    "propd": {"method": "propd"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = default_gguf()
    drafts, heads = zoo_drafts(model), zoo_heads(model)
    engine = paradec.load(model, dtype="bf16", drafts=drafts[:1], heads=heads)
    prompts = load_prompts(args.prompts, args.limit, args.per_category)
    convs = [[{"role": "user", "content": p.text}] for p in prompts]
    opts = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    for exact in (True, False):  # warm-up
        engine.model.set_exact(exact)
        for m in METHODS.values():
            engine.generate(convs[0], max_new_tokens=8, **m)
    runs = [(m, exact) for m in METHODS for exact in (True, False)]
    records = []
    for i, (p, conv) in enumerate(zip(prompts, convs)):
        order = runs[i % len(runs) :] + runs[: i % len(runs)]
        got = {}
        for m, exact in order:
            engine.model.set_exact(exact)
            t = time.perf_counter()
            g = engine.generate(conv, **METHODS[m], **opts)
            got[(m, exact)] = (len(g.token_ids) / (time.perf_counter() - t), g.token_ids, g.stats.tau)
        for (m, exact), (tps, ids, tau) in got.items():
            records.append(
                {
                    "prompt_id": p.id,
                    "category": p.category,
                    "method": m,
                    "exact": exact,
                    "tokens_per_s": tps,
                    "tau": tau,
                    "identical_to_ar": ids == got[("ar", exact)][1],
                }
            )
        print(p.id, {f"{m}/{'exact' if e else 'fast'}": round(v[0], 1) for (m, e), v in got.items()}, flush=True)
    rows = []
    for m in METHODS:
        row = {"method": m}
        for exact, name in ((True, "exact"), (False, "fast")):
            mine = [r for r in records if r["method"] == m and r["exact"] == exact]
            row[f"tok/s {name}"] = statistics.mean(r["tokens_per_s"] for r in mine)
            row[f"identical {name}"] = f"{sum(r['identical_to_ar'] for r in mine)}/{len(mine)}"
        ex = {r["prompt_id"]: r["tokens_per_s"] for r in records if r["method"] == m and r["exact"]}
        fa = {r["prompt_id"]: r["tokens_per_s"] for r in records if r["method"] == m and not r["exact"]}
        row["exact/fast"] = statistics.mean(ex[k] / fa[k] for k in ex)
        rows.append(row)
    table = markdown_table(rows, list(rows[0]))
    (out_dir / "results.json").write_text(
        json.dumps({"config": vars(args), "machine": machine(), "records": records, "summary": rows}, indent=1)
    )
    (out_dir / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

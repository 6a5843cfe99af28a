"""Does the curve the policies start from matter? The same methods on two engines of one process:
one starting from the loaded model's own pass-cost curve (``paradec.cpu.whole``, the default),
one from the one-layer profile's estimate of it (what `load` used before). Per prompt, every
(method, engine) run interleaved, the order rotating; ratios to `ar` of the same prompt.

    python benchmarks/curve_ab.py --per-category 1 --methods pld,auto,eagle --out benchmarks/results/curve_ab

Writes OUT/results.json and OUT/results.md.
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
from paradec.zoo import default_gguf, zoo_drafts, zoo_eagle, zoo_heads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--methods", default="pld,auto,eagle")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = default_gguf()
    given = {"eagle": zoo_eagle(model), "heads": zoo_heads(model), "drafts": zoo_drafts(model)}
    whole = paradec.load(model, backend="torch", **given)
    layer = paradec.load(model, backend="torch", cost=whole.format.profile.costs[whole.format.name], **given)
    engines = {"whole": whole, "one-layer": layer}
    runs = [("ar", "whole")] + [(m, e) for m in args.methods.split(",") for e in engines]
    by_cat: dict[str, list] = {}
    for p in load_prompts(args.prompts):
        by_cat.setdefault(p.category, []).append(p)
    prompts = [p for ps in by_cat.values() for p in ps[: args.per_category]]
    for m, e in runs:  # warm-up
        engines[e].generate(prompts[0].turns[0], max_new_tokens=8, method=m, ignore_eos=True)
    ratios: dict[tuple, list[float]] = {r: [] for r in runs}
    same = dict.fromkeys(runs, 0)
    for i, p in enumerate(prompts):
        conv = [{"role": "user", "content": p.turns[0]}]
        out = {}
        for m, e in runs[i % len(runs) :] + runs[: i % len(runs)]:
            t = time.perf_counter()
            g = engines[e].generate(conv, max_new_tokens=args.max_new_tokens, method=m, ignore_eos=True)
            out[m, e] = (args.max_new_tokens / (time.perf_counter() - t), g.token_ids)
        for r, (tps, ids) in out.items():
            ratios[r].append(tps / out["ar", "whole"][0])
            same[r] += ids == out["ar", "whole"][1]
    rows = []
    for m in args.methods.split(","):
        new, old = ratios[m, "whole"], ratios[m, "one-layer"]
        rows.append(
            {
                "method": m,
                "vs_ar_whole_curve (median)": round(statistics.median(new), 3),
                "vs_ar_one_layer_curve (median)": round(statistics.median(old), 3),
                "whole / one-layer (median)": round(statistics.median(a / b for a, b in zip(new, old)), 3),
                "whole / one-layer (mean)": round(statistics.mean(a / b for a, b in zip(new, old)), 3),
                "identical to ar": f"{min(same[m, 'whole'], same[m, 'one-layer'])}/{len(prompts)}",
            }
        )
    curves = {name: [round(e.cost.relative(w), 2) for w in (2, 4, 8, 16)] for name, e in engines.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": machine(),
        "format": whole.format.name,
        "prompts": len(prompts),
        "curves": curves,
        "rows": rows,
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    head = f"{len(prompts)} prompts; format {whole.format.name}; 2/4/8/16 tokens in `ar` steps: {curves}"
    (args.out / "results.md").write_text(f"{head}\n\n{markdown_table(rows, list(rows[0]))}\n")
    print(head)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

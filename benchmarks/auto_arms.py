"""What `auto`'s model drafters cost or gain it: `ar`, `pld`, `auto` and `auto` with prompt lookup
as its only arm, interleaved prompt by prompt (the order rotates), on the default model with the
zoo's companions, batch 1.

    python benchmarks/auto_arms.py --prompts ../shared/data/spec_bench/question.jsonl --n 20 \
        --out benchmarks/results/auto_arms

Writes OUT/results.json (per prompt and method: seconds, new tokens, steps) and prints the median
of per-prompt speedups vs `ar` and tau per method.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import paradec
from paradec.cpu.info import cpu_info
from paradec.draft.auto import AutoDrafter
from paradec.draft.ngram import PLD_DRAFT, LookupOptions, NgramDrafter
from paradec.policy.auto import AutoStats
from paradec.zoo import default_gguf, zoo_drafts, zoo_eagle, zoo_heads

METHODS = ["ar", "pld", "auto", "auto-lookup-only"]


def lookup_only(engine, stats: AutoStats) -> AutoDrafter:
    """`auto` with prompt lookup (as `auto` configures it) and no model drafter."""
    gen = engine.config(method="auto")
    per_match, most = PLD_DRAFT[engine.quant]
    return AutoDrafter(
        {}, {}, NgramDrafter(gen.option(LookupOptions).max_ngram, most, 1, per_match=per_match), stats, gen.sampling
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True, help="Spec-Bench question.jsonl")
    parser.add_argument("--n", type=int, default=20, help="prompts, every 12th of the file")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model = default_gguf()
    drafts, heads = zoo_drafts(model), zoo_heads(model)
    engine = paradec.load(model, drafts=drafts, heads=heads, eagle=zoo_eagle(model))
    questions = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    prompts = [q["turns"][0] for q in questions[::12][: args.n]]
    stats = AutoStats(engine.cost)  # lookup-only keeps its statistics across prompts, as `auto` does
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for i, prompt in enumerate(prompts):
        for name in METHODS[i % 4 :] + METHODS[: i % 4]:
            method = "auto" if name == "auto-lookup-only" else name
            drafter = lookup_only(engine, stats) if name == "auto-lookup-only" else None
            t0 = time.perf_counter()
            g = engine.generate(
                [{"role": "user", "content": prompt}],
                chat=True,
                method=method,
                drafter=drafter,
                max_new_tokens=args.max_new_tokens,
            )
            runs[name].append(
                {
                    "prompt": i,
                    "seconds": time.perf_counter() - t0,
                    "new_tokens": g.stats.new_tokens,
                    "steps": g.stats.steps,
                }
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu_info().kind, "format": engine.format.name, "runs": runs}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(record["cpu"], record["format"])
    for name, rows in runs.items():
        speedups = [ar["seconds"] / r["seconds"] for ar, r in zip(runs["ar"], rows)]
        tau = sum(r["new_tokens"] for r in rows) / sum(r["steps"] for r in rows)
        print(f"{name:<18} vs ar (median of per-prompt ratios) {statistics.median(speedups):.3f}   tau {tau:.2f}")


if __name__ == "__main__":
    main()

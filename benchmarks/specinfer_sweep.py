"""SpecInfer: SSM pool size x expansion vector, against `ar` and `pld` (default model and its
zoo/smollm2 pool on Spec-Bench chat prompts, or --model zoo/target on HumanEval).

Per prompt, every configuration runs back to back after `ar`; speedup = mean over prompts of
(ar time / config time). bf16, greedy, batch 1, 128 new tokens, EOS ignored.

    python benchmarks/specinfer_sweep.py --prompts ../shared/data/spec_bench/question.jsonl --per-category 2 \
        --out benchmarks/results/smollm2_specinfer_sweep.json
    python benchmarks/specinfer_sweep.py --model zoo/target --prompts ../shared/data/humaneval/HumanEval.jsonl.gz \
        --limit 20 --out benchmarks/results/specinfer_sweep.json
"""

from __future__ import annotations

import argparse
import sys
import time

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table, mean_rows, write_json
from paradec.zoo import default_gguf, zoo_drafts

CONFIGS = [  # (label, number of SSMs, options)
    ("pld", 0, dict(method="pld")),
    ("1 SSM <1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("1 SSM <1,1,1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 1, 1, 1, 1))),
    ("1 SSM <1,1,3,1,1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 3, 1, 1, 1, 1, 1))),
    ("2 SSMs <1,1,1,1>", 2, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("2 SSMs <1,1,3,1,1,1,1,1>", 2, dict(method="specinfer", expansion=(1, 1, 3, 1, 1, 1, 1, 1))),
    ("3 SSMs <1,1,1,1>", 3, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("3 SSMs <1,1,3,1,1,1,1,1>", 3, dict(method="specinfer", expansion=(1, 1, 3, 1, 1, 1, 1, 1))),
    ("1 SSM <1,1,1,1> + ngram", 1, dict(method="specinfer", expansion=(1, 1, 1, 1), with_ngram=True)),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the default model (SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--per-category", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/results/smollm2_specinfer_sweep.json")
    args = ap.parse_args()
    model = args.model or default_gguf()
    prompts = load_prompts(args.prompts, args.limit, args.per_category)
    ssms = zoo_drafts(model)
    engines = {n: paradec.load(model, dtype="bf16", drafts=ssms[:n]) for n in range(len(ssms) + 1)}
    configs = [c for c in CONFIGS if c[1] <= len(ssms)]
    chat = engines[0].tokenizer.has_chat_template
    kw = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    engines[0].generate(prompts[0].text, max_new_tokens=8)  # warm-up
    res: dict[str, list] = {label: [] for label, _, _ in configs}
    for p in prompts:
        p = [{"role": "user", "content": p.text}] if chat and p.turns else p.text
        t = time.perf_counter()
        ref = engines[0].generate(p, **kw)
        t_ar = time.perf_counter() - t
        for label, n, opts in configs:
            t = time.perf_counter()
            g = engines[n].generate(p, **kw, **opts)
            dt = time.perf_counter() - t
            res[label].append((t_ar / dt, g.stats.tau, 1000 * dt / g.stats.steps, g.token_ids == ref.token_ids))
    rows = mean_rows(res, "config", ["speedup_vs_ar", "tau", "ms_per_step", "identical_to_ar"])
    table = markdown_table(rows, ["config", "tau", "ms_per_step", "speedup_vs_ar", "identical_to_ar"])
    print(table)
    write_json({"command": " ".join(sys.argv), "machine": machine(), "rows": rows, "table": table}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

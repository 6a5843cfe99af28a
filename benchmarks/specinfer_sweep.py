"""SpecInfer on the bundled zoo: SSM pool size x expansion vector, against `ar` and `pld`.

Per prompt, every configuration runs back to back after `ar`; speedup = mean over prompts of
(ar time / config time). bf16, greedy, batch 1, 128 new tokens, EOS ignored.

    python benchmarks/specinfer_sweep.py --limit 20 --out benchmarks/results/specinfer_sweep.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table, mean_rows, write_json
from paradec.zoo import bundled, bundled_drafts

CONFIGS = [  # (label, number of SSMs, options)
    ("pld", 0, dict(method="pld")),
    ("1 SSM <1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("1 SSM <1,1,1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 1, 1, 1, 1))),
    ("1 SSM <1,1,3,1,1,1,1,1>", 1, dict(method="specinfer", expansion=(1, 1, 3, 1, 1, 1, 1, 1))),
    ("2 SSMs <1,1,1,1>", 2, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("3 SSMs <1,1,1,1>", 3, dict(method="specinfer", expansion=(1, 1, 1, 1))),
    ("3 SSMs <1,1,3,1,1,1,1,1>", 3, dict(method="specinfer", expansion=(1, 1, 3, 1, 1, 1, 1, 1))),
    ("1 SSM <1,1,1,1> + ngram", 1, dict(method="specinfer", expansion=(1, 1, 1, 1), with_ngram=True)),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="benchmarks/results/specinfer_sweep.json")
    args = ap.parse_args()
    prompts = load_prompts(Path(args.data) / "humaneval/HumanEval.jsonl.gz", limit=args.limit)
    ssms = bundled_drafts()
    engines = {n: paradec.load(bundled("target"), dtype="bf16", drafts=ssms[:n]) for n in range(len(ssms) + 1)}
    kw = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    engines[0].generate(prompts[0].text, max_new_tokens=8)  # warm-up
    res: dict[str, list] = {label: [] for label, _, _ in CONFIGS}
    for p in prompts:
        t = time.perf_counter()
        ref = engines[0].generate(p.text, **kw)
        t_ar = time.perf_counter() - t
        for label, n, opts in CONFIGS:
            t = time.perf_counter()
            g = engines[n].generate(p.text, **kw, **opts)
            dt = time.perf_counter() - t
            res[label].append((t_ar / dt, g.stats.tau, 1000 * dt / g.stats.steps, g.token_ids == ref.token_ids))
    rows = mean_rows(res, "config", ["speedup_vs_ar", "tau", "ms_per_step", "identical_to_ar"])
    table = markdown_table(rows, ["config", "tau", "ms_per_step", "speedup_vs_ar", "identical_to_ar"])
    print(table)
    write_json({"command": " ".join(sys.argv), "machine": machine(), "rows": rows, "table": table}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

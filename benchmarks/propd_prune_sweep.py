"""ProPD's early pruning on the bundled zoo: the effect of k (keep a node iff its token is in its
parent's early top-k) on tau, verified tokens and step time, at a given batch size.

The zoo's early head reads layer 2 of 8 (m is fixed by the trained head; `paradec train heads
--early-layer M` trains another). Per prompt group, all settings run back to back after `ar`.

    python benchmarks/propd_prune_sweep.py --batch-size 8 --limit 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table, mean_rows, write_json
from paradec.zoo import bundled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--ks", default="1,2,4,8,16,64")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--heads", default=None, help="heads dir (default: zoo/heads, early head on layer 2)")
    ap.add_argument("--out", default="benchmarks/results/propd_prune_sweep.json")
    args = ap.parse_args()
    engine = paradec.load(bundled("target"), dtype="bf16", heads=args.heads or bundled("heads", "heads.json"))
    prompts = [p.text for p in load_prompts(Path(args.data) / "humaneval/HumanEval.jsonl.gz", limit=args.limit)]
    kw = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    configs = [("no pruning", dict(method="propd", prune=False))] + [
        (f"k={k}", dict(method="propd", prune_topk=int(k))) for k in args.ks.split(",")
    ]
    engine.generate(prompts[0], max_new_tokens=8)  # warm-up
    res: dict[str, list] = {label: [] for label, _ in configs}
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i : i + args.batch_size]
        t = time.perf_counter()
        engine.generate(batch, **kw)
        t_ar = time.perf_counter() - t
        for label, opts in configs:
            t = time.perf_counter()
            out = engine.generate(batch, **kw, **opts)
            dt = time.perf_counter() - t
            steps = max(g.stats.steps for g in out)
            res[label].append(
                (
                    t_ar / dt,
                    statistics.mean(g.stats.tau for g in out),
                    statistics.mean(g.stats.verified / g.stats.steps for g in out),
                    1000 * dt / steps,
                )
            )
    rows = mean_rows(res, "setting", ["speedup_vs_ar", "tau", "verified_per_step", "ms_per_step"])
    table = markdown_table(rows, ["setting", "tau", "verified_per_step", "ms_per_step", "speedup_vs_ar"])
    print(table)
    write_json(
        {
            "command": " ".join(sys.argv),
            "machine": machine(),
            "early_layer": engine.companions["heads"].early_layer,
            "rows": rows,
            "table": table,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

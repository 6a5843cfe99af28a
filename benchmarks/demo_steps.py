"""Where each demo method's step goes: its tokens/s against `ar`, tau, and a step split into the
target's pass and the rest (drafting, acceptance, commit), on the demo's prompts.

    python benchmarks/demo_steps.py --rounds 2 --out benchmarks/results/demo_steps

One engine with the zoo's companions, as `paradec demo` loads it; methods in the demo's lockstep
(one step of each in turn), each keeping a draft budget of its own over the prompts and rounds.
Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
from importlib.resources import files
from pathlib import Path

import paradec
from paradec import methods as registry
from paradec.bench.lockstep import lockstep
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table
from paradec.companions import loadable
from paradec.zoo import default_gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = default_gguf()
    shown = [m for m in registry.methods() if m.demo is not None and m.lossless and m.decode is None]
    wanted = set().union(*(m.loads for m in shown))
    given = {}
    for c in loadable():
        found = c.zoo(model) if c.zoo and c.name in wanted else None
        if found:
            given[c.name] = found[:1] if c.many else found
    engine = paradec.load(model, **given)
    convs = [[{"role": "user", "content": p.text}] for p in load_prompts(files("paradec") / "data" / "demo_chat.jsonl")]
    methods = {m.name: {"method": m.name, **m.demo} for m in shown if not m.missing(engine)}
    engine.generate(convs[0], max_new_tokens=4)  # warm-up
    sums = {name: dict.fromkeys(("wall_s", "target_s", "steps", "tokens", "verified"), 0.0) for name in methods}
    budgets = {name: engine.own_budget() for name in methods}  # as the demo keeps them: one per method
    for _ in range(args.rounds):
        for conv in convs:
            for name, out in lockstep(engine, engine.encode(conv), methods, args.max_new_tokens, budgets).items():
                s = out.stats
                for key, v in zip(sums[name], (s.wall_s - s.prefill_s, s.target_s, s.steps, s.new_tokens, s.verified)):
                    sums[name][key] += v
    ar = sums["ar"]["tokens"] / sums["ar"]["wall_s"]
    rows = []
    for name, t in sums.items():
        rows.append(
            {
                "method": name,
                "tokens_per_s": round(t["tokens"] / t["wall_s"], 1),
                "vs_ar": round(t["tokens"] / t["wall_s"] / ar, 3),
                "tau": round(t["tokens"] / t["steps"], 2),
                "ms_per_step": round(1000 * t["wall_s"] / t["steps"], 1),
                "pass_ms": round(1000 * t["target_s"] / t["steps"], 1),
                "other_ms": round(1000 * (t["wall_s"] - t["target_s"]) / t["steps"], 1),
                "verified_per_step": round(t["verified"] / t["steps"], 2),
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine(), "format": engine.format.name, "rounds": args.rounds, "rows": rows}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    table = markdown_table(rows, list(rows[0]))
    (args.out / "results.md").write_text(f"format {engine.format.name}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()

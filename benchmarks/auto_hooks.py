"""What a method's drafter costs in Python a step, without the model's passes: its hooks
(propose, commit, observe) fed `ar`'s own greedy answers, each step accepted as verification would
(the longest path of the tree that the answer follows) and observed with a made-up pass time.

    python benchmarks/auto_hooks.py --methods pld,auto --evict-mb 48 --out benchmarks/results/auto_hooks

``--evict-mb``: read that many MB between steps, as a target pass does (it streams the weights),
so that the hooks run with cold caches as they do between real passes (0: warm). Answers come
from the default model with its chat template (Spec-Bench, every fourth question of the first
160), decoded once and cached in OUT/answers.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import paradec
from paradec import methods as registry
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table
from paradec.companions import loadable
from paradec.state import StepReport
from paradec.zoo import default_gguf


def pass_s(width: int) -> float:
    """A made-up pass time (the int4 curve's shape on 2 cores): only ``auto``'s learning reads it."""
    return 5.0e-3 * {1: 1.0, 2: 1.12, 3: 1.24, 4: 1.3}.get(width, 1.3 + (width - 4) * 0.18)


def replay(engine, method: str, answers: list[tuple[list[int], list[int]]], evict: np.ndarray | None) -> dict:
    gen = engine.config(method=method, max_new_tokens=128)
    hidden = engine.model.config.hidden_size
    dtype = engine.model.embed.weight.dtype
    spent = {"propose": 0.0, "commit": 0.0, "observe": 0.0}
    steps = 0
    for prompt, answer in answers:
        d = registry.get(method).drafter(engine, gen)
        features = torch.zeros(1, len(prompt) - 1, hidden, dtype=dtype)  # [1, prompt - 1, hidden]: EAGLE's start
        d.begin([list(prompt)], len(prompt) + len(answer) + d.max_nodes + 1, features)
        seq, pos = list(prompt), 0
        while pos < len(answer):
            if evict is not None:
                evict.sum()
            t0 = time.perf_counter()
            tree = d.propose([seq], [None])[0].tree
            t1 = time.perf_counter()
            kids, node, accepted = tree.children(), 0, []
            while pos + len(accepted) + 1 < len(answer):
                nxt = next((c for c in kids[node] if tree.tokens[c] == answer[pos + len(accepted)]), None)
                if nxt is None:
                    break
                accepted.append(tree.tokens[nxt])
                node = nxt
            bonus = answer[pos + len(accepted)]
            t2 = time.perf_counter()
            d.commit(0, accepted, bonus, torch.zeros(len(accepted) + 1, hidden, dtype=dtype))
            t3 = time.perf_counter()
            w = len(tree)
            d.observe(StepReport(1, w, w, pass_s(w) + t3 - t0, False, (), w, t1 - t0, len(accepted) + 1, pass_s(w)))
            t4 = time.perf_counter()
            spent["propose"] += t1 - t0
            spent["commit"] += t3 - t2
            spent["observe"] += t4 - t3
            seq += [*accepted, bonus]
            pos += len(accepted) + 1
            steps += 1
    us = {k: round(v / steps * 1e6, 1) for k, v in spent.items()}
    total = round(sum(us.values()), 1)
    return {"method": method, "steps": steps, **{f"{k}_us": v for k, v in us.items()}, "total_us": total}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="pld,auto")
    ap.add_argument("--evict-mb", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="each method's replay, interleaved")
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = default_gguf()
    shown = [m for m in registry.methods() if m.demo is not None and m.lossless and m.decode is None]
    wanted = set().union(*(m.loads for m in shown))
    shipped = {c: c.zoo(model) if c.zoo else None for c in loadable() if c.name in wanted}
    engine = paradec.load(model, **{c.name: (v[:1] if c.many else v) for c, v in shipped.items() if v})
    cached = out / "answers.json"
    if cached.exists():
        answers = [tuple(a) for a in json.loads(cached.read_text())]
    else:
        answers = []
        for p in load_prompts(args.prompts)[:160:4]:
            ids = engine.encode([{"role": "user", "content": p.text}], True)
            answers.append((ids, engine.generate(ids, max_new_tokens=128, ignore_eos=True, method="ar").token_ids))
        cached.write_text(json.dumps(answers))
    evict = np.ones(args.evict_mb * 2**20 // 8) if args.evict_mb else None
    rows = [replay(engine, m, answers, evict) for _ in range(args.rounds) for m in args.methods.split(",")]
    result = {"machine": machine(), "evict_mb": args.evict_mb, "rows": rows}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

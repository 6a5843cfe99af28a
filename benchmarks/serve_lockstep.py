"""Server-like continuous batching in one process, every method on its own scheduler (and draft
budget), stepped in lockstep (one step of each in turn, the order rotating), so the machine's drift
falls on every method alike. Each method keeps ``--clients`` single-row requests live (a request is
its own group, as in ``paradec serve``), refilled from the prompt queue as requests finish; a
method's time is its own admissions and steps. No HTTP, no client threads: what it compares is the
decode loop the server runs, not the server's overhead (``paradec bench-serve`` measures that).

    python benchmarks/serve_lockstep.py --clients 4 --methods ar,auto,pld,eagle \
        --out benchmarks/results/serve_lockstep_c4

Writes OUT/results.json and OUT/results.md: tokens per second and the ratio to the first method.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from ab import default_model, write_results

import paradec
from paradec import methods as registry
from paradec.bench.prompts import load_prompts
from paradec.scheduler import Scheduler
from paradec.serve.worker import TREE_SCRATCH


class Lane:
    """One method's requests: a queue of prompts, ``clients`` of them live at a time."""

    def __init__(self, engine, method: str, prompts: list[list[int]], clients: int, tokens: int) -> None:
        self.engine, self.method, self.queue, self.clients = engine, method, list(prompts), clients
        longest = max(len(p) for p in prompts) + tokens + 1 + TREE_SCRATCH
        budget = engine.own_budget()  # as on a server of its own
        self.sched = Scheduler(engine, clients, longest, engine.tokenizer.eos_ids, budget, interleave_prefill=True)
        self.gen = engine.config(method=method, max_new_tokens=tokens, ignore_eos=True)
        registry.get(method).drafter(engine, self.gen)  # its one-time set-up, done before a server's first request
        self.seconds, self.tokens, self.steps, self.drafters = 0.0, 0, 0, Counter()

    @property
    def done(self) -> bool:
        return not self.queue and not self.sched.groups

    def tick(self) -> None:
        """Admit requests while a client is free, then one step of every live request."""
        t = time.perf_counter()
        while self.queue and len(self.sched.groups) < self.clients:
            rows = self.engine.new_rows([self.queue.pop(0)], self.gen)
            self.sched.admit(rows, self.gen, registry.get(self.method).drafter(self.engine, self.gen))
        live = list(self.sched.groups)
        self.tokens += sum(len(event.token_ids) for _, event in self.sched.step())
        self.seconds += time.perf_counter() - t
        self.steps += 1
        for g in live:
            if g.done:
                self.drafters.update(g.rows[0].stats.drafters or {})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--methods", default="ar,auto,pld")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16, help="the format is chosen for this many rows, as serve does")
    ap.add_argument("--passes", type=int, default=1, help="the prompt list this many times over")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model, given = default_model()
    engine = paradec.load(model, backend="torch", batch=args.max_batch, **given)
    prompts = load_prompts(args.prompts, per_category=args.per_category)
    ids = [engine.tokenizer.encode_messages([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    lanes = [Lane(engine, m, ids * args.passes, args.clients, args.max_tokens) for m in args.methods.split(",")]
    turn = 0
    while not all(lane.done for lane in lanes):
        for lane in lanes[turn % len(lanes) :] + lanes[: turn % len(lanes)]:
            if not lane.done:
                lane.tick()
        turn += 1
    base = lanes[0].tokens / lanes[0].seconds
    rows = [
        {
            "method": lane.method,
            "tokens/s": round(lane.tokens / lane.seconds, 1),
            f"vs {lanes[0].method}": round(lane.tokens / lane.seconds / base, 3),
            "steps": lane.steps,
            "drafters (row-steps)": dict(lane.drafters),
        }
        for lane in lanes
    ]
    head = (
        f"{len(ids) * args.passes} requests of {args.max_tokens} tokens, {args.clients} clients, "
        f"format {engine.format.name} (chosen for {args.max_batch} rows)"
    )
    write_results(args.out, head, {"format": engine.format.name, "clients": args.clients}, rows)


if __name__ == "__main__":
    main()

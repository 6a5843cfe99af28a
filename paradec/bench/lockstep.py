"""Methods decoded side by side, one step of each in turn: how `paradec demo` and
``paradec bench --lockstep`` time the methods of one engine, so that the machine's drift (its
speed moves by up to 2x within a minute on a shared 2-core VM) falls on every method alike.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from paradec import methods as registry
from paradec.scheduler import Scheduler


def lockstep(
    engine, ids: list[int], methods: dict[str, dict], max_new_tokens: int, budgets: dict | None = None
) -> dict[str, SimpleNamespace]:
    """Every method (name -> ``generate`` options) on one prompt (token ids), each on a scheduler and a
    draft budget of its own (``budgets``: name -> the one it keeps; default a new one), stepped in
    turn (one step of each, the order rotating), so the machine's drift (its speed moves by up to
    2x within a minute) falls on every method alike; a method's time is its own prefill and steps.
    -> name -> (token_ids, stats) with ``stats.wall_s`` that time. Run one after another, a
    1.3-second answer per method had put a method 10-28 % below `ar` on a prompt where,
    interleaved five times, every method was within 3 % of it."""
    lanes = []
    for name, options in methods.items():
        gen = engine.config(**{"method": "ar", **options}, max_new_tokens=max_new_tokens)
        drafter = registry.get(gen.method).drafter(engine, gen)
        rows = engine.new_rows([ids], gen)
        need = len(ids) + rows[0].budget + 1 + drafter.max_nodes
        budget = budgets[name] if budgets is not None else engine.own_budget()
        sched = Scheduler(engine, 1, need, engine.tokenizer.eos_ids, budget)
        t = time.perf_counter()
        sched.admit(rows, gen, drafter)
        lanes.append((name, sched, rows[0], [time.perf_counter() - t]))
    turn = 0
    while any(sched.groups for _, sched, _, _ in lanes):
        for _, sched, _, seconds in lanes[turn % len(lanes) :] + lanes[: turn % len(lanes)]:
            if sched.groups:
                t = time.perf_counter()
                for _ in sched.step():
                    pass
                seconds[0] += time.perf_counter() - t
        turn += 1
    for _, _, row, seconds in lanes:  # its own time, not the time since it began (the others' steps too)
        row.stats.wall_s = seconds[0]
    return {name: SimpleNamespace(token_ids=row.new_ids, stats=row.stats) for name, _, row, _ in lanes}

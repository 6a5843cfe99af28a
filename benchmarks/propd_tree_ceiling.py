"""How much can choosing the tree gain over a static Medusa tree, with these heads on this machine?

1. Step cost: tokens/s of `medusa` with static trees of n nodes (n = 0 is `ar` plus the heads),
   measured on real decoding (sizes interleaved per prompt) -> ms per step T(n).
2. What the heads propose at every position of the target's greedy outputs (one causal pass
   over prompt + output), and what the target wrote there.
3. Replay (second half of the positions; the first half fits the calibration): tokens per second
   = sum(1 + accepted) / sum T(n_step) for
   - static: the top-n rank paths by the measured rank acceptance (Medusa; `medusa` uses n = 16);
   - adaptive: each step the top-n paths by this step's head probabilities, calibrated per depth
     on the first half (``paradec.policy.Calibration``, as ``--step-scores`` does online), n chosen to maximize (1
     + expected accepted) / T(n) — the best a
     per-step tree policy with these heads can expect to do;
   - oracle: a chain of exactly the tokens the target will accept (unreachable; an upper bound).

    python benchmarks/propd_tree_ceiling.py --limit 40 --out benchmarks/results/propd_tree_ceiling.json
"""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from pathlib import Path

import torch

import paradec
from paradec.bench.prompts import load_prompts
from paradec.bench.report import machine, markdown_table, write_json
from paradec.policy import Calibration
from paradec.tree.builders import top_paths_scored
from paradec.zoo import bundled

SIZES = (0, 1, 2, 4, 8, 16, 32, 63)
RANKS = 8


def step_costs(engine, prompts: list[str], max_new_tokens: int) -> dict[int, float]:
    """ms per decoding step of `medusa` with a static tree of n nodes, sizes interleaved."""
    wall = {n: 0.0 for n in SIZES}
    steps = {n: 0 for n in SIZES}
    engine.generate(prompts[0], method="medusa", max_new_tokens=16)  # warm-up
    for i, prompt in enumerate(prompts):
        for n in SIZES[i % len(SIZES) :] + SIZES[: i % len(SIZES)]:
            g = engine.generate(prompt, method="medusa", tree_nodes=n, max_new_tokens=max_new_tokens, ignore_eos=True)
            wall[n] += g.stats.wall_s - g.stats.prefill_s
            steps[n] += g.stats.steps
    return {n: 1000 * wall[n] / steps[n] for n in SIZES}


def positions(engine, prompts: list[str], max_new_tokens: int):
    """-> per decoding position: (head top-R probs [heads][R], head top-R ids [heads][R], the
    target's next tokens after the root [heads])."""
    model, heads = engine.model, engine.companions["heads"]
    depth = len(heads.medusa.blocks)
    out = []
    for prompt in prompts:
        g = engine.generate(prompt, max_new_tokens=max_new_tokens, ignore_eos=True)
        ids = engine.tokenizer.encode(prompt) + g.token_ids
        x = torch.tensor([ids])
        with torch.inference_mode():
            hn = model.norm(model.hidden(x, torch.arange(len(ids))[None], None, None))[0]  # [seq, hidden]
            probs = heads.medusa(hn, model.lm_head).float().softmax(-1).topk(RANKS, dim=-1)  # [seq, heads, R]
        first = len(ids) - len(g.token_ids) - 1  # the hidden state before the first new token
        for i in range(first, len(ids) - 2 - depth):
            # hidden at i -> root x[i+1] (the bonus); head d guesses x[i+2+d]
            out.append((probs.values[i].tolist(), probs.indices[i].tolist(), ids[i + 2 : i + 2 + depth]))
    return out


def accepted(paths, guesses, truth) -> int:
    best = 0
    for path in paths:
        if all(guesses[d][r] == truth[d] for d, r in enumerate(path)):
            best = max(best, len(path))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=40, help="HumanEval prompts")
    ap.add_argument("--cost-prompts", type=int, default=8, help="prompts timed per tree size")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="benchmarks/results/propd_tree_ceiling.json")
    args = ap.parse_args()
    source = Path(args.data) / "humaneval/HumanEval.jsonl.gz"
    if not source.is_file():
        sys.exit(f"error: {source} does not exist; pass --data DIR holding humaneval/HumanEval.jsonl.gz")
    engine = paradec.load(bundled("target"), dtype="bf16", heads=bundled("heads", "heads.json"))
    prompts = [p.text for p in load_prompts(source, limit=args.limit)]
    t0 = time.perf_counter()
    cost = step_costs(engine, prompts[: args.cost_prompts], args.max_new_tokens)
    data = positions(engine, prompts, args.max_new_tokens)
    fit, test = data[: len(data) // 2], data[len(data) // 2 :]
    depth = len(fit[0][2])

    # rank acceptance (static trees) and the policy's own calibration of head probabilities, on `fit`
    hits = [[0] * RANKS for _ in range(depth)]
    calib = Calibration(depth, decay=1.0)
    for p, guesses, truth in fit:
        for d in range(depth):
            row_hits = [guesses[d][r] == truth[d] for r in range(RANKS)]
            calib.observe(d, p[d], row_hits)
            for r in range(RANKS):
                hits[d][r] += row_hits[r]
    rank_prob = [[h / len(fit) for h in row] for row in hits]

    def replay(choose) -> tuple[float, float, float]:
        tokens = ms = nodes = 0.0
        for p, guesses, truth in test:
            paths = choose(p, guesses, truth)
            tokens += 1 + accepted(paths, guesses, truth)
            ms += cost_of(len(paths))
            nodes += 1 + len(paths)
        return 1000 * tokens / ms, tokens / len(test), nodes / len(test)

    def cost_of(n: int) -> float:  # linear between measured sizes
        k = bisect.bisect_left(SIZES, n)
        if SIZES[k] == n:
            return cost[n]
        lo, hi = SIZES[k - 1], SIZES[k]
        return cost[lo] + (cost[hi] - cost[lo]) * (n - lo) / (hi - lo)

    rows = []
    static_order = [path for path, _ in top_paths_scored(rank_prob, max(SIZES))]
    for n in SIZES:
        rate, tau, nodes = replay(lambda p, g, t, n=n: static_order[:n])
        rows.append({"policy": f"static {n}", "tokens_per_s": rate, "tau": tau, "nodes_per_step": nodes})

    def adaptive(p, guesses, truth):
        order = top_paths_scored(calib.scores(p), max(SIZES))
        best, best_rate, gain = 0, 0.0, [0.0]
        for _, score in order:
            gain.append(gain[-1] + score)
        for n in SIZES:
            rate = (1 + gain[min(n, len(order))]) / cost_of(n)
            if rate > best_rate:
                best, best_rate = n, rate
        return [path for path, _ in order[:best]]

    def oracle(p, guesses, truth):
        chain = []
        for d in range(depth):
            if truth[d] not in guesses[d]:
                break
            chain.append(guesses[d].index(truth[d]))
        return [tuple(chain[: k + 1]) for k in range(len(chain))]

    for label, fn in (("adaptive (calibrated head probabilities)", adaptive), ("oracle chain", oracle)):
        rate, tau, nodes = replay(fn)
        rows.append({"policy": label, "tokens_per_s": rate, "tau": tau, "nodes_per_step": nodes})
    ref = next(r["tokens_per_s"] for r in rows if r["policy"] == "static 16")
    best_static = max(r["tokens_per_s"] for r in rows if r["policy"].startswith("static"))
    for r in rows:
        r["vs_static_16"] = r["tokens_per_s"] / ref
        r["vs_best_static"] = r["tokens_per_s"] / best_static
    table = markdown_table(rows, ["policy", "tau", "nodes_per_step", "tokens_per_s", "vs_static_16", "vs_best_static"])
    costs = markdown_table([{"nodes": n, "ms_per_step": cost[n]} for n in SIZES], ["nodes", "ms_per_step"])
    print(costs + "\n\n" + table)
    write_json(
        {
            "command": " ".join(sys.argv),
            "machine": machine(),
            "positions": len(data),
            "ms_per_step": cost,
            "calibration": calib.table(),
            "rank_prob": rank_prob,
            "rows": rows,
            "seconds": time.perf_counter() - t0,
            "table": table,
            "costs": costs,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

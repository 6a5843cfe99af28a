"""What speculation can give a server at most: passes of ``b`` rows x ``W``-token chains, timed
through the scheduler's own verification pass (``verify_forward``, the decode plan) after a
context per row like a server's (prompt and answer so far), in the format ``serve --max-batch 16``
chooses. With drafts that cost nothing and whose first k tokens are accepted with chance a^k,
a step of width W commits (1 - a^W) / (1 - a) tokens a row; the ceiling at b rows is the best W's
tokens per second over `ar`'s (W = 1). a = 1 is perfect drafts.

    python benchmarks/serve_ceiling.py --out benchmarks/results/serve_ceiling

Writes OUT/results.json and OUT/results.md: ms per pass by (rows, width), and the ceilings.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from ab import write_results

import paradec
from paradec.passes import verify_forward
from paradec.tree.tree import TokenTree
from paradec.zoo import default_gguf

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
ACCEPT = (0.5, 0.7, 0.9, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--context", type=int, default=300, help="tokens in each row's cache before the pass")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3, help="passes per (rows, width) per round")
    ap.add_argument("--max-batch", type=int, default=16, help="the format is chosen for this many rows, as serve does")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    engine = paradec.load(default_gguf(), batch=args.max_batch)
    model, batches = engine.model, [int(b) for b in args.rows.split(",")]
    caches = {}
    with torch.inference_mode():
        for b in batches:  # every row holds the same context: the pass's cost does not depend on its tokens
            cache = caches[b] = model.new_cache(b, args.context + max(WIDTHS) + 1)
            ids = torch.randint(0, 1000, (b, args.context))
            model.hidden(ids, torch.arange(args.context).expand(b, -1), None, cache, prefill=True)
            for r in range(b):
                cache.advance(r, args.context)
        ms: dict[tuple[int, int], list[float]] = {(b, w): [] for b in batches for w in WIDTHS}
        for _ in range(args.rounds):  # interleaved, so the machine's drift falls on every shape alike
            for b in batches:
                for w in WIDTHS:
                    trees = [TokenTree.chain(1, list(range(2, w + 1))) for _ in range(b)]
                    verify_forward(model, trees, caches[b])  # warm
                    t = time.perf_counter()
                    for _ in range(args.passes):
                        for r in range(b):
                            caches[b].drop_scratch(r)
                        verify_forward(model, trees, caches[b])
                    ms[b, w].append((time.perf_counter() - t) / args.passes * 1000)
                    for r in range(b):
                        caches[b].drop_scratch(r)
    median = {k: statistics.median(v) for k, v in ms.items()}
    rows = []
    for b in batches:
        row = {"rows": b, **{f"w={w}": round(median[b, w] / median[b, 1], 2) for w in WIDTHS}}
        for a in ACCEPT:
            gains = {w: (w if a == 1 else (1 - a**w) / (1 - a)) * median[b, 1] / median[b, w] for w in WIDTHS}
            best = max(gains, key=gains.get)
            row[f"a={a}"] = f"{gains[best]:.2f} (W={best})"
        rows.append(row)
    head = (
        f"passes of rows x W-token chains after {args.context} tokens a row, format {engine.format.name}: "
        f"cost in `ar` steps of the same rows ({', '.join(f'{b} rows {median[b, 1]:.1f} ms' for b in batches)}); "
        "ceiling = the best W's tokens/s over `ar`'s with free drafts accepted a token at a time with chance a"
    )
    raw = {f"{b}x{w}": v for (b, w), v in ms.items()}
    write_results(args.out, head, {"format": engine.format.name, "context": args.context, "raw_ms": raw}, rows)


if __name__ == "__main__":
    main()

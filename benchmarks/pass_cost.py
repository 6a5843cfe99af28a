"""What one target pass costs, by verified width and weight format, on the default model.

    python benchmarks/pass_cost.py --out benchmarks/results/pass_cost

A pass of width w verifies a w-token chain after a 200-token context (the shape of a speculative
step; w = 1 is an `ar` step): layers, final norm and LM head, with the default exact numerics.
Formats are interleaved round by round; the table gives the median ms per pass and its ratio to
the same format's w = 1 pass. Writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import paradec
from paradec.bench.report import machine, markdown_table
from paradec.zoo import default_gguf

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
CONTEXT = 200


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quants", default="none,int8,int4")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=5, help="passes per (format, width) per round")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = {q: paradec.load(default_gguf(), quant=q).model for q in args.quants.split(",")}
    times: dict[tuple[str, int], list[float]] = {(q, w): [] for q in models for w in WIDTHS}
    with torch.inference_mode():
        caches = {}
        prompt = torch.randint(0, 1000, (1, CONTEXT))
        for q, m in models.items():
            caches[q] = m.new_cache(1, CONTEXT + max(WIDTHS) + 1)
            m.hidden(prompt, torch.arange(CONTEXT)[None], None, caches[q])
            caches[q].advance(0, CONTEXT)
        for _ in range(args.rounds):
            for w in WIDTHS:
                tokens = torch.randint(0, 1000, (1, w))
                pos = torch.arange(CONTEXT, CONTEXT + w)[None]
                mask = torch.ones(w, CONTEXT + w, dtype=torch.bool)
                mask[:, CONTEXT:] = torch.ones(w, w, dtype=torch.bool).tril()
                mask = None if w == 1 else mask[None, None]
                for q, m in models.items():
                    m.normed_logits(m.hidden(tokens, pos, mask, caches[q]))  # warm
                    t = time.perf_counter()
                    for _ in range(args.passes):
                        m.normed_logits(m.hidden(tokens, pos, mask, caches[q]))
                    times[(q, w)].append((time.perf_counter() - t) / args.passes * 1000)
    rows = []
    for q in models:
        base = statistics.median(times[(q, 1)])
        for w in WIDTHS:
            ms = statistics.median(times[(q, w)])
            rows.append({"quant": q, "width": w, "ms_per_pass": round(ms, 2), "vs_width_1": round(ms / base, 2)})
    (out_dir / "results.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "context": CONTEXT,
                "rows": rows,
                "raw_ms": {f"{q}/{w}": v for (q, w), v in times.items()},
            },
            indent=1,
        )
    )
    print(markdown_table(rows, ["quant", "width", "ms_per_pass", "vs_width_1"]))


if __name__ == "__main__":
    main()

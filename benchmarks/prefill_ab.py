"""What the dense prompt path (``paradec.cpu.prefill``) is worth: the same methods on two engines
of one process, one whose prompts take the dense weights this CPU chose, one whose prompts take
the quantized kernels (what `load` did before). Per prompt, every (method, engine) run
interleaved, the order rotating. Reports the prompt's prefill time (time to first token), and
tokens per second of the whole request (prefill included, as `paradec bench` times it), as
medians of per-prompt ratios dense / kernel.

    python benchmarks/prefill_ab.py --per-category 2 --methods ar,pld,auto --out benchmarks/results/prefill_ab

Writes OUT/results.json and OUT/results.md. Each engine's `ar` is its own reference: the two
prefills round differently, so a near-tied prompt may start another answer ("same text" counts).
"""

from __future__ import annotations

import statistics

from ab import ab_args, default_model, interleaved, prompts_of, write_results

import paradec


def main() -> None:
    args = ab_args("ar,pld,auto", per_category=2)
    model, given = default_model()
    dense = paradec.load(model, backend="torch", **given)
    kernel = paradec.load(model, backend="torch", prefill="kernel", **given)  # prompts through the kernels
    engines = {"dense": dense, "kernel": kernel}
    methods = args.methods.split(",")
    runs = [(m, e) for m in methods for e in engines]
    prompts = prompts_of(args)
    got: dict[tuple, list] = {r: [] for r in runs}  # (tokens/s, prefill s, token ids) per prompt
    for out in interleaved(engines, runs, prompts, args.max_new_tokens):
        for r, (tps, g) in out.items():
            got[r].append((tps, g.stats.prefill_s, g.token_ids))
    lengths = [len(dense.encode([{"role": "user", "content": p.turns[0]}], chat=True)) for p in prompts]
    rows = []
    for m in methods:
        d, k = got[m, "dense"], got[m, "kernel"]
        rows.append(
            {
                "method": m,
                "prefill s, dense (median)": round(statistics.median(x[1] for x in d), 3),
                "prefill s, kernel (median)": round(statistics.median(x[1] for x in k), 3),
                "prefill kernel / dense (median)": round(statistics.median(b[1] / a[1] for a, b in zip(d, k)), 2),
                "tokens/s dense / kernel (median)": round(statistics.median(a[0] / b[0] for a, b in zip(d, k)), 3),
                "(mean)": round(statistics.mean(a[0] / b[0] for a, b in zip(d, k)), 3),
                "same text": f"{sum(a[2] == b[2] for a, b in zip(d, k))}/{len(prompts)}",
            }
        )
    for e in engines:  # each engine's methods against its own `ar`
        ar = [x[2] for x in got["ar", e]] if "ar" in methods else None
        for row, m in zip(rows, methods):
            if ar is not None:
                row[f"identical to ar ({e})"] = f"{sum(x[2] == y for x, y in zip(got[m, e], ar))}/{len(prompts)}"
    head = (
        f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens (median {statistics.median(lengths):g}); "
        f"format {dense.format.name}; dense prompt path: {dense.model.prefill_path}"
    )
    result = {"format": dense.format.name, "prefill": dense.model.prefill_path}
    write_results(args.out, head, result | {"prompts": len(prompts), "prompt_tokens": lengths}, rows)


if __name__ == "__main__":
    main()

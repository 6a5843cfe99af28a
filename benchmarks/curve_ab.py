"""Does the curve the policies start from matter? The same methods on two engines of one process:
one starting from the loaded model's own pass-cost curve (``paradec.cpu.whole``, the default),
one from the one-layer profile's estimate of it (what `load` used before). Per prompt, every
(method, engine) run interleaved, the order rotating; ratios to `ar` of the same prompt.

    python benchmarks/curve_ab.py --per-category 1 --methods pld,auto,eagle --out benchmarks/results/curve_ab

Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import statistics

from ab import ab_args, default_model, interleaved, prompts_of, write_results

import paradec


def main() -> None:
    args = ab_args("pld,auto,eagle", per_category=1)
    model, given = default_model()
    whole = paradec.load(model, backend="torch", **given)
    layer = paradec.load(model, backend="torch", cost=whole.format.profile.costs[whole.format.name], **given)
    engines = {"whole": whole, "one-layer": layer}
    runs = [("ar", "whole")] + [(m, e) for m in args.methods.split(",") for e in engines]
    prompts = prompts_of(args)
    ratios: dict[tuple, list[float]] = {r: [] for r in runs}
    same = dict.fromkeys(runs, 0)
    for out in interleaved(engines, runs, prompts, args.max_new_tokens):
        for r, (tps, g) in out.items():
            ratios[r].append(tps / out["ar", "whole"][0])
            same[r] += g.token_ids == out["ar", "whole"][1].token_ids
    rows = []
    for m in args.methods.split(","):
        new, old = ratios[m, "whole"], ratios[m, "one-layer"]
        rows.append(
            {
                "method": m,
                "vs_ar_whole_curve (median)": round(statistics.median(new), 3),
                "vs_ar_one_layer_curve (median)": round(statistics.median(old), 3),
                "whole / one-layer (median)": round(statistics.median(a / b for a, b in zip(new, old)), 3),
                "whole / one-layer (mean)": round(statistics.mean(a / b for a, b in zip(new, old)), 3),
                "identical to ar": f"{min(same[m, 'whole'], same[m, 'one-layer'])}/{len(prompts)}",
            }
        )
    curves = {name: [round(e.cost.relative(w), 2) for w in (2, 4, 8, 16)] for name, e in engines.items()}
    head = f"{len(prompts)} prompts; format {whole.format.name}; 2/4/8/16 tokens in `ar` steps: {curves}"
    write_results(args.out, head, {"format": whole.format.name, "prompts": len(prompts), "curves": curves}, rows)


if __name__ == "__main__":
    main()

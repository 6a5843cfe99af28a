"""What the C small ops (``paradec.models.native``) are worth end to end: the same methods on two
torch engines of one process, one whose decode passes run their small ops in C, one on torch's
ops (``set_native(False)``, what `load` did before). Per prompt, every (method, engine) run
interleaved, the order rotating; tokens per second of the whole request (prefill included, as
`paradec bench` times it), as medians of per-prompt ratios C / torch.

    python benchmarks/native_ab.py --per-category 1 --methods ar,pld,auto,eagle --out benchmarks/results/native_ab

Writes OUT/results.json and OUT/results.md. Each engine's `ar` is its own reference (the two
paths round differently).
"""

from __future__ import annotations

import statistics

from ab import ab_args, default_model, interleaved, prompts_of, write_results

import paradec


def main() -> None:
    args = ab_args("ar,pld,auto,eagle", per_category=1)
    model, given = default_model()
    engines = {e: paradec.load(model, backend="torch", **given) for e in ("C", "torch")}
    engines["torch"].model.set_native(False)
    if not engines["C"].model.runs_native():
        raise SystemExit("the C small ops do not run here (no C compiler, no AVX2 + FMA, or PARADEC_NATIVE=0)")
    methods = args.methods.split(",")
    runs = [(m, e) for m in methods for e in engines]
    prompts = prompts_of(args)
    got: dict[tuple, list] = {r: [] for r in runs}  # (tokens/s, token ids) per prompt
    for out in interleaved(engines, runs, prompts, args.max_new_tokens):
        for r, (tps, g) in out.items():
            got[r].append((tps, g.token_ids))
    rows = []
    for m in methods:
        c, t = got[m, "C"], got[m, "torch"]
        row = {
            "method": m,
            "tokens/s C (mean)": round(statistics.mean(x[0] for x in c), 1),
            "tokens/s torch (mean)": round(statistics.mean(x[0] for x in t), 1),
            "C / torch (median)": round(statistics.median(a[0] / b[0] for a, b in zip(c, t)), 3),
            "(mean)": round(statistics.mean(a[0] / b[0] for a, b in zip(c, t)), 3),
        }
        for e in engines:  # each engine's methods against its own `ar`
            if "ar" in methods:
                same = sum(x[1] == y[1] for x, y in zip(got[m, e], got["ar", e]))
                row[f"identical to ar ({e})"] = f"{same}/{len(prompts)}"
        rows.append(row)
    head = f"{len(prompts)} prompts, {args.max_new_tokens} new tokens; format {engines['C'].format.name}"
    write_results(args.out, head, {"format": engines["C"].format.name, "prompts": len(prompts)}, rows)


if __name__ == "__main__":
    main()

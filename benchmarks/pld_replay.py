"""Prompt lookup's chain length, replayed: how many tokens each setting would commit per unit of
pass cost on the model's own greedy answers, without timing a single decode.

    python benchmarks/pass_cost.py --out benchmarks/results/pass_cost
    python benchmarks/pld_replay.py --prompts ../shared/data/spec_bench/question.jsonl --per-category 5 \
        --pass-cost benchmarks/results/pass_cost/results.json --out benchmarks/results/pld_replay

Greedy prompt lookup commits exactly `ar`'s tokens, and which draft tokens a pass accepts depends
only on the text, so one `ar` answer per prompt replays every setting exactly (a prompt's replayed
tau equals `paradec bench`'s; the table's tau is all tokens over all steps). A step of w tree rows costs
pass_cost(w) `ar` steps (measured,
interpolated); "vs ar" is committed tokens over that cost, per prompt, then averaged (mean, as
Spec-Bench reports). The `ar` answers are kept in OUT/answers.json and reused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from paradec.bench.report import markdown_table
from paradec.draft import NgramDrafter

# (label, max_ngram, tokens per matched suffix token or None, most tokens (the fixed length without per_match))
SETTINGS = {
    "none": [
        ("fixed 8 (before)", 3, None, 8),
        ("fixed 12", 3, None, 12),
        ("fixed 16", 4, None, 16),
        ("2 per match, <= 8", 4, 2, 8),
        ("4 per match, <= 12", 4, 4, 12),
        ("4 per match, <= 16 (default)", 4, 4, 16),
    ],
    "int4": [
        ("fixed 2", 3, None, 2),
        ("fixed 3 (before)", 3, None, 3),
        ("fixed 4", 3, None, 4),
        ("1 per match, <= 4 (default)", 4, 1, 4),
        ("2 per match, <= 8", 4, 2, 8),
    ],
}


def answers(args) -> list[dict]:
    path = Path(args.out) / "answers.json"
    if path.is_file():
        return json.loads(path.read_text())
    import paradec
    from paradec.bench.harness import BenchConfig, encode_prompts
    from paradec.bench.prompts import load_prompts
    from paradec.zoo import default_gguf

    engine = paradec.load(default_gguf())
    cfg = BenchConfig(
        model="default",
        methods=("ar",),
        prompts=args.prompts,
        out=args.out,
        per_category=args.per_category,
        max_new_tokens=args.max_new_tokens,
    )
    out = []
    for p, ids in encode_prompts(engine, load_prompts(args.prompts, per_category=args.per_category), cfg):
        gen = engine.generate(ids, max_new_tokens=args.max_new_tokens, ignore_eos=True)
        out.append({"id": p.id, "category": p.category, "prompt": ids, "answer": gen.token_ids})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return out


def replay(drafter: NgramDrafter, prompt: list[int], answer: list[int], cost) -> tuple[int, float]:
    """(steps, cost in `ar` steps) of greedy prompt lookup committing ``answer`` after ``prompt``."""
    i = steps = 0
    total = 0.0
    while i < len(answer):
        chains = drafter.continuations(prompt + answer[:i])
        accepted = 0
        for chain in chains:
            a = 0
            while a < len(chain) and i + a < len(answer) and chain[a] == answer[i + a]:
                a += 1
            accepted = max(accepted, a)
        total += cost(1 + sum(len(c) for c in chains))
        steps += 1
        i += accepted + 1
    return steps, total


def replay_parser() -> argparse.ArgumentParser:
    """The options every replay takes (``rest_replay.py`` adds its own)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--pass-cost", required=True, help="benchmarks/pass_cost.py's results.json")
    ap.add_argument("--out", required=True)
    return ap


def pass_cost(path: str, quant: str):
    """w -> what a pass of w rows costs in `ar` steps, for ``quant``, from pass_cost.py's results."""
    rows = json.loads(Path(path).read_text())["rows"]
    curve = sorted((r["width"], r["vs_width_1"]) for r in rows if r["quant"] == quant)
    widths, ratios = [w for w, _ in curve], [c for _, c in curve]
    return lambda w: float(np.interp(w, widths, ratios))


def main() -> None:
    args = replay_parser().parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    data = answers(args)
    out = []
    for quant, settings in SETTINGS.items():
        cost = pass_cost(args.pass_cost, quant)
        for label, max_ngram, per_match, most in settings:
            drafter = NgramDrafter(max_ngram, most, per_match=per_match)
            tokens = steps = 0
            speed = []
            for rec in data:
                s, c = replay(drafter, rec["prompt"], rec["answer"], cost)
                tokens, steps = tokens + len(rec["answer"]), steps + s
                speed.append(len(rec["answer"]) / c)
            out.append(
                {
                    "quant": quant,
                    "setting": label,
                    "tau": round(tokens / steps, 3),
                    "vs_ar_mean": round(float(np.mean(speed)), 3),
                    "vs_ar_median": round(float(np.median(speed)), 3),
                }
            )
    result = {"prompts": len(data), "pass_cost": args.pass_cost, "rows": out}
    (Path(args.out) / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown_table(out, ["quant", "setting", "tau", "vs_ar_mean", "vs_ar_median"])
    (Path(args.out) / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

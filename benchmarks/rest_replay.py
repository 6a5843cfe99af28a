"""Retrieval drafting, replayed: what a datastore adds to prompt lookup on the model's own greedy
answers, priced by the measured pass cost, without timing a decode (as ``pld_replay.py``).

    python benchmarks/rest_replay.py --prompts ../shared/data/spec_bench/question.jsonl --per-category 5 \\
        --datastore zoo/smollm2/datastore --pass-cost benchmarks/results/pass_cost/results.json \\
        --out benchmarks/results/rest_replay

At every step of ``pld``'s own walk through an answer (its chains decide where the steps fall), it
asks both lookups and records what each chain would have had accepted. Rows, per weight format:

- ``pld``, ``rest``: each alone, as the methods draft;
- ``per context``: for each (prompt lookup's matched suffix, the datastore's ``confidence``) the
  option, and how much of its chain, with the most tokens per unit of pass cost on these same
  answers: what ``auto``'s per-context choice could reach, an upper bound (chosen in sample).

"vs ar" is committed tokens over the replayed cost, all answers together. ``--datastore`` repeats.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from paradec.bench.report import markdown_table
from paradec.draft import NgramDrafter
from paradec.draft.datastore import REST_DRAFT, Datastore, DatastoreLookup
from paradec.draft.ngram import PLD_DRAFT

sys.path.insert(0, str(Path(__file__).parent))
from pld_replay import answers, pass_cost, replay_parser  # noqa: E402  (the `ar` answers are kept in OUT)


def accepted(chain: list[int], answer: list[int], i: int) -> int:
    n = 0
    while n < len(chain) and i + n < len(answer) and chain[n] == answer[i + n]:
        n += 1
    return n


def walk(data: list[dict], pld: NgramDrafter, rest: DatastoreLookup) -> list[tuple]:
    """(pld's context, rest's context, pld chain length, accepted, rest chain length, accepted) per step."""
    steps = []
    for rec in data:
        prompt, answer, i = rec["prompt"], rec["answer"], 0
        while i < len(answer):
            ctx = prompt + answer[:i]
            a = next(iter(pld.continuations(ctx)), [])
            b = next(iter(rest.continuations(ctx)), [])
            steps.append((pld.matched, rest.matched, len(a), accepted(a, answer, i), len(b), accepted(b, answer, i)))
            i += steps[-1][3] + 1
    return steps


def price(steps: list[tuple], cost) -> dict:
    tokens = {"pld": 0.0, "rest": 0.0}
    seconds = {"pld": 0.0, "rest": 0.0}
    for s in steps:
        tokens["pld"], seconds["pld"] = tokens["pld"] + 1 + s[3], seconds["pld"] + cost(1 + s[2])
        tokens["rest"], seconds["rest"] = tokens["rest"] + 1 + s[5], seconds["rest"] + cost(1 + s[4])
    by_context = defaultdict(list)
    for s in steps:
        by_context[s[:2]].append(s)
    best_t = best_s = 0.0
    for group in by_context.values():
        options = [(len(group), len(group) * cost(1))]  # `ar`
        for length, acc in ((2, 3), (4, 5)):
            for cut in range(1, 1 + max(s[length] for s in group)):
                t = sum(1 + min(s[acc], cut) for s in group)
                options.append((t, sum(cost(1 + min(s[length], cut)) for s in group)))
        t, c = max(options, key=lambda o: o[0] / o[1])
        best_t, best_s = best_t + t, best_s + c
    out = {k: round(tokens[k] / seconds[k], 3) for k in tokens}
    out["per context"] = round(best_t / best_s, 3)
    return out


def main() -> None:
    ap = replay_parser()
    ap.add_argument("--datastore", action="append", required=True, help="a datastore directory (repeat)")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    data = answers(args)
    rows = []
    for path in args.datastore:
        store = Datastore.load(path)
        for quant in ("none", "int4"):
            cost = pass_cost(args.pass_cost, quant)
            per_match, most = PLD_DRAFT[quant]
            steps = walk(data, NgramDrafter(4, most, per_match=per_match), DatastoreLookup(store, REST_DRAFT[quant]))
            vs_ar = price(steps, cost)
            with_chain = sum(s[4] > 0 for s in steps) / len(steps)
            rows.append(
                {
                    "datastore": f"{Path(path).name} ({len(store):,} tokens)",
                    "quant": quant,
                    "pld vs ar": vs_ar["pld"],
                    "rest vs ar": vs_ar["rest"],
                    "per context vs ar": vs_ar["per context"],
                    "over pld": round(vs_ar["per context"] / vs_ar["pld"], 3),
                    "steps with a rest chain": round(with_chain, 3),
                }
            )
    (Path(args.out) / "results.json").write_text(json.dumps({"prompts": len(data), "rows": rows}, indent=2) + "\n")
    table = markdown_table(rows, list(rows[0]))
    (Path(args.out) / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

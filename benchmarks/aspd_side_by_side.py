"""Answers side by side: the base model (`ar`), the ASPD model's Seq twin (`ar`) and the ASPD
model (`aspd`, with its plan and branches shown), greedy, through the chat template, so a reader
can judge what parallel decoding does to the text.

    python benchmarks/aspd_side_by_side.py ../shared/data/vicuna_bench/question.jsonl \
        --ids 1 4 26 --out benchmarks/results/aspd_side_by_side.md

The ASPD adapter defaults to the bundled one (zoo/smollm2/aspd); its twin is the sibling
``aspd-seq`` directory and its base the adapter's recorded base.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import paradec
from paradec.bench.prompts import load_prompts
from paradec.errors import ParadecError
from paradec.models.adapter import read_adapter
from paradec.zoo import aspd_twin, bundled_aspd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", help="a FastChat question.jsonl (first turns are used)")
    ap.add_argument("--ids", nargs="+", required=True, help="question ids to answer")
    ap.add_argument("--adapter", default=None, help="the ASPD adapter (default: the bundled one)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", required=True, help="Markdown file to write")
    args = ap.parse_args()
    try:
        adapter = Path(args.adapter) if args.adapter else bundled_aspd()
        twin_dir = aspd_twin(adapter)
        if twin_dir is None:
            raise ParadecError("need an ASPD adapter with its Seq twin beside it (ADAPTER-seq); pass --adapter")
        prompts = {p.id: p for p in load_prompts(args.prompts)}
        missing = [i for i in args.ids if i not in prompts]
        if missing:
            raise ParadecError(f"no question with id {', '.join(missing)} in {args.prompts}")
        engines = {
            "ar of the base": (paradec.load(read_adapter(adapter)[1]), "ar"),
            "Seq twin": (paradec.load(twin_dir), "ar"),
            "ASPD": (paradec.load(adapter), "aspd"),
        }
    except ParadecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parts = [
        "# ASPD answers side by side\n",
        f"Greedy, bf16, chat template, up to {args.max_new_tokens} new tokens, stop at end of turn. "
        f"Command: `python benchmarks/aspd_side_by_side.py {args.prompts} --ids {' '.join(args.ids)}`\n",
    ]
    for qid in args.ids:
        question = prompts[qid].turns[0]
        parts.append(f"## Question {qid} ({prompts[qid].category})\n\n> {question}\n")
        for name, (engine, method) in engines.items():
            g = engine.generate(
                [{"role": "user", "content": question}], method=method, max_new_tokens=args.max_new_tokens
            )
            extra = g.stats.extra
            info = f"{len(g.token_ids)} tokens, {g.stats.steps} passes"
            if method == "aspd":
                info += f", {extra.get('groups', 0)} group(s), {extra.get('branches', 0)} branches"
            parts.append(f"### {name} ({info})\n\n```text\n{g.text.strip()}\n```\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whether a change kept every method's greedy output: token ids of every registered method on
Spec-Bench prompts (first turns, through the chat template), batch 1 and batches of 4, on the
default model with the zoo's companions (ASPD's methods on the zoo's ASPD adapter). Run it from
each checkout, then compare:

    PYTHONPATH=OLD python benchmarks/same_tokens.py run --prompts ../shared/data/spec_bench/question.jsonl \
        --out /tmp/tokens-old
    PYTHONPATH=NEW python benchmarks/same_tokens.py run ... --out /tmp/tokens-new
    python benchmarks/same_tokens.py compare /tmp/tokens-old /tmp/tokens-new

``run`` appends one JSON line per (method, batch, prompt) to OUT/tokens.jsonl and skips lines
already there, so a stopped run resumes. ``compare`` prints the outputs that differ and exits 1
if any does; it also checks every lossless method against `ar` of the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import paradec
from paradec import methods
from paradec.bench.prompts import load_prompts
from paradec.zoo import bundled_aspd, default_gguf, zoo_drafts, zoo_eagle, zoo_heads


def _done(path: Path) -> set[tuple[str, int, int]]:
    if not path.is_file():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["method"], r["batch"], r["prompt"]) for r in rows}


def _prompts(args: argparse.Namespace) -> list[str]:
    """The first ``per_category`` of each category but the first ``skip``, at most ``n`` of them
    (two runs, ``--per-category 4`` and ``--skip 4 --per-category 9``, split the first 9 of each)."""
    seen: dict[str, int] = {}
    out = []
    for p in load_prompts(args.prompts, per_category=args.per_category):
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] > args.skip:
            out.append(p.text)
    return out[: args.n]


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokens.jsonl"
    done = _done(path)
    prompts = _prompts(args)
    model = default_gguf()
    drafts, heads = zoo_drafts(model), zoo_heads(model)
    chosen = [m for m in methods.methods() if not args.methods or m.name in args.methods.split(",")]
    names = [m.name for m in chosen if m.decode is None]
    own = [m.name for m in chosen if m.decode is not None]
    engines = [(paradec.load(model, quant="int4", drafts=drafts[:1], heads=heads, eagle=zoo_eagle(model)), names)]
    if own:
        engines.append((paradec.load(bundled_aspd(), quant="int4"), own))
    with path.open("a") as f:
        for engine, chosen in engines:
            for name in chosen:
                for batch, count in ((1, len(prompts)), (4, min(len(prompts), args.batched))):
                    for start in range(0, count, batch):
                        if (name, batch, start) in done:
                            continue
                        chats = [[{"role": "user", "content": p}] for p in prompts[start : start + batch]]
                        gens = engine.generate(
                            chats, chat=True, method=name, max_new_tokens=args.max_new_tokens, ignore_eos=True
                        )
                        ids = [g.token_ids for g in gens]
                        f.write(json.dumps({"method": name, "batch": batch, "prompt": start, "ids": ids}) + "\n")
                        f.flush()
                print(name, flush=True)


def _read(path: Path) -> dict[tuple[str, int, int], list]:
    rows = [json.loads(line) for line in (path / "tokens.jsonl").read_text().splitlines() if line.strip()]
    return {(r["method"], r["batch"], r["prompt"]): r["ids"] for r in rows}


def compare(args: argparse.Namespace) -> None:
    old, new = _read(Path(args.old)), _read(Path(args.new))
    shared = sorted(set(old) & set(new))
    differ = [k for k in shared if old[k] != new[k]]
    lossless = {m.name for m in methods.methods() if m.lossless}
    not_ar = [k for k in shared if k[0] in lossless and (("ar",) + k[1:]) in new and new[k] != new[("ar",) + k[1:]]]
    for k in differ:
        print("differs from the old run:", *k)
    for k in not_ar:
        print("differs from ar:", *k)
    outputs = sum(len(old[k]) for k in shared)
    print(
        f"{len(shared)} (method, batch, first prompt) runs, {outputs} outputs, "
        f"{len({k[0] for k in shared})} methods: {len(differ)} differ from the old run, "
        f"{len(not_ar)} lossless ones differ from ar; only in old: {len(set(old) - set(new))}, "
        f"only in new: {len(set(new) - set(old))}"
    )
    sys.exit(1 if differ or not_ar else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--prompts", required=True, help="Spec-Bench question.jsonl")
    r.add_argument("--n", type=int, default=105, help="at most N prompts")
    r.add_argument("--per-category", type=int, default=9, help="the first K of each Spec-Bench category")
    r.add_argument("--skip", type=int, default=0, help="but not the first K of each")
    r.add_argument("--batched", type=int, default=16, help="the first N prompts again, in batches of 4")
    r.add_argument("--max-new-tokens", type=int, default=24)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--methods", default="", help="comma-separated (default: every registered method)")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    args = parser.parse_args()
    run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    main()

"""How much can ASPD gain on given answers? PPD, degree of parallelism and the speedup ceilings
of ``paradec aspd extract`` per answer file, plus two code sets from this Python's held-out
stdlib (never trained on): whole files, and the independent-function groups that the
``stdlib:heldout`` bench prompts lead up to (each group alone, no serial code around it: the
most favourable case for ASPD).

A ceiling is what a model that writes exactly these answers would get from ASPD, one token per
row per forward pass (tokens / passes); ``_marked`` includes ASPD's plan and markers.

    python benchmarks/aspd_ceiling.py ../shared/data/*/model_answer/*.jsonl \
        --tokenizer zoo/tokenizer --out benchmarks/results/aspd_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from paradec.bench.report import markdown_table, write_json
from paradec.parallel.extract import code_groups
from paradec.parallel.pipeline import extract_file, group_passes
from paradec.stdlib import is_held_out, stdlib_files
from paradec.tokenizer import load_tokenizer

COLUMNS = [
    "answers",
    "n",
    "ppd",
    "degree_of_parallelism",
    "branches_per_group",
    "groups",
    "ceiling_speedup",
    "ceiling_speedup_marked",
    "ceiling_parallel_answers_marked",
    "ceiling_best_answer_marked",
]


def held_out_sources() -> list[tuple[str, str]]:
    out = []
    for rel, file in stdlib_files():
        if is_held_out(rel):
            try:
                out.append((rel, file.read_text(encoding="utf-8")))
            except (UnicodeDecodeError, OSError):
                continue
    return out


def group_row(sources: list[tuple[str, str]], count) -> dict:
    """The groups the ``stdlib:heldout`` prompts lead up to, each as its own answer (found in
    the whole file: methods of a class do not parse on their own)."""
    plain = longest = marked = 0
    best, sizes = 1.0, []
    for _, source in sources:
        for g in code_groups(source):
            p, lo, m = group_passes(source, g, count)
            plain, longest, marked = plain + p, longest + lo, marked + m
            best = max(best, p / m)
            sizes.append(len(g.branches))
    ceiling_marked = round(plain / max(1, marked), 3)
    return {
        "answers": "stdlib held-out groups (what the bench prompts lead to)",
        "n": len(sizes),
        "ppd": 1.0,
        "degree_of_parallelism": 1.0,
        "branches_per_group": round(sum(sizes) / max(1, len(sizes)), 3),
        "groups": len(sizes),
        "ceiling_speedup": round(plain / max(1, longest), 3),
        "ceiling_speedup_marked": ceiling_marked,
        "ceiling_parallel_answers_marked": ceiling_marked,
        "ceiling_best_answer_marked": round(best, 3),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("answers", nargs="*", help="answer jsonl files (FastChat format or text/output/answer)")
    ap.add_argument("--tokenizer", default="zoo/tokenizer", help="tokens are counted with this tokenizer")
    ap.add_argument("--no-stdlib", action="store_true", help="skip the held-out stdlib code sets")
    ap.add_argument("--out", required=True, help="results JSON (a .md table is written next to it)")
    args = ap.parse_args(argv)
    missing = [a for a in args.answers if not Path(a).is_file()]
    if missing:
        sys.exit(f"error: answer file {missing[0]!r} does not exist; pass jsonl answer files")
    if not Path(args.tokenizer, "tokenizer.json").is_file():
        sys.exit(f"error: no tokenizer.json in {args.tokenizer!r}; pass --tokenizer DIR")
    hf = load_tokenizer(Path(args.tokenizer), ()).hf

    def count(text: str) -> int:
        return len(hf(text, add_special_tokens=False).input_ids)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = {f"{Path(a).parent.parent.name}/{Path(a).stem}": Path(a) for a in args.answers}
        sources = [] if args.no_stdlib else held_out_sources()
        if sources:
            path = Path(tmp) / "stdlib_files.jsonl"
            path.write_text("".join(json.dumps({"id": rel, "text": text}) + "\n" for rel, text in sources))
            sets["stdlib held-out files"] = path
        for label, path in sets.items():
            stats = extract_file(path, Path(tmp) / "out" / (path.stem + ".jsonl"), count_tokens=count)
            rows.append({"answers": label, "n": stats["answers"], **{k: stats[k] for k in COLUMNS[2:]}})
            print(label, json.dumps(rows[-1]), file=sys.stderr)
        if sources:
            rows.append(group_row(sources, count))
    write_json({"tokenizer": args.tokenizer, "rows": rows}, args.out)
    table = markdown_table(rows, COLUMNS)
    Path(args.out).with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

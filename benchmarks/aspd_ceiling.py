"""How much can ASPD gain on given answers? PPD, degree of parallelism and the speedup ceilings
of ``paradec aspd extract`` per answer file, plus two code sets from this Python's held-out
stdlib (never trained on): whole files, and the independent-function groups that the
``stdlib:heldout`` bench prompts lead up to (each group alone: the most favourable case).

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
from paradec.parallel.pipeline import extract_file
from paradec.tokenizer import load_tokenizer
from paradec.train.corpus import is_held_out, stdlib_files

COLUMNS = ["answers", "n", "ppd", "degree_of_parallelism", "branches_per_group", "groups",
           "ceiling_speedup", "ceiling_speedup_marked", "ceiling_parallel_answers_marked",
           "ceiling_best_answer_marked"]


def stdlib_sets(tmp: Path) -> dict[str, Path]:
    """Write the two held-out stdlib code sets as jsonl answer files; -> {label: path}."""
    files, groups = [], []
    for rel, file in stdlib_files():
        if not is_held_out(rel):
            continue
        try:
            source = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append({"id": rel, "text": source})
        for g in code_groups(source):
            groups.append({"id": rel, "text": source[g.branches[0].start: g.branches[-1].end]})
    out = {}
    for label, recs in (("stdlib held-out files", files), ("stdlib held-out groups (bench targets)", groups)):
        path = tmp / (label.split(" (")[0].replace(" ", "_") + ".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        out[label] = path
    return out


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
        if not args.no_stdlib:
            sets.update(stdlib_sets(Path(tmp)))
        for label, path in sets.items():
            stats = extract_file(path, Path(tmp) / "out" / (path.stem + ".jsonl"), count_tokens=count)
            rows.append({"answers": label, "n": stats["answers"], **{k: stats[k] for k in COLUMNS[2:]}})
            print(label, json.dumps(rows[-1]), file=sys.stderr)
    write_json({"tokenizer": args.tokenizer, "rows": rows}, args.out)
    table = markdown_table(rows, COLUMNS)
    Path(args.out).with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

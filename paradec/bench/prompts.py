"""Prompt files: Spec-Bench / MT-bench question.jsonl, HumanEval jsonl(.gz), plain text."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from paradec.errors import ParadecError


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    turns: tuple[str, ...] = ()  # a conversation's user turns (question.jsonl); () for plain text / code


def load_prompts(path: str | Path, limit: int | None = None, per_category: int | None = None) -> list[Prompt]:
    """Read prompts; the format is told by the file's records, not its name.

    jsonl records with ``turns`` (Spec-Bench, MT-bench: the first turn), or ``prompt``
    (HumanEval); any other file is one prompt per non-empty line. ``stdlib:heldout`` builds
    prompts that invite several functions from this Python's own held-out stdlib files. ``per_category`` keeps the
    first k of each category (Spec-Bench orders questions by category), then ``limit`` applies.
    """
    if str(path).startswith("stdlib:"):
        out = stdlib_group_prompts(str(path).split(":", 1)[1])
        return out[:limit] if limit else out
    path = Path(path)
    if not path.is_file():
        raise ParadecError(
            f"prompt file {str(path)!r} does not exist; pass prompts=FILE "
            "(question.jsonl, HumanEval.jsonl.gz or one prompt per line)"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ParadecError(f"cannot read prompt file {path} ({exc.__class__.__name__})") from None
    out = []
    for i, line in enumerate(lines):
        rec = None
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise ParadecError(f"{path}:{i + 1} is not valid JSON; fix or remove that line") from None
        if rec is None:
            out.append(Prompt(str(i), "text", line))
        elif "turns" in rec:
            turns = rec["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise ParadecError(f"{path}:{i + 1} has no usable 'turns' (a non-empty list of non-empty strings)")
            out.append(Prompt(str(rec.get("question_id", i)), str(rec.get("category", "all")), turns[0], tuple(turns)))
        elif "prompt" in rec:
            if not isinstance(rec["prompt"], str):
                raise ParadecError(f"{path}:{i + 1} has a 'prompt' that is not a string")
            out.append(Prompt(str(rec.get("task_id", i)), str(rec.get("category", "code")), rec["prompt"]))
        else:
            raise ParadecError(
                f"{path}:{i + 1} has neither 'turns' nor 'prompt'; use Spec-Bench question.jsonl or HumanEval format"
            )
    if per_category:
        seen: dict[str, int] = {}
        kept = []
        for p in out:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                kept.append(p)
        out = kept
    out = out[:limit] if limit else out
    if not out:
        raise ParadecError(f"prompt file {path} has no prompts")
    return out


def stdlib_group_prompts(split: str = "heldout", before: int = 600) -> list[Prompt]:
    """Code that is followed by several independent functions in the stdlib: for every group
    ``paradec.parallel.extract.code_groups`` accepts in a held-out file (never trained on), the
    ~``before`` characters (whole lines) before the group's first function, ordered round-robin
    over files (first group of every file, then the second, ...). The files come
    from the running Python, so nothing is downloaded and nothing is copied into the repo."""
    from paradec.parallel.extract import code_groups
    from paradec.stdlib import is_held_out, stdlib_files

    if split not in ("heldout", "train"):
        raise ParadecError(f"unknown prompt source stdlib:{split}; use stdlib:heldout")
    per_file = []
    for rel, file in stdlib_files():
        if is_held_out(rel) != (split == "heldout"):
            continue
        try:
            source = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        mine = []
        for g in code_groups(source):
            start = g.branches[0].start
            lo = source.rfind("\n", 0, max(0, start - before)) + 1
            mine.append(Prompt(f"{rel}:{source.count(chr(10), 0, start) + 1}", "stdlib-groups", source[lo:start]))
        per_file.append(mine)
    # round-robin over files, so the first N prompts come from as many files as possible
    return [f[i] for i in range(max(map(len, per_file), default=0)) for f in per_file if i < len(f)]

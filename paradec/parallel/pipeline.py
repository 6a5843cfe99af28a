"""``paradec aspd extract IN OUT``: answers in, marked-up answers + statistics out.

Input: jsonl of FastChat answer records (``choices[0].turns``) or records with ``text`` /
``output`` / ``answer``. Output: one record per answer turn (``parallel``, ``groups``,
``marked``), written atomically, and a stats record printed and saved next to OUT.

Statistics: PPD (share of answers with at least one group), degree of parallelism (branch
tokens / all tokens, over the file), branches per group, and two ceilings on ASPD's speedup for
these answers — what a model that writes exactly them would get, one token per row per pass:

- ``ceiling_speedup``: tokens / passes when every group's branches advance together (a group
  costs its longest branch), markup free;
- ``ceiling_speedup_marked``: the same in ASPD's format, where a group also costs its plan
  (titles, ``<|para|>``, decoded serially), the ``<|branch|>TITLE: `` prefix and end marker of
  its longest branch, and ``<|/para|>``.

Both are over the file (total tokens / total passes), like tokens per second over a benchmark;
``ceiling_parallel_answers_marked`` is the marked ceiling over the answers that have a group
(the prompts that invite parallel answers), ``ceiling_best_answer_marked`` the best answer's.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from paradec.errors import ParadecError
from paradec.parallel.extract import find_groups
from paradec.parallel.markup import END_PARA, Group, branch_text, mark_up, plan_text

JUDGE_RULES = (
    "You check whether parts of an answer can be written in parallel. Rules: no branch uses another "
    "branch's results, explicitly or implicitly; no branch is a precondition of another; titles are "
    "unique; the text before the branches does not depend on any branch. Reply with exactly "
    "'[PARALLEL] true' or '[PARALLEL] false'."
)


def make_judge(url: str, model: str, votes: int = 3, timeout: float = 60.0):
    """A judge over an OpenAI-compatible /chat/completions endpoint: all ``votes`` must say true."""
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/chat/completions") else "/chat/completions")

    def ask(question: str, precondition: str, branches: list[str]) -> bool:
        listing = "\n".join(f"[Branch {i + 1}]\n{b}" for i, b in enumerate(branches))
        body = {
            "model": model,
            "temperature": 1.0,
            "messages": [
                {"role": "system", "content": JUDGE_RULES},
                {"role": "user", "content": f"[Question]\n{question}\n[Precondition]\n{precondition}\n{listing}"},
            ],
        }
        for _ in range(votes):
            req = urllib.request.Request(
                endpoint, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    reply = json.loads(resp.read())["choices"][0]["message"]["content"]
            except (OSError, KeyError, ValueError, IndexError) as exc:
                raise ParadecError(f"judge at {endpoint} failed ({exc.__class__.__name__}); check judge_url=") from None
            if not re.search(r"\[PARALLEL\]\s*true", reply, re.I):
                return False
        return True

    return ask


def _answers(path: Path) -> list[tuple[str, int, str]]:
    if not path.is_file():
        raise ParadecError(f"input file {str(path)!r} does not exist; pass a jsonl of answers")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ParadecError(f"{path} is not UTF-8 text; pass a jsonl of answers") from None
    out = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ParadecError(f"{path}:{n + 1} is not valid JSON; fix or remove that line") from None
        if not isinstance(rec, dict):
            raise ParadecError(f"{path}:{n + 1} is not a JSON object; each line is one answer record")
        qid = str(rec.get("question_id", rec.get("id", n)))
        if "choices" in rec:
            try:
                turns = rec["choices"][0]["turns"]
            except (IndexError, KeyError, TypeError):
                raise ParadecError(
                    f"{path}:{n + 1} has 'choices' without [0]['turns'] (FastChat model_answer format)"
                ) from None
        else:
            text = rec.get("text", rec.get("output", rec.get("answer")))
            if text is None:
                raise ParadecError(f"{path}:{n + 1} has no choices/text/output/answer field")
            turns = [text]
        out += [(qid, t, turn) for t, turn in enumerate(turns) if isinstance(turn, str)]
    return out


def group_passes(text: str, group: Group, count) -> tuple[int, int, int]:
    """-> (plain tokens of the group's branches, passes for them in parallel without markup,
    passes in ASPD's format: plan + longest marked branch + ``<|/para|>``)."""
    contents = [text[b.start : b.end] for b in group.branches]
    plain = [count(c) for c in contents]
    plan = count(plan_text(group))
    marked = [count(branch_text(b.title, c)) for b, c in zip(group.branches, contents)]
    return sum(plain), max(plain), plan + max(marked) + count(END_PARA)


def extract_file(inp: str | Path, out: str | Path, judge=None, count_tokens=None) -> dict:
    count = count_tokens or (lambda s: len(s.split()))
    inp, out = Path(inp), Path(out)
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # before the work, not after it
        raise ParadecError(f"OUT {out}: {blocker} is a file, not a directory; pass another OUT")
    records, total_tokens, branch_tokens, group_sizes, parallel = [], 0, 0, [], 0
    passes = passes_marked = 0  # what the ceilings divide by
    par_tokens = par_passes_marked = 0  # over the answers with a group
    best = 1.0
    kinds: dict[str, int] = {}
    for qid, turn, text in _answers(inp):
        groups = find_groups(text, judge)
        tokens = count(text)
        mine, mine_marked = tokens, tokens
        for g in groups:
            group_sizes.append(len(g.branches))
            kinds[g.kind] = kinds.get(g.kind, 0) + 1
            plain, longest, marked = group_passes(text, g, count)
            branch_tokens += plain
            mine += longest - plain
            mine_marked += marked - plain
        total_tokens += tokens
        passes += mine
        passes_marked += mine_marked
        if groups:
            par_tokens += tokens
            par_passes_marked += mine_marked
            best = max(best, tokens / max(1, mine_marked))
        parallel += bool(groups)
        records.append(
            {
                "question_id": qid,
                "turn": turn,
                "parallel": bool(groups),
                "groups": [{"kind": g.kind, "titles": [b.title for b in g.branches]} for g in groups],
                "marked": mark_up(text, groups),
            }
        )
    stats = {
        "file": str(inp),
        "answers": len(records),
        "parallel_answers": parallel,
        "ppd": round(parallel / max(1, len(records)), 4),
        "degree_of_parallelism": round(branch_tokens / max(1, total_tokens), 4),
        "branches_per_group": round(sum(group_sizes) / max(1, len(group_sizes)), 3),
        "groups": len(group_sizes),
        "ceiling_speedup": round(total_tokens / max(1, passes), 3),
        "ceiling_speedup_marked": round(total_tokens / max(1, passes_marked), 3),
        "ceiling_parallel_answers_marked": round(par_tokens / max(1, par_passes_marked), 3) if par_tokens else None,
        "ceiling_best_answer_marked": round(best, 3),
        "groups_by_kind": kinds,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    out.with_suffix(".stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats

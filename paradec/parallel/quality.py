"""How good is parallel-decoded text? Checks that need no judge model.

- ``nll``: mean per-token negative log-likelihood of a continuation under a reference model
  (ASPD's fair reference is the Seq twin: same data, no markup). An ASPD output that reads as
  naturally as the twin's own greedy text scores about the same.
- ``parses``: does the output's complete part parse as Python? Generation stops at a token
  budget, so the last unit is usually cut; ``complete_part`` drops everything from the last line
  at the output's base indentation on (the unit that may be unfinished), then the rest must parse.
- ``well_formed``: an ASPD answer's markup is sound (unique titles, every planned branch present,
  nothing leaks into the text users read).
"""

from __future__ import annotations

import ast
import re
import textwrap

import torch
import torch.nn.functional as F

from paradec.parallel.markup import BRANCH, END_BRANCH, END_PARA, END_TITLE, PARA, TITLE, strip_markup


@torch.inference_mode()
def nll(model, prompt: list[int], continuation: list[int]) -> float:
    """Mean NLL (nats per token) of ``continuation`` after ``prompt`` under ``model`` (causal)."""
    if not continuation:
        return float("nan")
    ids = torch.tensor([prompt + continuation], device=model.embed.weight.device)
    logits = model(ids[:, :-1])[0, len(prompt) - 1 :].float()  # [len(continuation), vocab]
    return float(F.cross_entropy(logits, ids[0, len(prompt) :]))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def complete_part(text: str) -> str:
    """``text`` up to its last line at base indentation (exclusive): the units surely finished."""
    lines = text.split("\n")
    code = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    if not code:
        return ""
    base = min(_indent(lines[i]) for i in code)
    starts = [i for i in code if _indent(lines[i]) == base]
    last = starts[-1]
    # decorators belong to the unit after them
    while last > 0 and lines[last - 1].strip().startswith("@") and _indent(lines[last - 1]) == base:
        last -= 1
    return "\n".join(lines[:last])


def parses(text: str) -> bool:
    """True when the complete part of ``text`` is non-empty and valid Python."""
    part = complete_part(text)
    if not part.strip():
        return False
    try:
        ast.parse(textwrap.dedent(part))
    except (SyntaxError, ValueError):
        return False
    return True


_GROUP = re.compile(
    r"((?:"
    + re.escape(TITLE)
    + r".*?"
    + re.escape(END_TITLE)
    + r")*)"
    + re.escape(PARA)
    + r"(.*?)(?:"
    + re.escape(END_PARA)
    + r"|$)",
    re.S,
)
_MARKERS = (TITLE, END_TITLE, PARA, END_PARA, BRANCH, END_BRANCH)


def well_formed(marked: str) -> bool:
    """An ASPD answer (decoded with its markers) is well-formed when every plan's titles are
    unique (their numbers aside), every planned branch is there, in plan order, under its title,
    no title is left without its group, and no marker is left in the text a user reads."""
    for m in _GROUP.finditer(marked):
        titles = re.findall(re.escape(TITLE) + r"(.*?)" + re.escape(END_TITLE), m.group(1), re.S)
        branches = re.findall(re.escape(BRANCH) + r"(.*?):", m.group(2), re.S)
        words = [re.sub(r"^[\d.)\s]+(?=\S)", "", t) for t in titles]  # "4. Reviews" repeats "3. Reviews"
        if len(set(words)) != len(words) or branches != titles:
            return False
    rest = _GROUP.sub("", marked)
    if TITLE in rest:  # a plan that never opened its group
        return False
    return not any(t in strip_markup(marked) for t in _MARKERS)

"""The ASPD text format (papers.md §3.3), one group at a time:

    serial <|title|>T1<|/title|><|title|>T2<|/title|>
    <|para|><|branch|>T1: c1<|/branch|><|branch|>T2: c2<|/branch|><|/para|> serial

Titles come first (the plan), then each branch restates its title and ": ". Here a branch's
content keeps the whitespace that separated it from the next branch, so removing the markup
(titles, markers, "T: " prefixes) and concatenating gives back the original text exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TITLE, END_TITLE, PARA, END_PARA, BRANCH, END_BRANCH = (
    "<|title|>",
    "<|/title|>",
    "<|para|>",
    "<|/para|>",
    "<|branch|>",
    "<|/branch|>",
)


@dataclass(frozen=True)
class Branch:
    title: str
    start: int  # character span [start, end) in the original text, trailing separator included
    end: int


@dataclass(frozen=True)
class Group:
    branches: tuple[Branch, ...]
    kind: str  # "code" | "list" | "section"


def plan_text(group: Group) -> str:
    """The serial plan of a group: its titles, then ``<|para|>``."""
    return "".join(f"{TITLE}{b.title}{END_TITLE}" for b in group.branches) + PARA


def branch_text(title: str, content: str) -> str:
    """One branch as decoded in parallel: ``<|branch|>TITLE: content<|/branch|>``."""
    return f"{BRANCH}{title}: {content}{END_BRANCH}"


def mark_up(text: str, groups: list[Group]) -> str:
    """``text`` with every group (non-overlapping, in order) serialized in the ASPD format."""
    out, pos = [], 0
    for g in sorted(groups, key=lambda g: g.branches[0].start):
        out.append(text[pos : g.branches[0].start])
        out.append(plan_text(g))
        out.append("".join(branch_text(b.title, text[b.start : b.end]) for b in g.branches))
        out.append(END_PARA)
        pos = g.branches[-1].end
    out.append(text[pos:])
    return "".join(out)


_TITLES = re.compile(re.escape(TITLE) + r".*?" + re.escape(END_TITLE), re.S)
# the model may omit the space after the colon; a token budget may cut the last branch before its end marker
_BRANCH = re.compile(
    re.escape(BRANCH) + r"(.*?): ?(.*?)(?:" + re.escape(END_BRANCH) + r"|(?=" + re.escape(BRANCH) + r")|$)", re.S
)


def strip_markup(marked: str) -> str:
    """Plain text for users: titles and markers dropped, branches joined in order. A branch that
    does not end its line (the token budget cut it) is followed by a newline before the next
    branch, so one branch never runs into the next; a complete branch always ends with the
    whitespace that separated it from the next, so complete text comes back unchanged."""
    text = _TITLES.sub("", marked)
    matches = list(_BRANCH.finditer(text))
    out, pos = [], 0
    for i, m in enumerate(matches):
        out.append(text[pos : m.start()])
        content = m.group(2)
        followed = i + 1 < len(matches) and matches[i + 1].start() == m.end()
        if followed and content and not content.endswith("\n"):
            content += "\n"
        out.append(content)
        pos = m.end()
    out.append(text[pos:])
    return "".join(out).replace(PARA, "").replace(END_PARA, "")

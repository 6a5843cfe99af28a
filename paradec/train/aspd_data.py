"""ASPD training data from the stdlib: groups of independent functions, marked up, plus the Seq twin.

Each example is a window of a training-split file around one accepted function group
(``paradec.parallel.extract.code_groups``): some code before it (the prefix), the group in the
ASPD format, some code after it. The Seq twin is the same window without markup. ``collate``
turns examples into tensors with ASPD's Indep mask and Same-Seq positions
(``paradec.parallel.layout``); the Seq twin uses the plain causal mask.
(The fine-tuning loop that consumes these is the next step of the ASPD issue.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradec.parallel.extract import code_groups
from paradec.parallel.layout import layout
from paradec.parallel.markup import Branch, Group, mark_up


@dataclass(frozen=True)
class Example:
    marked: list[int]  # token ids of the window with the group marked up
    plain: list[int]  # the same window, no markup (the Seq twin)
    loss_from: int = 0  # the first this-many tokens are context only (a chat prompt): no loss


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end + 1


def examples_from_sources(
    sources: list[str], tokenizer, max_tokens: int = 512, before: int = 600, after: int = 200
) -> list[Example]:
    """One example per accepted group (at most ``max_tokens`` marked tokens). A group too long
    for one window gives one example per run of >= 2 consecutive branches that fits (any run of
    an independent group is independent, and the branches after it do not use it), so large
    groups — the ones with many branches — are not lost to the length limit."""
    out = []
    for source in sources:
        for g in code_groups(source):
            whole = _example(source, g.branches, tokenizer, max_tokens, before, after)
            if whole is not None:
                out.append(whole)
                continue
            i, k = 0, len(g.branches)
            while i < k - 1:
                best, j = None, i + 2
                while j <= k:
                    ex = _example(source, g.branches[i:j], tokenizer, max_tokens, before, after)
                    if ex is None:
                        break
                    best, j = ex, j + 1
                if best is None:
                    i += 1
                else:
                    out.append(best)
                    i = j - 1
    return out


def _example(source: str, branches, tokenizer, max_tokens: int, before: int, after: int) -> Example | None:
    """The window around ``branches`` (a run of one group) marked up, or None if it is too long."""
    start, end = branches[0].start, branches[-1].end
    lo, hi = _line_start(source, max(0, start - before)), _line_end(source, min(len(source), end + after))
    window = source[lo:hi]
    shifted = Group(tuple(Branch(b.title, b.start - lo, b.end - lo) for b in branches), "code")
    marked = tokenizer(mark_up(window, [shifted]), add_special_tokens=False).input_ids
    if len(marked) > max_tokens:
        return None
    return Example(list(marked), list(tokenizer(window, add_special_tokens=False).input_ids))


def collate(
    seqs: list[list[int]],
    branch_open: int | None,
    branch_close: int | None,
    pad: int = 0,
    loss_from: list[int] | None = None,
):
    """-> inputs [b, T], labels [b, T] (-100 on padding and on the first ``loss_from[b]``
    tokens' targets), positions [b, T], mask [b, 1, T, T].

    With ``branch_open=None`` the mask is plain causal (the Seq twin)."""
    width = max(len(s) for s in seqs) - 1
    x = torch.full((len(seqs), width), pad, dtype=torch.long)
    y = torch.full((len(seqs), width), -100, dtype=torch.long)
    pos = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), 1, width, width, dtype=torch.bool)
    for b, seq in enumerate(seqs):
        n = len(seq) - 1
        x[b, :n] = torch.tensor(seq[:-1])
        y[b, :n] = torch.tensor(seq[1:])
        if loss_from:
            y[b, : max(0, loss_from[b] - 1)] = -100  # targets inside the prompt
        if branch_open is None:
            pos[b, :n] = torch.arange(n)
            mask[b, 0, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        else:
            lay = layout(seq[:-1], branch_open, branch_close)
            pos[b, :n] = lay.positions
            mask[b, 0, :n, :n] = lay.mask
        mask[b, 0, n:, n:] = torch.eye(width - n, dtype=torch.bool)  # padding sees itself only
    return x, y, pos, mask

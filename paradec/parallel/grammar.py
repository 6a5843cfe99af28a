"""ASPD's serial grammar (papers.md §3.5): the special tokens, and which token may come next.

Titles come first (the plan), each at most ``MAX_TITLE_TOKENS`` long, at most ``MAX_BRANCHES``
of them, then ``<|para|>``; branch markers and ``<|/para|>`` never appear serially (the parallel
mode places them); a plan grows only while its branches keep room in the token budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from paradec.errors import ParadecError
from paradec.parallel.markup import BRANCH, END_BRANCH, END_PARA, END_TITLE, PARA, TITLE


@dataclass(frozen=True)
class Specials:
    title: int
    end_title: int
    para: int
    end_para: int
    branch: int
    end_branch: int
    hf: object = field(compare=False, repr=False)  # the tokenizer: forced prefixes are tokenized as trained

    @staticmethod
    def from_tokenizer(hf, fix: str = "use an ASPD-fine-tuned model (paradec train aspd)") -> Specials:
        ids = hf.convert_tokens_to_ids([TITLE, END_TITLE, PARA, END_PARA, BRANCH, END_BRANCH])
        if any(i is None or i == hf.unk_token_id for i in ids):
            raise ParadecError(f"this model's tokenizer lacks ASPD's special tokens (<|title|> ... <|/branch|>); {fix}")
        return Specials(*ids, hf)

    @cached_property
    def not_in_titles(self) -> list[int]:
        """Tokens a title cannot contain: a colon (a branch restates its title before ": ", and
        the text is parsed at the first colon) or a line break (a title is one line)."""
        toks = self.hf.convert_ids_to_tokens(list(range(len(self.hf))))
        return [
            i
            for i, t in enumerate(toks)
            if t and (":" in t or "\u010a" in t or "\n" in t or "<0x0A>" in t) and i not in self.ids
        ]

    @cached_property
    def numbering(self) -> frozenset[int]:
        """Tokens made of digits, "." and ")" only: a numbered item's title starts with its
        number ("3. Reviews"), which does not make it a new title."""
        toks = self.hf.convert_ids_to_tokens(list(range(len(self.hf))))
        # a byte-level BPE space is "\u0120", a SentencePiece one "\u2581"
        bare = (t.replace("\u0120", " ").replace("\u2581", " ").strip() if t else "" for t in toks)
        return frozenset(i for i, t in enumerate(bare) if t and all(c in "0123456789.)" for c in t))

    def number_prefix(self, title: list[int]) -> list[int]:
        """The leading number tokens of a title ("3", "." of "3. Reviews"); [] when unnumbered."""
        n = 0
        while n < len(title) - 1 and title[n] in self.numbering:
            n += 1
        return title[:n]

    def core(self, title: list[int]) -> list[int]:
        """A title without its number: what two titles must not share."""
        return title[len(self.number_prefix(title)) :]

    @property
    def ids(self) -> tuple[int, ...]:
        """The six token ids, in format order."""
        return self.title, self.end_title, self.para, self.end_para, self.branch, self.end_branch

    def branch_prefix(self, title: list[int]) -> list[int]:
        """The forced start of a branch: ``<|branch|>`` + the tokens of "TITLE:", tokenized as
        the training text "<|branch|>TITLE: content" was. The space after the colon is left to
        the model: byte-level BPE attaches it to the next word (" def"), so forcing a lone " "
        token would put the branch in a tokenization it never saw."""
        text = self.hf.decode(title, skip_special_tokens=False) + ":"
        return [self.branch, *self.hf(text, add_special_tokens=False).input_ids]


MAX_BRANCHES = 16  # titles in one plan
MAX_TITLE_TOKENS = 16
MIN_BRANCH_TOKENS = 32  # token budget each planned branch must still have room for (a sentence or two)


def serial_mask(
    sp: Specials, history: list[int], just_merged: bool, vocab: int, budget_left: int | None = None
) -> torch.Tensor:
    """[vocab] bool: the tokens the grammar allows next in serial mode: titles come first, each
    at most ``MAX_TITLE_TOKENS`` long, at most ``MAX_BRANCHES`` of them, then ``<|para|>``; no
    title right after a group; branch markers and ``<|/para|>`` never (the parallel mode places
    them). A title that repeats one of the plan is handled by the decoder (it ends the plan).
    With ``budget_left`` (new tokens still allowed) a plan must not eat its own branches' budget:
    another title is allowed only while every planned branch, and one more like them, still has
    room for its forced ``<|branch|>TITLE:`` prefix and ``MIN_BRANCH_TOKENS`` of content
    (``_plan_cost``); a plan opens only where two short branches fit."""
    allowed = torch.ones(vocab, dtype=torch.bool)
    allowed[[sp.end_para, sp.branch, sp.end_branch]] = False
    last = history[-1] if history else None
    in_titles = sp.title in history and (sp.para not in history[last_index(history, sp.title) :])
    room = budget_left is None or budget_left >= _plan_cost([[0], [0]])
    if last == sp.end_title:
        titles = titles_of(history, sp)
        allowed[:] = False
        allowed[sp.para] = True
        one_more = titles + [[0] * max(1, round(sum(map(len, titles)) / len(titles)))]  # an average title
        allowed[sp.title] = len(titles) < MAX_BRANCHES and (budget_left is None or budget_left >= _plan_cost(one_more))
        return allowed
    if last == sp.title:
        allowed[[sp.title, sp.end_title, sp.para]] = False
        allowed[sp.not_in_titles] = False
    elif in_titles and _inside_title(history, sp):
        allowed[[sp.title, sp.para]] = False
        allowed[sp.not_in_titles] = False
        current = history[last_index(history, sp.title) + 1 :]
        if len(current) >= MAX_TITLE_TOKENS:
            allowed[:] = False
            allowed[sp.end_title] = True
    else:
        allowed[[sp.end_title, sp.para]] = False
    if just_merged or not room:
        allowed[sp.title] = False
    return allowed


def _plan_cost(titles: list[list[int]]) -> int:
    """Tokens a plan of ``titles`` still needs once decided: <|para|>, per branch its forced
    prefix (<|branch|> TITLE :), ``MIN_BRANCH_TOKENS`` of content and <|/branch|>, <|/para|>."""
    return 2 + sum(len(t) + 3 + MIN_BRANCH_TOKENS for t in titles)


def last_index(seq: list[int], tok: int) -> int:
    return len(seq) - 1 - seq[::-1].index(tok)


def _inside_title(history: list[int], sp: Specials) -> bool:
    """After a <|title|> with no <|/title|> since."""
    for tok in reversed(history):
        if tok == sp.end_title:
            return False
        if tok == sp.title:
            return True
    return False


def titles_of(history: list[int], sp: Specials) -> list[list[int]]:
    """Token lists of the titles of the current plan (after the last <|/para|>), de-duplicated."""
    start = last_index(history, sp.end_para) + 1 if sp.end_para in history else 0
    out, cur = [], None
    for tok in history[start:]:
        if tok == sp.title:
            cur = []
        elif tok == sp.end_title and cur is not None:
            if cur and cur not in out:
                out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(tok)
    return out

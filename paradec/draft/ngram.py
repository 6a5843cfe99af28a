"""Prompt lookup: propose what followed the last occurrence of the current suffix. No model.

Deterministic, so each proposed token is a point-mass draft (q = one-hot) for sampling
acceptance. Up to ``branches`` distinct continuations (from the most recent matches) form a
small tree. With ``per_match``, a branch is ``per_match`` tokens per matched suffix token (at
most ``num_draft``): a longer match is a surer one, so it drafts further; without it, every
branch is ``num_draft`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paradec.config import MAX_TREE_NODES
from paradec.errors import ParadecError
from paradec.options import option
from paradec.tree.proposal import DraftTree

# Prompt lookup's chain by weight format: (tokens per matched suffix token, most tokens). A longer
# suffix match is a surer one, so a 1-token match drafts little and a 4-token one the most. A bf16
# pass verifies up to 8 tokens for about the price of an `ar` step (2-core CPU, benchmarks/pass_cost.py:
# 1.16x at 8 rows, 1.54x at 16); the packed int8/int4 kernels' cost grows with the rows (1.13-1.25x at
# 4, 1.7-1.9x at 8), so there 1 token per matched token, at most 4. Replayed on SmolLM2's own answers
# to 105 Spec-Bench prompts (benchmarks/pld_replay.py), 4 x match length up to 16 commits 9 % more
# tokens per unit of pass cost than the fixed 8 it replaced in bf16 (2.33x vs 2.13x `ar`), and the
# same as the fixed 3 it replaced in int4 (1.59x vs 1.58x). A fixed table, not a measurement at load,
# so a seed fixes sampled output. ``--num-draft N`` drafts exactly N instead. eagle+ngram's lookup
# chain (on a match of 2+ tokens) follows the same table. "gguf" is llama.cpp's runtime, whose passes
# grow like the packed kernels' (2 / 4 tokens: 1.5x / 2.3x one token on the AVX-512 Xeon).
PLD_DRAFT = {"none": (4, 16), "int8": (1, 4), "int4": (1, 4), "gguf": (1, 4)}


@dataclass(frozen=True)
class LookupOptions:
    """Prompt lookup's options (pld; merged into specinfer's and eagle's trees with ``with_ngram``)."""

    with_ngram: bool = option(False, "specinfer, eagle: prompt lookup too (merged into the tree; eagle: on a match)")
    max_ngram: int = option(4, "prompt lookup: longest suffix to match", flag="--ngram")
    num_draft: int | None = option(
        None,
        "prompt lookup: exactly this many tokens per branch (default: by the matched suffix's length, "
        + ", ".join(f"{per} a matched token up to {most} for {q}" for q, (per, most) in PLD_DRAFT.items())
        + ")",
    )
    ngram_branches: int = option(1, "prompt lookup: distinct continuations")

    def __post_init__(self) -> None:
        draft = max(most for _, most in PLD_DRAFT.values()) if self.num_draft is None else self.num_draft
        if draft > MAX_TREE_NODES or self.ngram_branches * draft > MAX_TREE_NODES:
            raise ParadecError(f"num_draft x ngram_branches must be <= {MAX_TREE_NODES}")
        if self.max_ngram < 1 or draft < 1 or self.ngram_branches < 1:
            raise ParadecError("ngram, num_draft and ngram_branches must be >= 1")


MAX_INDEXED = 256  # token lists a lookup keeps (an index each, once seen twice); then it starts over


class SuffixIndex:
    """Where every n-gram (n <= ``max_ngram``) of a growing token list ends, brought up to date
    at each lookup: the lookup reads its last n tokens' entry, not the whole text (numpy's scan of
    a 300-token context took ~130 us a step between passes, most of it the list's conversion)."""

    def __init__(self, tokens: list[int], max_ngram: int) -> None:
        self.tokens = tokens  # the list itself: a row's tokens, which only grow
        self.ends: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_ngram)]  # [n - 1]: n-gram -> ends
        self.size = 0  # positions 0 .. size - 1 are indexed
        self.last = -1  # the token at size - 1 when it was indexed (a list changed under it: start over)

    def _reset(self) -> None:
        self.ends = [{} for _ in self.ends]
        self.size, self.last = 0, -1

    def longest(self, min_ngram: int) -> tuple[int, list[int]]:
        """-> (n, the positions before the last where the last n tokens end, ascending), n the
        longest such suffix of at least ``min_ngram`` tokens; (0, []) where none occurs."""
        t = self.tokens
        if self.size > len(t) - 1 or (self.size and t[self.size - 1] != self.last):
            self._reset()
        for i in range(self.size, len(t) - 1):  # the last token is the query's, never a match's end
            for n in range(1, min(len(self.ends), i + 1) + 1):
                self.ends[n - 1].setdefault(tuple(t[i - n + 1 : i + 1]), []).append(i)
        self.size = max(self.size, len(t) - 1)
        self.last = t[self.size - 1] if self.size else -1
        for n in range(min(len(self.ends), len(t) - 1), min_ngram - 1, -1):
            ends = self.ends[n - 1].get(tuple(t[len(t) - n :]))
            if ends:
                return n, ends
        return 0, []


class NgramDrafter:
    def __init__(
        self,
        max_ngram: int = 3,
        num_draft: int = 8,
        branches: int = 1,
        min_ngram: int = 1,
        per_match: int | None = None,
    ) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_draft, self.branches, self.per_match = num_draft, branches, per_match
        self.matched = 0  # the suffix length the last lookup matched (0: none)
        self._indexes: dict[int, tuple[list[int], SuffixIndex | None]] = {}  # id(list) -> (it, its index)

    @property
    def max_nodes(self) -> int:
        return self.num_draft * self.branches

    def continuations(self, tokens: list[int]) -> list[list[int]]:
        """Distinct continuations of the longest suffix (<= max_ngram) seen before, newest first.
        A list seen before (a row's tokens, which only grow) is looked up in its n-gram index,
        kept up to date (``SuffixIndex``); a list seen once, by a scan of it."""
        seen = self._indexes.get(id(tokens))
        if seen is not None and seen[0] is tokens:
            index = seen[1] or SuffixIndex(tokens, self.max_ngram)
            if seen[1] is None:
                self._indexes[id(tokens)] = (tokens, index)
            return self._found(tokens, *index.longest(self.min_ngram))
        if len(self._indexes) >= MAX_INDEXED:
            self._indexes.clear()
        self._indexes[id(tokens)] = (tokens, None)  # (holding the list: its id is not reused meanwhile)
        return self._scan(tokens)

    def _found(self, tokens: list[int], n: int, ends: list[int]) -> list[list[int]]:
        """The distinct continuations after ``ends`` (where the ``n`` last tokens occur, in order)."""
        found: list[list[int]] = []
        length = self.num_draft if self.per_match is None else min(self.num_draft, self.per_match * n)
        for end in reversed(ends):  # newest first
            cont = tokens[end + 1 : end + 1 + length]
            if cont not in found:
                found.append(cont)
                if len(found) == self.branches:
                    break
        self.matched = n
        return found

    def _scan(self, tokens: list[int]) -> list[list[int]]:
        arr = np.asarray(tokens, dtype=np.int64)
        # where an earlier token equals the last one: every match of a suffix ends at one of these
        ends = np.flatnonzero(arr[:-1] == arr[-1])
        longest = min(self.max_ngram, len(arr) - 1)
        if len(ends) == 0 or longest < self.min_ngram:
            self.matched = 0
            return []
        # how far each match reaches back: the suffix's k-th token from the end matches for k < reach
        back = ends[:, None] - np.arange(longest)  # [matches, longest]
        same = (back >= 0) & (arr[np.maximum(back, 0)] == arr[-1 - np.arange(longest)])
        reach = same.cumprod(axis=1).sum(axis=1)  # [matches]
        n = int(reach.max())  # the longest suffix seen before (each match has a continuation)
        if n < self.min_ngram:
            self.matched = 0
            return []
        return self._found(tokens, n, ends[reach >= n].tolist())

    def propose(self, tokens: list[int]) -> DraftTree:
        """``tokens`` = prompt + generated so far (the last one is the root)."""
        out = DraftTree([tokens[-1]], [-1], [None])
        for cont in self.continuations(tokens):
            parent = 0
            for tok in cont:
                out.tokens.append(tok)
                out.parents.append(parent)
                out.q.append(None)
                parent = len(out.tokens) - 1
        return out

"""Prompt lookup: propose what followed the last occurrence of the current suffix. No model.

Deterministic, so each proposed token is a point-mass draft (q = one-hot) for sampling
acceptance. Up to ``branches`` distinct continuations (from the most recent matches) form a
small tree. With ``per_match``, a branch is ``per_match`` tokens per matched suffix token (at
most ``num_draft``): a longer match is a surer one, so it drafts further; without it, every
branch is ``num_draft`` tokens.
"""

from __future__ import annotations

import numpy as np

from paradec.tree.proposal import DraftTree


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

    @property
    def max_nodes(self) -> int:
        return self.num_draft * self.branches

    def continuations(self, tokens: list[int]) -> list[list[int]]:
        """Distinct continuations of the longest suffix (<= max_ngram) seen before, newest first."""
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, len(arr) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # all but the suffix itself
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            found: list[list[int]] = []
            length = self.num_draft if self.per_match is None else min(self.num_draft, self.per_match * n)
            for start in hits[::-1]:
                cont = arr[start + n : start + n + length].tolist()
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) == self.branches:
                        break
            if found:
                self.matched = n
                return found
        self.matched = 0
        return []

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

"""A drafter of controlled acceptance, for benchmarks: it knows the target's greedy continuation.

At every level of an expansion tree, below a node on the true path, the true next token sits at
rank j (of k children) with probability alpha * (1 - alpha) ** (j - 1), else nowhere; every
other child is a wrong token. So a chain accepts each token with probability alpha and k
children cover 1 - (1 - alpha) ** k. It costs nothing to run: the speedup it gives is the
mechanism's ceiling for that acceptance on this machine.
"""

from __future__ import annotations

import random

from paradec.config import expansion_nodes
from paradec.draft.base import DrafterHooks, DraftTree, Proposal, merge


class OracleDrafter(DrafterHooks):
    def __init__(
        self, references: list[list[int]], expansion: tuple[int, ...], alpha: float, vocab_size: int, seed: int = 0
    ) -> None:
        self.references = references  # [batch] prompt + greedy continuation of each row
        self.expansion, self.alpha, self.vocab = tuple(expansion), alpha, vocab_size
        self.rng = random.Random(seed)

    @property
    def max_nodes(self) -> int:
        return expansion_nodes(self.expansion)

    def begin(self, prompts: list[list[int]], max_len: int, features=None) -> None:
        pass

    def commit(self, row: int, accepted: list[int], bonus: int, hidden=None) -> None:
        pass

    def _true(self, row: int, pos: int) -> int | None:
        ref = self.references[row]
        return ref[pos] if pos < len(ref) else None

    def propose(self, sequences: list[list[int]], generators) -> list[Proposal]:
        out = []
        for b, seq in enumerate(sequences):
            draft = DraftTree([seq[-1]], [-1], [None])
            frontier = [(0, True)]  # (draft node, on the true path)
            for depth, k in enumerate(self.expansion):
                truth = self._true(b, len(seq) + depth)
                nxt = []
                for node, on_path in frontier:
                    rank = next((j for j in range(k) if self.rng.random() < self.alpha), None)
                    for j in range(k):
                        right = on_path and truth is not None and j == rank
                        tok = truth if right else ((truth or 0) + 1 + j + 7 * depth) % self.vocab
                        if not right and tok == truth:
                            tok = (tok + 1) % self.vocab
                        draft.tokens.append(tok)
                        draft.parents.append(node)
                        draft.q.append(None)
                        nxt.append((len(draft.tokens) - 1, right))
                frontier = nxt
            out.append(merge(seq[-1], [draft]))
        return out

"""Drafters propose token trees; ``TreeDrafter`` merges several (SSMs + prompt lookup) into one."""

from __future__ import annotations

from typing import Protocol

import torch

from paradec.draft.base import DrafterHooks, DraftTree, Draw, Proposal, merge
from paradec.draft.datastore import DatastoreLookup
from paradec.draft.heads import HeadDrafter
from paradec.draft.model import ModelDrafter
from paradec.draft.ngram import NgramDrafter
from paradec.state import Split, StepReport

__all__ = [
    "DraftTree",
    "Draw",
    "Drafter",
    "DrafterHooks",
    "HeadDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "TreeDrafter",
    "merge",
]


class Drafter(Protocol):
    """What the engine's loop asks of a drafter, every call typed; no optional attributes
    (``DrafterHooks`` gives the optional steps as no-ops).

    Per step: ``propose`` -> ``split`` (a pruned pass, or a full one) -> the target verifies ->
    ``commit`` per row -> ``observe`` the step.
    """

    @property
    def max_nodes(self) -> int: ...  # the most tree nodes one row's proposal may have (KV scratch)

    @property
    def sizes_own_trees(self) -> bool: ...  # a cost model sizes its trees: the batch budget does not cut them

    # features [rows, width, hidden]: the target's final normed hidden states of each prompt's
    # tokens but the root, from its prefill (None for 1-token prompts); EAGLE's head reads them
    def begin(self, prompts: list[list[int]], max_len: int, features: torch.Tensor | None = None) -> None: ...

    def propose(self, sequences: list[list[int]], generators: list[torch.Generator | None]) -> list[Proposal]: ...

    # the split pass it asks for this step (ProPD's early pruning), or None for a full pass; the
    # pass is split only when every group in it asks for the same one
    def split(self) -> Split | None: ...

    # hidden [len(accepted) + 1, hidden]: the target's final normed hidden states at the root and
    # each accepted node (the last one's LM-head output gave ``bonus``)
    def commit(self, row: int, accepted: list[int], bonus: int, hidden: torch.Tensor | None = None) -> None: ...

    def joins(self, batch: int) -> None: ...  # before each ``propose``: the rows of the pass it joins (every group's)

    def observe(self, step: StepReport) -> None: ...  # the step's cost and the early head's recall

    # the width the draft budget verified this step (None: trees in full); drafting past it is wasted
    def set_width(self, width: int | None) -> None: ...


class RootDrafter(DrafterHooks):
    """`ar`: every step verifies the root alone."""

    max_nodes = 0

    def begin(self, prompts: list[list[int]], max_len: int, features=None) -> None:
        pass

    def propose(self, sequences: list[list[int]], generators) -> list[Proposal]:
        return [Proposal.root_only(seq[-1]) for seq in sequences]

    def commit(self, row: int, accepted: list[int], bonus: int, hidden: torch.Tensor | None = None) -> None:
        pass


class TreeDrafter(DrafterHooks):
    """Runs every drafter for every row and merges their trees (trie union) per row. ``ngram``: a
    lookup, in the prompt (prompt lookup) or in a datastore (``rest``)."""

    def __init__(self, models: list[ModelDrafter], ngram: NgramDrafter | DatastoreLookup | None) -> None:
        self.models, self.ngram = models, ngram

    @property
    def max_nodes(self) -> int:
        return sum(m.max_nodes for m in self.models) + (self.ngram.max_nodes if self.ngram else 0)

    def begin(self, prompts: list[list[int]], max_len: int, features=None) -> None:
        for m in self.models:
            m.begin(prompts, max_len)

    def propose(self, sequences: list[list[int]], generators: list[torch.Generator | None]) -> list[Proposal]:
        """``sequences[b]``: row b's tokens so far (the last one is the root)."""
        per_model = [m.propose(generators) for m in self.models]
        out = []
        for b, seq in enumerate(sequences):
            drafts = [trees[b] for trees in per_model]
            if self.ngram is not None:
                drafts.append(self.ngram.propose(seq))
            out.append(merge(seq[-1], drafts))
        return out

    def commit(self, row: int, accepted: list[int], bonus: int, hidden=None) -> None:
        for m in self.models:
            m.commit(row, accepted, bonus)

    def set_width(self, width: int | None) -> None:
        for m in self.models:
            m.width = width

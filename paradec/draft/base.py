"""What drafters hand the verifier lives below both: ``paradec.tree.proposal``."""

from paradec.tree.proposal import DraftTree, Draw, Proposal, merge

__all__ = ["DrafterHooks", "DraftTree", "Draw", "Proposal", "merge"]


class DrafterHooks:
    """No-op policy hooks for drafters that keep no cost model (everything but ProPD's)."""

    prune_next = True
    # the nodes per row (root included) the draft budget last verified (``policy.budget``); None: every
    # tree in full. A drafter may draft little past it (one node more, so the budget can widen)
    width: int | None = None

    def set_width(self, width: int | None) -> None:
        self.width = width

    def observe_recall(self, hit: bool) -> None:
        pass

    def step_done(self, batch: int, drafted: int, verified: int, seconds: float, pruned: bool = False) -> None:
        pass

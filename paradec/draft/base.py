"""What drafters hand the verifier lives below both: ``paradec.tree.proposal``."""

from paradec.tree.proposal import DraftTree, Draw, Proposal, merge

__all__ = ["DrafterHooks", "DraftTree", "Draw", "Proposal", "merge"]


class DrafterHooks:
    """No-op policy hooks for drafters that keep no cost model (everything but ProPD's)."""

    prune_next = True

    def observe_recall(self, hit: bool) -> None:
        pass

    def step_done(self, batch: int, drafted: int, verified: int, seconds: float, pruned: bool = False) -> None:
        pass

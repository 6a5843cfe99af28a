"""What drafters hand the verifier lives below both: ``paradec.tree.proposal``."""

from paradec.state import Split, StepReport
from paradec.tree.proposal import DraftTree, Draw, Proposal, merge

__all__ = ["DrafterHooks", "DraftTree", "Draw", "Proposal", "merge"]


class DrafterHooks:
    """The optional steps of a drafter, as no-ops: it sizes no tree of its own, asks for no split
    pass and learns nothing from a step (everything but ProPD's, EAGLE's cost model and auto)."""

    # whether it sizes its trees itself (a cost model): the batch budget then does not cut them
    sizes_own_trees = False
    # the nodes per row (root included) the draft budget last verified (``policy.budget``); None: every
    # tree in full. A drafter may draft little past it (one node more, so the budget can widen)
    width: int | None = None

    def set_width(self, width: int | None) -> None:
        self.width = width

    def split(self) -> Split | None:
        return None

    def observe(self, step: StepReport) -> None:
        pass

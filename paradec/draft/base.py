"""What drafters hand the verifier lives below both: ``paradec.tree.proposal``."""

from dataclasses import dataclass

from paradec.config import MAX_TREE_NODES
from paradec.errors import ParadecError
from paradec.options import option
from paradec.state import Split, StepReport
from paradec.tree.proposal import DraftTree, Draw, Proposal, merge

__all__ = ["DrafterHooks", "DraftTree", "Draw", "Proposal", "TreeOptions", "merge"]

# Medusa's static tree size when the heads do not say what they were tuned for
DEFAULT_TREE_NODES = 16
# EAGLE-2's verified nodes (its m): on a 2-core CPU in bf16 a 9-row pass costs ~1.2 `ar` steps and a
# 17-row one ~1.5, and the top 8 by draft confidence hold most of what the tree gets accepted (SmolLM2,
# Spec-Bench: m = 8 1.18x `ar`, m = 16 1.06x; benchmarks/README.md). EAGLE-2 uses 60 on a GPU.
EAGLE_TREE_NODES = 8


@dataclass(frozen=True)
class TreeOptions:
    """A tree of a fixed size, or one a cost model sizes each step (ProPD's, EAGLE's)."""

    tree_nodes: int | None = option(
        None,
        f"medusa: static tree size (default: the heads' own, else {DEFAULT_TREE_NODES}); eagle: nodes "
        f"verified (default {EAGLE_TREE_NODES}); auto: the most of either it verifies",
    )
    dynamic: bool = option(
        False,
        "propd, eagle+propd: a fixed tree size instead of the cost model's (ablation)",
        flag="--static-tree",
        sets=False,
    )

    def __post_init__(self) -> None:
        if self.tree_nodes is not None and not 0 <= self.tree_nodes <= MAX_TREE_NODES:
            raise ParadecError(f"tree_nodes must be in [0, {MAX_TREE_NODES}], got {self.tree_nodes}")


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

    def joins(self, batch: int) -> None:
        """Before each ``propose``: the pass its proposals join has ``batch`` rows (every group's)."""

    def observe(self, step: StepReport) -> None:
        pass

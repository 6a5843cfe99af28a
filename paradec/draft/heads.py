"""Medusa-style drafting: heads on the target's last hidden state propose a rank-path tree.

After each verification pass the engine hands over the final hidden states of the accepted
path; the heads read the last accepted node's (whose LM-head argmax is the bonus, i.e. the next root). Head k's top-R
guesses fill depth k+1 of the next tree; which (depth, rank) paths are used comes from the
``TreePolicy`` (a fixed size for Medusa, a size chosen each step for ProPD). With
``step_scores`` (a ProPD option) a guess scores what the policy's calibration says a head
probability like this step's is worth, so each row gets its own tree; otherwise it scores its
rank's average acceptance. The first step after prefill has no hidden state yet and verifies
the root alone.

Children are deterministic guesses, proposed as point masses (q = None): greedy acceptance
is exact, and so is multi-step speculative sampling (on rejection it removes the guess from p).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from paradec.config import MAX_TREE_NODES
from paradec.draft.base import DrafterHooks
from paradec.errors import ParadecError
from paradec.models.heads import Heads
from paradec.options import option
from paradec.policy import Calibration, TreePolicy
from paradec.state import Split, StepReport
from paradec.tree.proposal import DraftTree, Proposal, merge


@dataclass(frozen=True)
class PruneOptions:
    """ProPD's early pruning inside the verification pass, and how its tree's nodes are scored."""

    prune: bool = option(False, "propd: switch early pruning off (ablation)", flag="--no-prune", sets=False)
    prune_topk: int = option(8, "propd: keep a node iff its token is in its parent's early-head top-k")
    step_scores: bool = option(
        False,
        "propd: score tree nodes by this step's head probabilities (calibrated online), not average rank "
        "acceptance; a tree per row",
    )

    def __post_init__(self) -> None:
        if self.prune_topk < 1:
            raise ParadecError(f"prune_topk must be >= 1, got {self.prune_topk}")

    def needs(self) -> tuple[str, ...]:
        """What these options need loaded besides the method's own needs."""
        return ("early_head",) if self.prune else ()


class HeadDrafter(DrafterHooks):
    """``split``: the early-pruned pass it asks for where its policy says pruning pays (ProPD);
    ``sizes_own_trees``: the policy sizes the tree each step (the batch budget does not cut it)."""

    def __init__(
        self,
        heads: Heads,
        lm_head: Callable[[torch.Tensor], torch.Tensor],
        policy: TreePolicy,
        max_rank: int = 8,
        step_scores: bool = False,
        split: Split | None = None,
        sizes_own_trees: bool = False,
    ) -> None:
        self.heads, self.lm_head, self.policy = heads, lm_head, policy
        self.pruned, self.sizes_own_trees = split, sizes_own_trees
        self.max_rank = max_rank
        self.hidden: list[torch.Tensor | None] = []
        self.guesses: list[list[list[int]] | None] = []  # [row][depth][rank] of the last proposal
        self.head_probs: list[list[list[float]] | None] = []  # [row][depth][rank] their probabilities
        self.max_depth = len(heads.medusa.blocks)
        self.step_scores = step_scores
        self.width: int | None = None  # the draft budget's last verified width (a static tree is cut to it)
        if step_scores and policy.calibration is None:
            policy.calibration = Calibration(self.max_depth)

    @property
    def max_nodes(self) -> int:
        return MAX_TREE_NODES + 1  # the root + the largest tree the policy may pick

    def begin(self, prompts: list[list[int]], max_len: int, features=None) -> None:
        self.hidden = [None] * len(prompts)
        self.guesses = [None] * len(prompts)
        self.head_probs = [None] * len(prompts)

    def propose(self, sequences: list[list[int]], generators) -> list[Proposal]:
        live = [b for b, h in enumerate(self.hidden) if h is not None]
        out = [Proposal.root_only(seq[-1]) for seq in sequences]
        self.guesses = [None] * len(sequences)
        self.head_probs = [None] * len(sequences)
        if not live:
            return out
        depth = None  # heads to run: all, or as deep as the draft budget's last width (+1) reaches
        if not self.step_scores:  # the tree does not depend on this step's heads: size it first
            n = self.policy.choose(len(sequences))
            if self.policy.static_nodes is not None and self.width is not None:
                n = depth = min(n, self.width)  # a static tree the budget cuts: its top-n paths, n heads at most
            if n == 0:
                return out
        hn = torch.stack([self.hidden[b] for b in live])  # [live, hidden]
        with torch.inference_mode():
            logits = self.heads.medusa(hn, self.lm_head, depth)  # [live, heads, vocab]
            # every head's top-R, also past this tree's depth: the online statistics need them
            if self.step_scores:
                top = logits.float().softmax(-1).topk(self.max_rank, dim=-1)
                probs = top.values.tolist()
                top = top.indices.tolist()  # host sync: trees are built on the host
            else:
                top = logits.topk(self.max_rank, dim=-1).indices.tolist()
        if self.step_scores:
            for i, b in enumerate(live):
                self.head_probs[b] = probs[i]
            cal = self.policy.calibration
            n = self.policy.choose(len(sequences), {b: cal.scores(probs[i]) for i, b in enumerate(live)})
        for i, b in enumerate(live):
            guesses = top[i]
            self.guesses[b] = guesses
            paths = self.policy.paths(n, b)
            if not paths:
                continue
            draft = DraftTree([sequences[b][-1]], [-1], [None])
            node_of = {(): 0}
            for path in paths:
                draft.tokens.append(guesses[len(path) - 1][path[-1]])
                draft.parents.append(node_of[path[:-1]])
                draft.q.append(None)
                node_of[path] = len(draft.tokens) - 1
            out[b] = merge(sequences[b][-1], [draft])
        return out

    def commit(self, row: int, accepted: list[int], bonus: int, hidden: torch.Tensor | None = None) -> None:
        """Record where the target's tokens ranked among the heads' guesses, keep ``hidden``."""
        guesses, probs = self.guesses[row], self.head_probs[row]
        if guesses is not None:
            actual = accepted + [bonus]
            for d in range(min(len(actual), len(guesses))):
                row_guesses = guesses[d]
                self.policy.stats.observe(d, row_guesses.index(actual[d]) if actual[d] in row_guesses else None)
                if probs is not None:
                    self.policy.calibration.observe(d, probs[d], [g == actual[d] for g in row_guesses])
        self.hidden[row] = None if hidden is None else hidden[-1]  # the last accepted node's

    def split(self) -> Split | None:
        """The early-pruned pass, where the policy wants the next verification pass pruned."""
        return self.pruned if self.pruned is not None and self.policy.prune_next else None

    def observe(self, step: StepReport) -> None:
        """The early head's recall on this step's rows, and the step's wall time for ``batch`` rows
        padded to ``drafted`` tree nodes, ``verified`` of which survived pruning into the upper
        layers."""
        for hit in step.recall:
            self.policy.observe_recall(hit)
        self.policy.observe_step(step.batch, step.drafted, step.verified, step.seconds, step.pruned)

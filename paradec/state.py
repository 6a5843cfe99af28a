"""Typed records of a decode: per-row state, per-step events, and what a prompt's decode cost."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paradec.tree.proposal import Proposal


@dataclass
class Stats:
    """What one prompt's decode cost. tau = new_tokens / steps (AR: 1.0)."""

    method: str
    new_tokens: int = 0
    steps: int = 0  # target forward passes after prefill
    prefill_s: float = 0.0
    wall_s: float = 0.0  # prefill included
    target_s: float = 0.0  # time in the target's verification passes (shared by a batch's rows)
    nodes: int = 0  # tree nodes proposed, summed over steps (AR: one per step)
    verified: int = 0  # nodes that reached the last layer (fewer than ``nodes`` when pruning)
    extra: dict = field(default_factory=dict)  # method-specific counters (aspd: parallel steps, ...)
    offered: list[int] = field(default_factory=list)  # [depth-1] steps whose tree reached depth d
    reached: list[int] = field(default_factory=list)  # [depth-1] steps that accepted a token at depth d
    drafters: dict[str, int] = field(default_factory=dict)  # auto: steps each drafter proposed ("ar": none)

    def record(self, tree_depth: int, accepted: int) -> None:
        for counts, n in ((self.offered, tree_depth), (self.reached, accepted)):
            counts.extend([0] * (n - len(counts)))
            for d in range(n):
                counts[d] += 1

    @property
    def accept_per_depth(self) -> list[float]:
        """[depth-1] P(a token is accepted at depth d | the tree offered depth d)."""
        return [r / o for r, o in zip(self.reached + [0] * len(self.offered), self.offered) if o]

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "tau": round(self.tau, 4),
            "prefill_s": round(self.prefill_s, 5),
            "wall_s": round(self.wall_s, 5),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "target_s": round(self.target_s, 5),
            "nodes_per_step": round(self.nodes / max(1, self.steps), 3),
            "verified_per_step": round(self.verified / max(1, self.steps), 3),
            "accept_per_depth": [round(a, 4) for a in self.accept_per_depth],
            **({"drafters": dict(self.drafters)} if self.drafters else {}),
            **self.extra,
        }


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # new tokens only (EOS included when it ended the text)
    finish_reason: str  # "eos" | "stop" | "length"
    stats: Stats

    def as_dict(self) -> dict:
        return {
            **self.stats.as_dict(),
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
        }


@dataclass
class Row:
    """Per-sequence decode state. ``tokens[-1]`` is the root: generated, not yet in the cache."""

    tokens: list[int]
    n_prompt: int
    generator: torch.Generator | None
    stats: Stats
    done: bool = False
    finish_reason: str = "length"
    budget: int = 0  # new tokens still allowed

    @property
    def new_ids(self) -> list[int]:
        return self.tokens[self.n_prompt :]

    def finish(self, reason: str) -> None:
        """End the row ("eos" | "stop" | "length"); the scheduler decodes it no further."""
        self.done, self.finish_reason = True, reason


@dataclass(frozen=True)
class StepEvent:
    row: int
    token_ids: list[int]  # tokens committed this step for this row
    accepted: int = 0  # how many of them were draft tokens (the rest: the target's bonus token)
    drafted: int = 0  # draft nodes proposed for this row past the root (0: a plain `ar` step)
    depth: int = 0  # the verified tree's depth
    drafter: str = ""  # which drafter proposed them (auto: the one it chose; else the method)
    step: int = 0  # the row's target passes so far, this one included


@dataclass(frozen=True)
class Split:
    """A verification pass split at an early layer (ProPD): layers [0, layer) run on the whole
    tree, a node whose token is not in its parent's ``early`` top-``topk`` is dropped, and the
    upper layers run on the survivors (``verify.prune.pruned_pass``)."""

    early: torch.nn.Module  # models.heads.EarlyHead: layer ``layer``'s hidden -> logits through the LM head
    layer: int
    topk: int


@dataclass(frozen=True)
class StepReport:
    """What a drafter may learn from one step of its group (``Drafter.observe``), after every
    group's commit. A server's pass carries other groups' rows: ``width``, ``drafting`` and
    ``committed`` are the whole pass's, so a group prices a pass by what it was, not by its own
    rows (a group verifying its root alone beside another's 6-node trees saw a 1-wide pass take
    a 6-wide pass's time plus the other's drafting)."""

    batch: int  # rows in the pass
    drafted: int  # the widest tree the group proposed (root included)
    verified: int  # the widest tree of the group the pass verified (after cuts and pruning)
    seconds: float  # the step's wall time, proposals included
    pruned: bool  # whether the pass was split (``Split``)
    recall: tuple[bool, ...] = ()  # split passes: per row, was the target's next token in the early top-k
    width: int = 1  # the pass's widest tree (every group's): each of its ``batch`` rows is padded to it
    drafting: float = 0.0  # seconds every group spent proposing this step
    committed: int = 0  # tokens every row of the pass committed this step
    pass_s: float = 0.0  # seconds of the target pass alone (the rest: drafting, accepting, committing)


@dataclass(frozen=True)
class Verification:
    """What one target pass over the proposed trees gives the acceptance step."""

    proposals: list[Proposal]  # as verified (pruning may have dropped nodes)
    logits: torch.Tensor  # [batch, width, vocab]
    hidden: torch.Tensor | None  # [batch, width, hidden] final-normed (None: a runtime that gives logits only)
    slot_maps: list[list[int]] | None = None  # per row, each verified node's scratch slot (None: node i = slot i)
    early_top: list[dict[int, list[int]]] | None = None  # pruned passes: per row {scratch slot: early top-k}

    def slot(self, row: int, node: int) -> int:
        return node if self.slot_maps is None else self.slot_maps[row][node]

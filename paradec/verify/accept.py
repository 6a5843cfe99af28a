"""Tree acceptance rules. A root-only tree is plain autoregressive decoding.

Every rule returns a ``Verdict``: the accepted path as tree node indices (always starting with
the root, 0) and the bonus token the target adds after it, so a step commits
``len(nodes)`` K/V rows and ``len(nodes)`` new tokens (accepted draft tokens + bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradec.config import SamplingConfig
from paradec.sampling import next_token
from paradec.tree import TokenTree


@dataclass(frozen=True)
class Verdict:
    nodes: list[int]  # accepted path, root first: [0, a1, a2, ...]
    bonus: int  # the target's token after the last accepted node

    @property
    def new_tokens(self) -> int:
        return len(self.nodes)


def accept_greedy(tree: TokenTree, target_next: list[int]) -> Verdict:
    """Longest root-to-node path whose every token is the target's argmax at its parent.

    ``target_next[i]`` is the target's argmax after node i. Example: tokens [r, a, b],
    parents [-1, 0, 1], target_next [a, x, y] -> nodes [0, 1], bonus x.
    """
    kids = tree.children()
    node, nodes = 0, [0]
    while True:
        want = target_next[node]
        nxt = next((c for c in kids[node] if tree.tokens[c] == want), None)
        if nxt is None:
            return Verdict(nodes, want)
        node = nxt
        nodes.append(node)


def accept_sampled(tree: TokenTree, logits: torch.Tensor, cfg: SamplingConfig,
                   generator: torch.Generator | None) -> Verdict:
    """Sampling acceptance for a root-only tree: draw the bonus from the warped target p.

    logits: [nodes, vocab]. Draft trees with sampling go through multi-step speculative
    sampling, which needs the draft's q (``paradec.verify.mss``).
    """
    if len(tree) != 1:
        raise ValueError("accept_sampled takes root-only trees; use multi-step speculative sampling")
    return Verdict([0], int(next_token(logits[:1], cfg, generator)[0]))

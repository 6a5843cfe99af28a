"""Tree acceptance rules. A root-only tree is plain autoregressive decoding.

Every rule returns a ``Verdict``: the accepted path as tree node indices (always starting with
the root, 0) and the bonus token the target adds after it, so a step commits
``len(nodes)`` K/V rows and ``len(nodes)`` new tokens (accepted draft tokens + bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

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

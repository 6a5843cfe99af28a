"""What drafters hand the verifier: a token tree plus, per node, the candidates drawn under it.

Each drafter proposes a ``DraftTree`` rooted at the current root; ``merge`` takes their trie
union into one ``Proposal``. The tree deduplicates equal (parent, token) pairs — one K/V row
per distinct sequence — while ``draws`` keeps every draw with its multiplicity and the
distribution q it came from, which multi-step speculative sampling needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradec.tree.tree import TokenTree


@dataclass
class DraftTree:
    tokens: list[int]  # [nodes] node 0 = the root
    parents: list[int]  # [nodes] parents[0] = -1
    q: list[torch.Tensor | None]  # [nodes] q [vocab] the node was drawn from at its parent; None = point mass


@dataclass(frozen=True)
class Draw:
    child: int  # proposal-tree index of the drawn token
    q: torch.Tensor | None  # [vocab] the distribution it was drawn from; None = deterministic


@dataclass
class Proposal:
    tree: TokenTree
    draws: list[list[Draw]]  # [nodes] candidates under each node, in the order proposed
    source: str = ""  # the drafter that proposed it, where a method chooses among several (auto)
    # [nodes] committed tokens expected if the tree is cut to its first w nodes (w = 1..nodes), where
    # the drafter priced its own tree (auto): the batch budget then picks the pass's width from them
    gains: list[float] | None = None

    @staticmethod
    def root_only(root: int) -> Proposal:
        return Proposal(TokenTree.root_only(root), [[]])

    @staticmethod
    def chain(root: int, tokens: list[int]) -> Proposal:
        """``root`` then ``tokens``, each a point mass under the one before (``merge`` of one chain)."""
        draws = [[Draw(n, None)] for n in range(1, len(tokens) + 1)]
        return Proposal(TokenTree.chain(root, tokens), [*draws, []])

    def cut(self, nodes: int) -> Proposal:
        """The first ``nodes`` nodes (parents come first, so a prefix is a tree) and their draws."""
        tree = TokenTree(self.tree.tokens[:nodes], self.tree.parents[:nodes])
        draws = [[d for d in draws if d.child < nodes] for draws in self.draws[:nodes]]
        return Proposal(tree, draws, self.source, None if self.gains is None else self.gains[:nodes])


def merge(root: int, drafts: list[DraftTree]) -> Proposal:
    """Trie union of ``drafts`` (all rooted at ``root``) in one tree, parents before children.

    Example: drafts a->b and a->c, a->b->d merge to root->a->{b->d, c}; ``draws`` under
    a list b twice (once per draft), c once.
    """
    tokens, parents = [root], [-1]
    draws: list[list[Draw]] = [[]]
    index: dict[tuple[int, int], int] = {}
    for draft in drafts:
        where = [0] * len(draft.tokens)  # draft node -> proposal node
        for i in range(1, len(draft.tokens)):
            parent = where[draft.parents[i]]
            key = (parent, draft.tokens[i])
            node = index.get(key)
            if node is None:
                node = index[key] = len(tokens)
                tokens.append(draft.tokens[i])
                parents.append(parent)
                draws.append([])
            draws[parent].append(Draw(node, draft.q[i]))
            where[i] = node
    return Proposal(TokenTree(tuple(tokens), tuple(parents)), draws)

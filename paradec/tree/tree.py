"""A token tree is tokens + parents; masks, depths, positions and paths are derived from them.

Node 0 is the root: the last token of the sequence so far, whose K/V is not yet in the cache.
Nodes are in topological order (a parent always comes before its children), so one forward
pass over ``tokens`` with the ancestor mask computes every node's next-token logits, and a
root-only tree is plain autoregressive decoding.

Example: tokens [r, a, b, c], parents [-1, 0, 0, 1] is the tree r -> a -> c, r -> b;
depths [0, 1, 1, 2]; paths [[0, 1, 3], [0, 2]].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenTree:
    tokens: tuple[int, ...]  # [nodes] token ids; tokens[0] = root
    parents: tuple[int, ...]  # [nodes] parent index; parents[0] = -1

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or not self.tokens or self.parents[0] != -1:
            raise ValueError("a tree needs tokens and parents of equal length, node 0 the root")
        if any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"parents must point to earlier nodes: {self.parents}")

    @staticmethod
    def root_only(token: int) -> "TokenTree":
        return TokenTree((token,), (-1,))

    @staticmethod
    def chain(root: int, tokens: list[int]) -> "TokenTree":
        return TokenTree((root, *tokens), tuple(range(-1, len(tokens))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        """[nodes] distance from the root (root = 0)."""
        out = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            out[i] = out[self.parents[i]] + 1
        return out

    def children(self) -> list[list[int]]:
        """[nodes] list of child indices, in node order."""
        out: list[list[int]] = [[] for _ in self.parents]
        for i in range(1, len(self.parents)):
            out[self.parents[i]].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices root-to-``node``, inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaf_paths(self) -> list[list[int]]:
        kids = self.children()
        return [self.path_to(i) for i in range(len(self)) if not kids[i]]

    def ancestor_mask(self) -> torch.Tensor:
        """[nodes, nodes] bool: row i is True at i and at every ancestor of i."""
        n = len(self)
        rows = [0] * n  # bitsets: a row is its parent's row plus itself
        for i in range(n):
            rows[i] = (rows[self.parents[i]] if i else 0) | (1 << i)
        bits = torch.tensor([[(r >> j) & 1 for j in range(n)] for r in rows], dtype=torch.bool)
        return bits


def positions(trees: list[TokenTree], lengths: list[int], width: int) -> torch.Tensor:
    """[batch, width] position ids: committed length + depth; padding nodes reuse the root's."""
    out = torch.empty(len(trees), width, dtype=torch.long)
    for b, (tree, length) in enumerate(zip(trees, lengths)):
        depths = tree.depths
        out[b] = length
        out[b, : len(depths)] = torch.tensor(depths) + length
    return out


def attention_mask(trees: list[TokenTree], lengths: list[int], width: int) -> torch.Tensor | None:
    """[batch, 1, width, max(lengths) + width] bool (True = may attend), or None for plain causal.

    Row b sees its committed prefix ``[0, lengths[b])`` and, among the new tokens written at
    ``lengths[b] + j``, its ancestors and itself. Padding nodes (trees narrower than ``width``)
    see only themselves. None is returned when every row is a root-only tree over an
    equal-length prefix: then attending to every slot is exactly right.
    """
    if width == 1 and len(set(lengths)) == 1:
        return None
    span = max(lengths) + width
    mask = torch.zeros(len(trees), 1, width, span, dtype=torch.bool)
    for b, (tree, length) in enumerate(zip(trees, lengths)):
        n = len(tree)
        mask[b, 0, :, :length] = True
        mask[b, 0, :n, length:length + n] = tree.ancestor_mask()
        pad = torch.arange(n, width)
        mask[b, 0, pad, length + pad] = True
        mask[b, 0, n:, :length] = False
    return mask

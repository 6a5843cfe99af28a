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

import numpy as np
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
    def root_only(token: int) -> TokenTree:
        return TokenTree.chain(token, [])

    @staticmethod
    def chain(root: int, tokens: list[int]) -> TokenTree:
        tree = object.__new__(TokenTree)  # a chain is a tree by construction: no check (`auto` builds ~3 a step)
        object.__setattr__(tree, "tokens", (root, *tokens))
        object.__setattr__(tree, "parents", tuple(range(-1, len(tokens))))
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it (a root-only tree is one)."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

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

    def ancestor_bits(self) -> list[int]:
        """[nodes] bitsets: bit j of entry i is set iff j is i or an ancestor of i."""
        return _ancestor_bits(self.parents)

    def ancestor_mask(self) -> torch.Tensor:
        """[nodes, nodes] bool: row i is True at i and at every ancestor of i."""
        return torch.from_numpy(bits_to_bool(self.ancestor_bits(), len(self)))


def _ancestor_bits(parents: list[int] | tuple[int, ...]) -> list[int]:
    rows: list[int] = []
    for i, p in enumerate(parents):
        rows.append((rows[p] if p >= 0 else 0) | (1 << i))  # parent's row plus itself
    return rows


def bits_to_bool(bitsets: list[int], n: int) -> np.ndarray:
    """Python-int bitsets -> [len(bitsets), n] bool array (bit j -> column j)."""
    nbytes = (n + 7) // 8
    buf = b"".join(b.to_bytes(nbytes, "little") for b in bitsets)
    raw = np.frombuffer(buf, dtype=np.uint8).reshape(len(bitsets), nbytes)
    return np.unpackbits(raw, axis=1, bitorder="little")[:, :n].astype(bool)


class ScratchTree:
    """One row's nodes in a cache's scratch area: node j lives in scratch slot j.

    A drafter grows it level by level (``add``), a verifier fills it from a ``TokenTree``.
    A node added with parent -1 is a root: it sees the committed prefix and itself only
    (the first token of a row, or padding that keeps every row of a batch the same width).
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.bits: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        i = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1 if parent >= 0 else 0)
        self.bits.append((self.bits[parent] if parent >= 0 else 0) | (1 << i))
        return i

    @staticmethod
    def from_tree(tree: TokenTree, width: int) -> ScratchTree:
        out = ScratchTree()
        for tok, parent in zip(tree.tokens, tree.parents):
            out.add(tok, parent)
        for _ in range(width - len(tree)):
            out.add(tree.tokens[0], -1)  # padding
        return out


def pass_tensors(
    rows: list[ScratchTree], start: int, width: int, lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Inputs of one forward over nodes [start, start + width) of every row.

    Returns tokens [batch, width], positions [batch, width] (= committed length + depth) and
    the mask [batch, 1, width, max(lengths) + start + width] (True = may attend), or None when
    every row is one root over an equal-length prefix (then every slot is visible anyway).
    Row b's query i sees its committed prefix [0, lengths[b]) and, among its scratch nodes at
    slots lengths[b] + j, itself and its ancestors.
    """
    batch = len(rows)
    tokens = torch.tensor([r.tokens[start : start + width] for r in rows], dtype=torch.long)
    pos = torch.tensor(
        [[length + d for d in r.depths[start : start + width]] for r, length in zip(rows, lengths)], dtype=torch.long
    )
    if width == 1 and start == 0 and len(set(lengths)) == 1:
        return tokens, pos, None
    n = start + width
    span = max(lengths) + n
    mask = np.zeros((batch, 1, width, span), dtype=bool)
    for b, (r, length) in enumerate(zip(rows, lengths)):
        mask[b, 0, :, :length] = True
        mask[b, 0, :, length : length + n] = bits_to_bool(r.bits[start:n], n)
    return tokens, pos, torch.from_numpy(mask)

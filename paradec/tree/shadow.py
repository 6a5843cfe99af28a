"""A draft tree scored against the tokens its row commits next, instead of by verification.

Under greedy decoding a row commits the target's own tokens, so the path they trace through a
tree drafted at that step is exactly the path greedy verification would have accepted. The
nodes a budget cut off a tree (or a whole tree a row declined) are thus scored for free, one or
a few steps later, for later steps' choices only: a cost model learns what verifying more would
have gained without padding the pass to find out. (Under sampling the same holds for a point-mass
draft, prompt lookup's chains: the committed token is the drafted one with exactly the chance that
verification would accept it.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from paradec.tree.tree import TokenTree


@dataclass(eq=False)
class Shadow:
    """``tree`` (drafted at a step whose root is the row's last token then), fed the tokens the
    row commits from that step on; ``path``: the nodes past the root they walked so far."""

    key: tuple  # whose statistics it counts in
    tree: TokenTree
    path: list[int] = field(default_factory=list)
    done: bool = False  # the walk has ended: ``path`` is the accepted path

    def __post_init__(self) -> None:
        tokens, parents = self.tree.tokens, self.tree.parents
        self._child: dict[tuple[int, int], int] = {}  # (node, token) -> its first child of that token
        for n in range(len(tokens) - 1, 0, -1):
            self._child[(parents[n], tokens[n])] = n
        self._inner = set(parents[1:])  # nodes with children
        self.done = len(tokens) == 1

    @property
    def nodes(self) -> int:
        """Nodes past the root: every one is scored (on ``path`` or not) once ``done``."""
        return len(self.tree) - 1

    def feed(self, committed: list[int]) -> bool:
        """Reads the row's newly committed tokens -> whether the walk has ended (no child of the
        last node is the next token, or it reached a leaf)."""
        node = self.path[-1] if self.path else 0
        for tok in committed:
            if self.done:
                break
            node = self._child.get((node, tok))
            if node is None:
                self.done = True
            else:
                self.path.append(node)
                self.done = node not in self._inner
        return self.done


def walk(tree: TokenTree, tokens: list[int]) -> list[int]:
    """The nodes of ``tree`` past the root that ``tokens`` walk, in order."""
    shadow = Shadow((), tree)
    shadow.feed(tokens)
    return shadow.path


def settle(
    pending: list[Shadow], committed: list[int], observe: Callable[[tuple, int, list[int]], None]
) -> list[Shadow]:
    """Feeds a row's ``committed`` tokens to its ``pending`` trees (oldest first); each one whose
    walk has ended is observed as (its key, its nodes past the root, its path) -> the ones still
    pending."""
    still = []
    for shadow in pending:
        if shadow.feed(committed):
            observe(shadow.key, shadow.nodes, shadow.path)
        else:
            still.append(shadow)
    return still

"""Token trees: tokens + parents, and everything derived from them by pure functions."""

from paradec.tree.tree import TokenTree, attention_mask, positions

__all__ = ["TokenTree", "attention_mask", "positions"]

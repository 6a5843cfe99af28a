"""Token trees: tokens + parents, and everything derived from them by pure functions."""

from paradec.tree.tree import ScratchTree, TokenTree, pass_tensors

__all__ = ["ScratchTree", "TokenTree", "pass_tensors"]

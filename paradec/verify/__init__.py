"""Acceptance: given a token tree and the target's logits at every node, which path is kept."""

from paradec.verify.accept import Verdict, accept_greedy
from paradec.verify.mss import accept_mss, accept_naive

__all__ = ["Verdict", "accept_greedy", "accept_mss", "accept_naive"]

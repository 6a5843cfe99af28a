"""Acceptance: given a token tree and the target's logits at every node, which path is kept."""

from paradec.verify.accept import Verdict, accept_greedy, accept_sampled

__all__ = ["Verdict", "accept_greedy", "accept_sampled"]

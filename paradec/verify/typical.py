"""Typical acceptance (Medusa): LOSSY. A candidate x at node u is accepted when
p(x) > min(epsilon, delta * exp(-H(p))), p the warped target at u; the most probable such child
is followed; the bonus is drawn from p where the walk stops. Faster than exact sampling at
high temperature, but the output is no longer distributed as the target's.
"""

from __future__ import annotations

import math

import torch

from paradec.config import SamplingConfig
from paradec.sampling import probs
from paradec.tree.proposal import Proposal
from paradec.verify.accept import Verdict


def accept_typical(
    proposal: Proposal,
    logits: torch.Tensor,
    cfg: SamplingConfig,
    epsilon: float,
    delta: float,
    generator: torch.Generator | None,
) -> Verdict:
    tokens, kids = proposal.tree.tokens, proposal.tree.children()
    node, nodes = 0, [0]
    while True:
        p = probs(logits[node], cfg)  # [vocab]
        entropy = float(-(p * p.clamp_min(1e-12).log()).sum())
        threshold = min(epsilon, delta * math.exp(-entropy))
        ok = [c for c in kids[node] if float(p[tokens[c]]) > threshold]
        if not ok:
            return Verdict(nodes, int(torch.multinomial(p, 1, generator=generator)))
        node = max(ok, key=lambda c: float(p[tokens[c]]))
        nodes.append(node)

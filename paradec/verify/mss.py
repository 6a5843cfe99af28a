"""Sampling acceptance over a token tree: multi-step speculative sampling (MSS) and naive sampling.

Both keep the output distributed exactly as sampling from the target p (same warping):

- MSS (SpecInfer, Algorithm 2): at node u, try the candidates drawn under u in random order;
  accept candidate x (drawn from q) with probability min(1, p(x) / q(x)); on rejection replace p
  by the normalized residual max(0, p - q) — cumulatively, across candidates — and try the next.
  If all fail, draw the bonus from the residual; at a leaf, draw it from the unmodified p.
  Exact when every candidate is an independent draw from its q (a deterministic draft is a
  point mass). Deterministic top-k children tested this way are NOT exact: use greedy.
- Naive: draw x ~ p at u; descend if x is a child, otherwise x is the bonus.
"""

from __future__ import annotations

import torch

from paradec.config import SamplingConfig
from paradec.sampling import probs
from paradec.tree.proposal import Proposal
from paradec.verify.accept import Verdict


def _draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=generator))


def accept_mss(
    proposal: Proposal, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """logits: [nodes, vocab] target logits at every node of ``proposal.tree``."""
    tokens = proposal.tree.tokens
    node, nodes = 0, [0]
    while True:
        p = probs(logits[node], cfg)  # [vocab] warped target at this node
        candidates = proposal.draws[node]
        if not candidates:
            return Verdict(nodes, _draw(p, generator))
        accepted = None
        for i in torch.randperm(len(candidates), generator=generator).tolist():
            draw = candidates[i]
            x = tokens[draw.child]
            qx = 1.0 if draw.q is None else float(draw.q[x])
            if float(torch.rand((), generator=generator)) * qx <= float(p[x]):
                accepted = draw.child
                break
            if draw.q is None:
                residual = p.clone()
                residual[x] = 0.0
            else:
                residual = (p - draw.q).clamp_min(0.0)
            total = float(residual.sum())
            if total <= 0.0:  # p == q up to rounding: rejection had probability ~0
                continue
            p = residual / total
        if accepted is None:
            return Verdict(nodes, _draw(p, generator))
        node = accepted
        nodes.append(node)


def accept_naive(
    proposal: Proposal, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """Draw from p at each node; follow the tree while the draw is one of its children."""
    tokens = proposal.tree.tokens
    kids = proposal.tree.children()
    node, nodes = 0, [0]
    while True:
        x = _draw(probs(logits[node], cfg), generator)
        child = next((c for c in kids[node] if tokens[c] == x), None)
        if child is None:
            return Verdict(nodes, x)
        node = child
        nodes.append(node)

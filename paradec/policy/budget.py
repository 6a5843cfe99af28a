"""ProPD's cost model across a running batch: how far every row's draft chain is verified.

A batched verification pass is rectangular: every row is padded to the widest tree, so one row's
16-token prompt-lookup chain makes all rows pay for 17 positions. At batch 1 a longer chain is
nearly free on this CPU (16 rows cost 1.5 `ar` steps); at batch 16 the pass is already 16 rows,
and each extra position adds 16 more. ``BatchBudget`` picks the verified width W (nodes per row,
the root included) each step to maximize expected committed tokens per second of the pass:

    value(W) = sum over rows of (1 + E[accepted | W]) / latency(batch x W)

E[accepted | W] = sum_{d < W} prod_{i <= d} a(P, i), where a(P, i) is the learned chance that a
chain's i-th token is accepted when its i - 1 before it were, for chains the drafter proposed
P tokens long (prompt lookup proposes further on a longer match, so P carries its confidence);
latency is a line in the verified positions, refit on measured passes (``LatencyModel``).
Chains are cut to W nodes; a prefix of a chain is a chain, and fewer drafted tokens never change
what greedy verification commits. Only greedy chains are cut: under sampling, which draws are
kept must not depend on their values.
"""

from __future__ import annotations

from collections import defaultdict

from paradec.policy.dynamic import LatencyModel

PRIOR_ACCEPT = 0.6  # the prior conditional acceptance of a chain token (weight PRIOR_WEIGHT trials)
PRIOR_WEIGHT = 2.0


def length_class(proposed: int) -> int:
    """Chains of similar proposed length share statistics: 1, 2, 3-4, 5-8, 9-16, 17+."""
    return min(proposed, 2) if proposed <= 2 else (proposed - 1).bit_length() + 1


class BatchBudget:
    def __init__(self, decay: float = 0.995) -> None:
        self.decay = decay
        self.hits: dict[tuple, float] = defaultdict(float)  # (method, length class, depth) -> accepted
        self.trials: dict[tuple, float] = defaultdict(float)  # ... -> offered with the parent accepted
        self.latency = LatencyModel()
        self.probe = [1, None]  # widths tried first to fit the latency line (None: the widest)

    def rate(self, method: str, proposed: int, depth: int) -> float:
        key = (method, length_class(proposed), depth)
        return (self.hits[key] + PRIOR_ACCEPT * PRIOR_WEIGHT) / (self.trials[key] + PRIOR_WEIGHT)

    def expected(self, method: str, proposed: int, width: int) -> float:
        """Committed tokens of a row whose chain of ``proposed`` tokens is cut to ``width`` nodes."""
        total, reach = 1.0, 1.0
        for d in range(1, min(proposed, width - 1) + 1):
            reach *= self.rate(method, proposed, d)
            total += reach
        return total

    def choose(self, chains: list[tuple[str, int]]) -> int:
        """chains: per row, (method, proposed chain length) -> the width W (nodes per row)."""
        widest = 1 + max(p for _, p in chains)
        if self.probe:
            w = self.probe.pop(0)
            return widest if w is None else min(w, widest)
        batch = len(chains)
        best, best_w = -1.0, 1
        for w in range(1, widest + 1):
            value = sum(self.expected(m, p, w) for m, p in chains) / self.latency.predict(batch * w)
            if value > best:
                best, best_w = value, w
        return best_w

    def observe(self, method: str, proposed: int, offered: int, accepted: int) -> None:
        """A row's verdict: of its chain (``proposed`` long, cut to ``offered``), ``accepted``
        tokens were accepted."""
        for key in self.hits:
            self.hits[key] *= self.decay
            self.trials[key] *= self.decay
        for d in range(1, min(offered, accepted + 1) + 1):
            key = (method, length_class(proposed), d)
            self.trials[key] += 1.0
            self.hits[key] += d <= accepted

    def observe_pass(self, positions: int, seconds: float) -> None:
        self.latency.observe(positions, seconds)

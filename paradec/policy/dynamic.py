"""Dynamic token tree generation (ProPD §1.4, papers.md): each step, the tree size that
maximizes expected tokens per second for the current batch.

- ``RankStats``: P(the target's token at depth d is head d's rank-r guess), updated online from
  what the target produced, with exponential forgetting (recent steps weigh more).
- ``LatencyModel``: weighted least squares of step time on verified tokens (batch x nodes;
  with early pruning, lower layers count every drafted node and upper layers the survivors),
  recent measurements weighing more.
- ``TreePolicy``: for each candidate size n, the tree is the top-n rank paths by score (always
  a valid tree); expected tokens per step = 1 + sum of node scores; choose
  argmax_n batch * E(n) / T(batch * (n + 1)).
"""

from __future__ import annotations

import random

from paradec.tree.builders import top_paths_scored

SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class RankStats:
    def __init__(self, prior: list[list[float]], decay: float = 0.98, prior_weight: float = 20.0) -> None:
        self.depth, self.ranks = len(prior), len(prior[0])
        self.decay = decay
        # weighted hit counts per (depth, rank) and weighted trials per depth
        self.hits = [[p * prior_weight for p in row] for row in prior]
        self.trials = [prior_weight] * self.depth
        self.version = 0  # bumped by every observation

    def observe(self, depth: int, rank: int | None) -> None:
        """At ``depth`` (0-based) the target's token was the head's ``rank`` guess (None: none)."""
        self.hits[depth] = [h * self.decay for h in self.hits[depth]]
        self.trials[depth] = self.trials[depth] * self.decay + 1.0
        self.version += 1
        if rank is not None and rank < self.ranks:
            self.hits[depth][rank] += 1.0

    def probs(self) -> list[list[float]]:
        out = []
        for hits, trials in zip(self.hits, self.trials):
            row = [min(1.0, h / trials) for h in hits]
            for r in range(1, len(row)):  # keep ranks monotone, so top-n by score is a tree
                row[r] = min(row[r], row[r - 1])
            out.append(row)
        return out


class LatencyModel:
    """seconds ~= a + b * tokens, refit on exponentially weighted samples."""

    def __init__(self, decay: float = 0.97, a: float = 0.0, b: float = 0.0) -> None:
        self.decay = decay
        self.a, self.b = a, b
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, tokens: float, seconds: float) -> None:
        d = self.decay
        self.sw, self.sx, self.sy = self.sw * d + 1, self.sx * d + tokens, self.sy * d + seconds
        self.sxx, self.sxy = self.sxx * d + tokens * tokens, self.sxy * d + tokens * seconds
        var = self.sw * self.sxx - self.sx * self.sx
        if self.sw >= 2 and var > 1e-9 * max(1.0, self.sw * self.sxx):
            b = (self.sw * self.sxy - self.sx * self.sy) / var
            self.b = max(b, 0.0)
            self.a = max((self.sy - self.b * self.sx) / self.sw, 1e-6)
        elif self.sw > 0:
            self.a = self.sy / self.sw

    def predict(self, tokens: float) -> float:
        return self.a + self.b * tokens

    @property
    def ready(self) -> bool:
        return self.sw >= 4 and self.a > 0


class TreePolicy:
    """Chooses the rank paths of the next tree, and whether to prune it inside the pass.

    ``static_nodes`` fixes the size (Medusa; with ``lower_share`` set, every pass is pruned:
    the ``medusa+prune`` ablation). Otherwise each step it picks the (size, prune) pair with
    the most expected tokens per second, from two latency models (split passes cost
    differently) and the early head's recall learned online: with pruning, a correct node at
    depth d survives with probability recall**d (every edge on its path must pass).
    """

    def __init__(self, prior: list[list[float]], static_nodes: int | None = None,
                 explore_every: int = 32, seed: int = 0, lower_share: float | None = None,
                 recall: float = 0.8) -> None:
        self.stats = RankStats(prior)
        self.latency = LatencyModel()  # unpruned passes
        self.latency_pruned = LatencyModel()  # split passes
        self.static_nodes = static_nodes
        self.explore_every = explore_every
        self.rng = random.Random(seed)
        self.steps = 0
        # With early pruning, layers [0, m) see every drafted node and layers [m, L) the
        # survivors: a pass costs about `lower_share * drafted + (1 - lower_share) * verified`
        # tokens' worth; `keep` tracks the surviving share online.
        self.lower_share = lower_share
        self.keep = 1.0
        self.recall_hits, self.recall_trials = 20.0 * recall, 20.0  # prior worth 20 observations
        self.prune_next = lower_share is not None
        self._order: list[tuple[tuple[int, ...], float]] | None = None
        self._order_version = self._order_n = -1
        # sizes (and modes) tried first, to fit the latency models
        sizes = [1, 8, 32, 4, 16, 64, 2]
        self.probe = [(n, False) for n in sizes]
        if lower_share is not None:
            self.probe = [x for pair in zip(self.probe, [(n, True) for n in sizes]) for x in pair]

    @property
    def recall(self) -> float:
        return self.recall_hits / self.recall_trials

    def observe_recall(self, hit: bool, decay: float = 0.99) -> None:
        """The target's next token at a pruned pass's last accepted node was (not) in the early top-k."""
        self.recall_hits = self.recall_hits * decay + float(hit)
        self.recall_trials = self.recall_trials * decay + 1.0

    def choose(self, batch: int) -> int:
        """Number of draft nodes for the next step (sets ``prune_next``)."""
        if self.static_nodes is not None:
            return self.static_nodes
        self.steps += 1
        if self.probe:
            n, self.prune_next = self.probe.pop(0)
            return n
        can_prune = self.lower_share is not None
        if self.steps % self.explore_every == 0:
            self.prune_next = can_prune and self.rng.random() < 0.5
            return self.rng.choice(SIZES[1:])
        # best-first, so the top-n tree is a prefix of the top-max tree: one search per step,
        # which ``paths`` reuses
        order = self._ordered()
        gain, gain_pruned = [0.0], [0.0]
        for path, score in order:
            gain.append(gain[-1] + score)
            gain_pruned.append(gain_pruned[-1] + score * self.recall ** len(path))
        best, best_rate, self.prune_next = 0, 0.0, False
        for prune in (False, True) if can_prune else (False,):
            lat, g = (self.latency_pruned, gain_pruned) if prune else (self.latency, gain)
            for n in SIZES:
                if prune and n == 0:
                    continue
                e = 1.0 + g[min(n, len(order))]
                rate = batch * e / lat.predict(self.cost_tokens(batch, n + 1, pruned=prune))
                if rate > best_rate:
                    best, best_rate, self.prune_next = n, rate, prune
        return best

    def cost_tokens(self, batch: int, drafted: float, verified: float | None = None, pruned: bool = True) -> float:
        """Token-equivalents a pass costs (the latency model's x); ``verified`` defaults to the
        expected survivors of pruning."""
        if self.lower_share is None or not pruned:
            return batch * drafted
        if verified is None:
            verified = 1 + (drafted - 1) * self.keep
        return batch * (self.lower_share * drafted + (1 - self.lower_share) * verified)

    def observe_step(self, batch: int, drafted: int, verified: int, seconds: float, pruned: bool = False) -> None:
        if pruned and drafted > 1:
            self.keep = 0.9 * self.keep + 0.1 * (verified - 1) / (drafted - 1)
        lat = self.latency_pruned if pruned else self.latency
        lat.observe(self.cost_tokens(batch, drafted, verified, pruned), seconds)

    def _ordered(self, n: int = max(SIZES)) -> list[tuple[tuple[int, ...], float]]:
        """The best ``n`` rank paths, best-first, with their scores, for the statistics as they
        are now (cached until the next observation)."""
        if self._order is None or self._order_version != self.stats.version or self._order_n < n:
            self._order = top_paths_scored(self.stats.probs(), n)
            self._order_version, self._order_n = self.stats.version, n
        return self._order

    def paths(self, n: int) -> list[tuple[int, ...]]:
        return [path for path, _ in self._ordered(n)[:n]]

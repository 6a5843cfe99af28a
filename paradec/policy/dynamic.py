"""Dynamic token tree generation (ProPD §1.4, papers.md): each step, the tree size that
maximizes expected tokens per second for the current batch.

- ``RankStats``: P(the target's token at depth d is head d's rank-r guess), updated online from
  what the target produced, with exponential forgetting (recent steps weigh more).
- ``LatencyModel``: weighted least squares of step time on verified tokens (batch x nodes;
  with early pruning, lower layers count every drafted node and upper layers the survivors),
  recent measurements weighing more.
- ``Calibration``: P(a head's guess is the target's token | the head gave it probability p),
  per depth, in probability bins, learned online. With it a node's score can come from this
  step's head probabilities instead of the average rank acceptance: each row gets its own tree,
  deep when the heads are sure, small when they are not.
- ``TreePolicy``: for each candidate size n, the tree is the top-n rank paths by score (always
  a valid tree); expected tokens per step = 1 + sum of node scores; choose
  argmax_n sum_rows E_row(n) / T(batch * (n + 1)).
"""

from __future__ import annotations

import bisect
import random

from paradec.cpu import PassCost
from paradec.tree.builders import top_paths_scored

SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# drafting is chosen over a plain step only when it is expected to commit this much more per second,
# by every cost model (this one, ``policy.budget``, ``policy.auto``, EAGLE's): the costs a drafted step
# has beyond its pass and its drafter (accepting a tree, committing its rows, a pass at a longer context
# than the curve's) are not in the models, and a gain smaller than them is a loss
HURDLE = 0.05
# Priors for heads trained without held-out statistics: head d's rank-r guess is the target's
# token with probability RANK_PRIOR_BASE ** (r + 1); the early head's top-k holds the target's
# next token with probability EARLY_RECALL_PRIOR. Both are replaced online as steps are observed.
RANK_PRIOR_BASE = 0.5
PRIOR_RANKS = 8
EARLY_RECALL_PRIOR = 0.8


def rank_prior(depths: int, ranks: int = PRIOR_RANKS) -> list[list[float]]:
    """[depth][rank] -> prior acceptance probability."""
    return [[RANK_PRIOR_BASE ** (r + 1) for r in range(ranks)] for _ in range(depths)]


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


BINS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)  # upper edges of head-probability bins


class Calibration:
    """Per depth and bin of head probability: weighted hits / trials, recent steps weighing more.
    The prior is a calibrated head (a bin's rate = its centre), worth ``prior_weight`` guesses."""

    def __init__(self, depth: int, decay: float = 0.999, prior_weight: float = 2.0) -> None:
        centres = [(hi + lo) / 2 for lo, hi in zip((0.0, *BINS[:-1]), BINS)]
        self.decay = decay
        self.hits = [[c * prior_weight for c in centres] for _ in range(depth)]
        self.trials = [[prior_weight] * len(BINS) for _ in range(depth)]
        self._table: list[list[float]] | None = None

    def observe(self, depth: int, probs: list[float], hits: list[bool]) -> None:
        """At ``depth`` the head gave its guesses ``probs``; ``hits``: which was the target's token."""
        if depth >= len(self.hits):
            return
        h, t = self.hits[depth], self.trials[depth]
        for b in range(len(BINS)):
            h[b] *= self.decay
            t[b] *= self.decay
        for p, hit in zip(probs, hits):
            b = min(bisect.bisect_left(BINS, p), len(BINS) - 1)
            h[b] += hit
            t[b] += 1.0
        self._table = None

    def table(self) -> list[list[float]]:
        """[depth][bin] acceptance rate, non-decreasing in the bin (so scores fall with rank):
        the weighted isotonic fit of the bins' rates (pool adjacent violators)."""
        if self._table is None:
            self._table = [_isotonic([hb / tb for hb, tb in zip(h, t)], t) for h, t in zip(self.hits, self.trials)]
        return self._table

    def scores(self, probs: list[list[float]]) -> list[list[float]]:
        """Head probabilities [depth][rank] (falling with rank) -> acceptance scores [depth][rank]."""
        table = self.table()
        return [
            [table[d][min(bisect.bisect_left(BINS, p), len(BINS) - 1)] for p in row]
            for d, row in enumerate(probs[: len(table)])
        ]


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares.
    Example: values [0.4, 0.3], weights [2, 1000] -> both ~0.3002."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v1, w1, c1), (v2, w2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [min(1.0, v) for v, _, c in blocks for _ in range(c)]


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
        return max(self.a + self.b * tokens, 1e-9)  # > 0 before the first sample too

    @property
    def ready(self) -> bool:
        return self.sw >= 4 and self.a > 0


class CurveLatency:
    """seconds ~= the curve measured at load, refit on exponentially weighted real passes: an
    overall scale (context length, other load on the machine), and, for a measured curve, each
    pass size's own factor on the scaled curve where it has been seen (the mean ratio of its
    passes to the scaled curve, ``LOCAL_PRIOR`` observations of 1 weighing against it).

    A curve measured at load can be off in its shape: the CPU's speed drifts while it is
    measured, and a batch of rows attends over more keys than the one-row curve does. On
    SmolLM2 int4 here, the curve said 1 to 4 tokens cost the same, and real passes of ~4 cost
    1.5x one. A size's factor forgets with that size's own passes only (``SHAPE_DECAY``): a size
    chosen on one step in ten kept a third of the curve's error when every pass aged it, and
    `auto` priced prompt lookup's 2- to 5-token passes 5-10 % below what they took, so it
    verified nodes that did not pay."""

    LOCAL_PRIOR = 2.0
    SHAPE_DECAY = 0.95

    def __init__(self, curve: PassCost, decay: float = 0.97) -> None:
        self.curve, self.decay = curve, decay
        self.seconds = self.predicted = 0.0
        # positions -> (passes seen lately, weighted with ``decay``, as of pass ``_passes``): aged when
        # read, not every pass (a step's Python runs after a pass has evicted it from the caches)
        self.recent: dict[int, tuple[float, int]] = {}
        self._passes = 0
        self.shape: dict[int, list[float]] = {}  # positions -> [sum of seconds / scaled curve, passes]
        self._curve: dict[float, float] = {}  # positions -> the curve's seconds (auto asks ~20 a step)
        # positions -> the curve times that size's factor: what changes with every pass is the scale
        # alone, and a pass moves its own size's factor only (auto prices ~20 sizes a step)
        self._shaped: dict[float, float] = {}
        self._shaped_at: dict[int, list[float]] = {}  # round(positions) -> its keys in ``_shaped``

    def observe(self, positions: float, seconds: float) -> None:
        curve = self._at(positions)
        self.seconds = self.seconds * self.decay + seconds
        # the scale is the drift beside each size's own factor: a mix of sizes that changes
        # (200 passes of one token after a few of four) moves neither
        self.predicted = self.predicted * self.decay + curve * self._factor(positions)
        if self.curve.measured:
            self._passes += 1
            key = round(positions)
            self.recent[key] = (self.seen(positions) + 1.0, self._passes)
            sums = self.shape.setdefault(key, [0.0, 0.0])
            sums[0] = sums[0] * self.SHAPE_DECAY + seconds / (self.seconds / self.predicted * curve)
            sums[1] = sums[1] * self.SHAPE_DECAY + 1.0
            for at in self._shaped_at.pop(key, ()):
                self._shaped.pop(at, None)

    def seen(self, positions: float) -> float:
        """How many recent passes of this size were observed (weighted)."""
        count, at = self.recent.get(round(positions), (0.0, self._passes))
        count *= self.decay ** (self._passes - at)
        return count if count >= 0.01 else 0.0

    def predict(self, positions: float) -> float:
        return max(self.scale() * self.shaped(positions), 1e-9)

    def scale(self) -> float:
        """The drift: seconds = scale * ``shaped(positions)``."""
        return self.seconds / self.predicted if self.predicted > 0 else 1.0

    def shaped(self, positions: float) -> float:
        """The curve at ``positions`` times that size's own factor (unscaled)."""
        if positions not in self._shaped:
            self._shaped[positions] = self._at(positions) * self._factor(positions)
            self._shaped_at.setdefault(round(positions), []).append(positions)
        return self._shaped[positions]

    def _factor(self, positions: float) -> float:
        ratio, passes = self.shape.get(round(positions), (0.0, 0.0))
        return (ratio + self.LOCAL_PRIOR) / (passes + self.LOCAL_PRIOR)

    def _at(self, positions: float) -> float:
        if positions not in self._curve:
            self._curve[positions] = self.curve.predict(positions)
        return self._curve[positions]


class TreePolicy:
    """Chooses the rank paths of the next tree, and whether to prune it inside the pass.

    ``static_nodes`` fixes the size (Medusa; with ``lower_share`` set, every pass is pruned:
    the ``medusa+prune`` ablation). Otherwise each step it picks the (size, prune) pair with
    the most expected tokens per second, from two latency models (split passes cost
    differently) and the early head's recall learned online: with pruning, a correct node at
    depth d survives with probability recall**d (every edge on its path must pass).

    ``choose(batch, step_scores)``: with this step's calibrated scores per row, each row's tree
    is its own top-n paths (``paths(n, row)``); without, every row gets the top-n by rank stats.
    """

    def __init__(
        self,
        prior: list[list[float]],
        static_nodes: int | None = None,
        explore_every: int = 32,
        seed: int = 0,
        lower_share: float | None = None,
        recall: float = EARLY_RECALL_PRIOR,
        curve: PassCost | None = None,
    ) -> None:
        self.stats = RankStats(prior)
        # unpruned and split passes: the measured pass-cost curve's shape (``paradec.cpu``; a split
        # pass counts its token-equivalents), else lines fit on probed sizes
        self.latency = CurveLatency(curve) if curve is not None else LatencyModel()
        self.latency_pruned = CurveLatency(curve) if curve is not None else LatencyModel()
        self.static_nodes = static_nodes
        self.explore_every = explore_every
        self.hurdle = HURDLE  # how much more per second a drafted tree must be expected to commit than none
        self.last = 0  # the size chosen last (explored around when the latency has a measured curve)
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
        self._rank_gains: tuple = (None, None)  # ((stats version, recall), ``_gains`` of the rank order)
        self.calibration: Calibration | None = None  # set by drafters that score with it
        self._row_orders: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        # sizes (and modes) tried first, to fit the latency models
        sizes = [1, 8, 32, 4, 16, 64, 2] if curve is None else []
        self.probe = [(n, False) for n in sizes]
        if lower_share is not None and sizes:
            self.probe = [x for pair in zip(self.probe, [(n, True) for n in sizes]) for x in pair]

    @property
    def recall(self) -> float:
        return self.recall_hits / self.recall_trials

    def observe_recall(self, hit: bool, decay: float = 0.99) -> None:
        """The target's next token at a pruned pass's last accepted node was (not) in the early top-k."""
        self.recall_hits = self.recall_hits * decay + float(hit)
        self.recall_trials = self.recall_trials * decay + 1.0

    def choose(self, batch: int, step_scores: dict[int, list[list[float]]] | None = None) -> int:
        """Number of draft nodes for the next step (sets ``prune_next``). ``step_scores``: per
        row that drafts, this step's acceptance score of each head guess [depth][rank]."""
        self._row_orders = {row: top_paths_scored(sc, max(SIZES)) for row, sc in (step_scores or {}).items()}
        if self.static_nodes is not None:
            return self.static_nodes
        self.steps += 1
        if self.probe:
            n, self.prune_next = self.probe.pop(0)
            return n
        can_prune = self.lower_share is not None
        if self.steps % self.explore_every == 0:
            self.prune_next = can_prune and self.rng.random() < 0.5
            if isinstance(self.latency, CurveLatency):  # the curve knows the shape: look one size
                # up, and every other time one down (real passes correct the curve where they are seen)
                step = -1 if (self.steps // self.explore_every) % 2 else 1
                return SIZES[min(max(SIZES.index(self.last) + step, 0), len(SIZES) - 1)]
            return self.rng.choice(SIZES[1:])
        # best-first, so the top-n tree is a prefix of the top-max tree: one search per step
        # (per row with step scores), which ``paths`` reuses
        if self._row_orders:
            rows = 1  # each row's own tree: the rows' expectations summed
            gain, gain_pruned = [0.0] * (max(SIZES) + 1), [0.0] * (max(SIZES) + 1)
            for order in self._row_orders.values():
                for n, (g, gp) in enumerate(zip(*self._gains(order))):
                    gain[n] += g
                    gain_pruned[n] += gp
        else:  # rank stats: every row expects the same, and the sums change with the statistics only
            rows = batch
            key = (self.stats.version, self.recall)
            if self._rank_gains[0] != key:
                self._rank_gains = (key, self._gains(self._ordered()))
            gain, gain_pruned = self._rank_gains[1]
        best, best_rate, self.prune_next = 0, 0.0, False
        bar = 0.0  # what a size that drafts must beat: ``hurdle`` over drafting nothing
        for prune in (False, True) if can_prune else (False,):
            lat, g = (self.latency_pruned, gain_pruned) if prune else (self.latency, gain)
            for n in SIZES:
                if prune and n == 0:
                    continue
                rate = (batch + g[n] * rows) / lat.predict(self.cost_tokens(batch, n + 1, pruned=prune))
                if rate > max(best_rate, bar):
                    best, best_rate, self.prune_next = n, rate, prune
                if n == 0:
                    bar = rate * (1 + self.hurdle)
        self.last = best
        return best

    def _gains(self, order: list[tuple[tuple[int, ...], float]]) -> tuple[list[float], list[float]]:
        """Expected accepted nodes of the top-n tree of ``order`` for n = 0..max(SIZES), unpruned and
        pruned (a node at depth d survives with recall**d)."""
        gain, gain_pruned = [0.0], [0.0]
        g = gp = 0.0
        for n in range(1, max(SIZES) + 1):
            if n <= len(order):
                path, score = order[n - 1]
                g += score
                gp += score * self.recall ** len(path)
            gain.append(g)
            gain_pruned.append(gp)
        return gain, gain_pruned

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

    def paths(self, n: int, row: int | None = None) -> list[tuple[int, ...]]:
        """The tree of the step ``choose`` sized: ``row``'s own top-n when it had step scores."""
        order = self._row_orders.get(row) if row is not None else None
        return [path for path, _ in (order if order is not None else self._ordered(n))[:n]]

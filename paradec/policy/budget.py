"""ProPD's cost model over a whole pass: how many nodes of every row's draft tree are verified.

A verification pass is rectangular: every row is padded to the widest tree, and what one more
position costs depends on the CPU. On an AVX-512 BF16 core 16 positions cost about 1.5 `ar`
steps; on an AVX2 core without native bf16, 8 positions in bf16 cost ~3.5 steps, and a
16-token prompt-lookup chain makes a method slower than `ar`. ``BatchBudget`` picks the verified
width W (nodes per row, the root included) each step to maximize expected committed tokens per
second of the pass:

    value(W) = sum over rows of (1 + E[accepted | W]) / latency(batch x W)

E[accepted | W] = sum_{0 < n < W} r(M, S, n): a node on the accepted path adds one token, and
r(M, S, n) is the learned chance that node n of a tree that method M proposed with S nodes is
on the accepted path (for a chain, node n is depth n; EAGLE ranks its nodes by draft confidence;
prompt lookup proposes further on a longer match, so S carries the match's confidence). Every
node proposed is scored, verified or not: the nodes a cut left out by the tokens the row commits
next (``score``, ``tree.shadow``), so the budget needs no pass padded past what
pays to learn whether more would (it used to verify 2 more nodes every 16 quiet steps: on 2 AVX2
cores a pass of 3 nodes costs 1.6 plain ones, 4 % of the time of methods that never paid).
Trees are cut to their first W nodes: parents come before children, so a prefix of a tree is a
tree, and fewer drafted nodes never change what greedy verification commits. latency is the
measured pass-cost curve of the CPU and format (``paradec.cpu``), its scale refit on measured
passes (``CurveLatency``); without a curve, a line refit online.

Only greedy trees are cut (under sampling, which draws are kept must not depend on their values),
and not the trees of a drafter that sizes its own with a cost model (ProPD's dynamic trees).
With a curve, W = 1 where drafted nodes do not pay, or pay less than HURDLE (5 %) more per
second than a plain step, the part of the model's estimate that its unmodeled costs eat (on 2
AVX2 cores a llama.cpp pass of 2 tokens costs 1.7 `ar` steps, and chains accepted 70-75 % of
the time were verified at a loss); and where even the best W does not pay for
the drafting's own measured time (an SSM's or a head's passes), ``next_width`` tells the drafters to
skip drafting (width 0): the method then runs as `ar` does, looking again after ``EXPLORE_EVERY``
skipped steps, then after twice as many each time a look finds drafting still does not pay (up
to ``EXPLORE_EVERY << MAX_BACKOFF``; how often it looks depends on no timing).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import accumulate

from paradec.cpu import PassCost
from paradec.policy.dynamic import HURDLE, CurveLatency, LatencyModel
from paradec.tree.proposal import Proposal
from paradec.tree.shadow import Shadow, settle
from paradec.tree.tree import TokenTree

PRIOR_ACCEPT = 0.6  # the prior chance of a chain's node d is PRIOR_ACCEPT x node d - 1's rate ...
PRIOR_WEIGHT = 2.0  # ... worth this many observations
EXPLORE_EVERY = 16  # skipped drafting: a look (a tree of 2 nodes past the root) after this many steps ...
MAX_BACKOFF = 3  # ... then after EXPLORE_EVERY << misses steps, misses (looks in a row that did not pay) up to this


def size_class(proposed: int) -> int:
    """Trees of similar proposed size share statistics: 1, 2, 3-4, 5-8, 9-16, 17+ nodes past the root."""
    return min(proposed, 2) if proposed <= 2 else (proposed - 1).bit_length() + 1


class Acceptance:
    """P(node n of a tree is on the accepted path | it was verified), per kind of tree (``key``:
    who drafted it and in which context), learned online with exponential forgetting from a
    prior of PRIOR_ACCEPT times node n - 1's rate, worth PRIOR_WEIGHT observations. Nodes count
    parents first, so a tree cut to its first w nodes expects 1 + sum_{0 < n < w} rate(n) tokens."""

    def __init__(self, decay: float = 0.995, per_key: bool = False, priors: dict[str, float] | None = None) -> None:
        self.decay = decay
        # forget with every observation (a budget: what the batch drafts now), or with every
        # observation of the same key (auto: a drafter tried rarely keeps what was measured of it)
        self.per_key = per_key
        self.priors = priors or {}  # key[0] (who drafted) -> its first node's prior, where not PRIOR_ACCEPT
        # key -> [per node 1, 2, ...]: on the accepted path, and verified (lists: ``rates`` runs for
        # every option of every row each step, and a key's nodes are read in order)
        self.hits: dict[tuple, list[float]] = {}
        self.trials: dict[tuple, list[float]] = {}

    def rates(self, key: tuple, nodes: int) -> list[float]:
        """[rate of node 1, ..., node ``nodes``]. Node n's prior is PRIOR_ACCEPT times node n - 1's
        rate (for a chain: the chance it is accepted given its parent was), so a chain that is
        accepted whole makes the next node look worth verifying before it ever was."""
        hits, trials = self.hits.get(key, ()), self.trials.get(key, ())
        seen = min(nodes, len(trials))
        out, parent = [], self.priors.get(key[0], PRIOR_ACCEPT) / PRIOR_ACCEPT  # node 1's prior: PRIOR_ACCEPT x this
        for n in range(nodes):
            h, t = (hits[n], trials[n]) if n < seen else (0.0, 0.0)
            parent = (h + PRIOR_ACCEPT * parent * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
            out.append(parent)
        return out

    def rate(self, key: tuple, node: int) -> float:
        return self.rates(key, node)[-1] if node else 1.0

    def expected(self, key: tuple, nodes: int) -> float:
        """Committed tokens of a tree whose first ``nodes`` nodes past the root are verified."""
        return 1.0 + sum(self.rates(key, nodes))

    def observe(self, key: tuple, offered: int, accepted: list[int], weight: float = 1.0) -> None:
        """Nodes 1..``offered`` of a ``key`` tree were verified; ``accepted`` (indices) were on the
        path. ``weight``: what the observation counts (a row's statistics forget by weighing the
        new ones more, ``policy.auto.RowStats``)."""
        if self.decay != 1.0:  # 1.0: counts that forget elsewhere (a row's tick)
            for k in [key] if self.per_key else list(self.hits):
                if k in self.hits:
                    self.hits[k] = [h * self.decay for h in self.hits[k]]
                    self.trials[k] = [t * self.decay for t in self.trials[k]]
        hits, trials = self.hits.setdefault(key, []), self.trials.setdefault(key, [])
        if offered > len(trials):
            hits.extend([0.0] * (offered - len(hits)))
            trials.extend([0.0] * (offered - len(trials)))
        on_path = set(accepted)
        for n in range(offered):
            trials[n] += weight
            if n + 1 in on_path:
                hits[n] += weight


class BatchBudget:
    def __init__(self, curve: PassCost | None = None, decay: float = 0.995) -> None:
        self.accept = Acceptance(decay)  # (method, size class, node) -> on the accepted path
        self.latency = CurveLatency(curve) if curve is not None else LatencyModel()
        # without a curve, the widths tried first to fit the latency line (None: the widest)
        self.probe: list[int | None] = [] if curve is not None else [1, None]
        self.draft_s: dict[str, float] = {}  # method -> seconds its drafters take a step (recent average)
        # by the methods of a step's rows: the last step's drafted rows (method, proposed nodes)
        self.last_trees: dict[tuple[str, ...], list[tuple[str, int]]] = {}
        # by the methods that draft (an engine serves several): steps in a row whose drafting was
        # skipped because it did not pay, and looks in a row after which it still did not
        self.skipped: dict[tuple[str, ...], int] = defaultdict(int)
        self.misses: dict[tuple[str, ...], int] = defaultdict(int)
        self.drafted = 0  # steps in a row that drafted (a measured curve: a plain step is taken to time one)
        self.hurdle = HURDLE  # how much more per second drafting must be expected to commit than a plain step

    def rate(self, method: str, proposed: int, node: int) -> float:
        return self.accept.rate((method, size_class(proposed)), node)

    def by_width(self, trees: list[tuple[str, int]], widest: int) -> list[float]:
        """The rows' expected committed tokens summed, their trees (``proposed`` nodes past the
        root) cut to width 1, 2, ..., ``widest``: one pass over each kind of tree's rates (a width
        at a time, it cost an SSM's or EAGLE's skipped step ~0.4 ms in Python)."""
        totals = [0.0] * widest
        for (method, proposed), rows in Counter(trees).items():
            gains = list(accumulate(self.accept.rates((method, size_class(proposed)), proposed), initial=1.0))
            for w in range(1, widest + 1):
                totals[w - 1] += rows * gains[min(proposed, w - 1)]
        return totals

    def choose(self, trees: list[tuple[str, int]], priced: list[list[float]] = ()) -> int:
        """trees: per row, (method, nodes proposed past the root); priced: per row whose drafter
        priced its own tree, the committed tokens it expects at width 1, 2, ... (``Proposal.gains``)
        -> the width W (nodes per row)."""
        widest = max([1 + p for _, p in trees] + [len(g) for g in priced])
        if self.probe:
            w = self.probe.pop(0)
            return widest if w is None else min(w, widest)
        batch = len(trees) + len(priced)
        best, best_w, bar = -1.0, 1, 0.0  # bar: what a width past the root must beat (HURDLE over width 1)
        drafted = self.by_width(trees, widest)
        for w in range(1, widest + 1):
            tokens = drafted[w - 1] + sum(g[min(w, len(g)) - 1] for g in priced)
            value = tokens / self.latency.predict(batch * w)
            if value > max(best, bar) * (1 + 1e-9):
                best, best_w = value, w
            if w == 1:
                bar = value * (1 + self.hurdle)
        return best_w

    def observe(self, method: str, proposed: int, offered: int, accepted: list[int]) -> None:
        """A row's verdict: of its tree (``proposed`` nodes past the root, cut to ``offered``),
        the nodes ``accepted`` (indices, root excluded) were on the accepted path."""
        self.accept.observe((method, size_class(proposed)), offered, accepted)

    def score(
        self,
        method: str,
        tree: TokenTree,
        verified: int,
        accepted: list[int],
        committed: list[int],
        pending: list[Shadow],
    ) -> list[Shadow]:
        """A row's step: ``tree`` as ``method`` proposed it, its first ``verified`` nodes verified,
        ``accepted`` (node indices past the root) on the accepted path, ``committed`` the tokens the
        row took; ``pending``: its earlier cut trees not yet scored -> those still pending. A tree
        verified whole is scored at once; a cut one by the tokens the row commits now and at the
        next steps (greedy: the target's own), so the nodes the cut left out count too, without a
        pass padded to verify them. Earlier trees read this step's tokens first."""
        proposed, whole = len(tree) - 1, verified == len(tree)
        mine = [] if whole else [Shadow((method, proposed), tree)]
        still = settle([*pending, *mine], committed, lambda key, nodes, path: self.observe(*key, nodes, path))
        if whole:
            self.observe(method, proposed, proposed, accepted)
        return still

    def observe_pass(self, positions: int, seconds: float) -> None:
        self.latency.observe(positions, seconds)

    def observe_draft(self, method: str, seconds: float, decay: float = 0.9) -> None:
        """A step's drafting took ``seconds`` for ``method`` (recent steps weigh more)."""
        self.draft_s[method] = self.draft_s.get(method, seconds) * decay + seconds * (1 - decay)

    def standing(self, method: str) -> int | None:
        """How far a new request of ``method`` should draft at its first step: 0 while this
        engine skips that method's drafting alone (``next_width``), else None (its whole tree).
        Its skipped steps and the looks that did not pay go on counting from the last request, as
        one text: a new text may suit the drafter better, but on a CPU where its drafting does not
        pay starting over cost every request two looks in its first 48 steps (a look at an SSM's
        or EAGLE's tree, 4-7 ms on 2 AVX2 cores: 2-3 % of the demo's 64-token answers)."""
        key = (method,)
        return 0 if self.skipped.get(key, 0) or self.misses.get(key, 0) else None

    def next_width(self, trees: list[tuple[str, int]], width: int) -> int:
        """How far the drafters should draft next step (``Drafter.set_width``): this step's ``width``
        while drafting pays for its own time too, else 0 (no drafting: the step is an `ar` step),
        with a look again after ``EXPLORE_EVERY`` steps, backing off (``MAX_BACKOFF``). ``trees``:
        this step's rows, as ``choose``'s (when none of them drafted, as beside auto's priced rows
        or at a skipped step, the last drafted rows of the same methods stand in)."""
        methods = tuple(sorted({m for m, _ in trees}))
        if any(p for _, p in trees):
            self.last_trees[methods] = trees
        trees = self.last_trees.get(methods, [])
        if not trees or not isinstance(self.latency, CurveLatency):
            return width
        batch = len(trees)
        draft = sum(self.draft_s.get(m, 0.0) for m in methods)
        plain = batch / self.latency.predict(batch)
        widest = 1 + max(p for _, p in trees)
        tokens = self.by_width(trees, widest)
        drafting = max(tokens[w - 1] / (self.latency.predict(batch * w) + draft) for w in range(2, widest + 1))
        if drafting >= plain * (1 + self.hurdle):
            self.skipped[methods] = self.misses[methods] = 0
            self.drafted += 1
            if self.drafted >= 2 * EXPLORE_EVERY and self.latency.seen(batch) < 0.5:
                self.drafted = 0  # a plain pass of this batch, to measure what drafting is weighed against
                return 0
            return max(width, 1)
        self.drafted = 0
        self.skipped[methods] += 1
        # the acceptance may have changed with the text: look again, less often after each look
        # that did not pay (on the demo's 64-token answers, with `ar` at 7-9 ms on 2 AVX2 cores,
        # looks every 16 steps cost the drafters that never paid ~3-5 %)
        if self.skipped[methods] >= EXPLORE_EVERY << min(self.misses[methods], MAX_BACKOFF):
            self.skipped[methods] = 0
            self.misses[methods] += 1
            return 3
        return 0


def cut_batch(
    budget: BatchBudget, proposals: list[Proposal], methods: list[str], own: set[int]
) -> tuple[list[Proposal], list[tuple[str, int]] | None, int]:
    """Greedy trees of one pass (``methods``: each row's) cut to the width ``budget`` picks. Rows
    in ``own`` size their own trees and keep them whole, unless their drafter priced them
    (``Proposal.gains``, auto): a pass is as wide as its widest row, so what one row drafts costs
    every row, and only the whole batch can say what pays; one priced row alone keeps its own
    choice. -> (proposals, the rows' (method, proposed nodes) but the priced ones, or None when
    nothing was decided; the width)."""
    widest = max(len(p.tree) for p in proposals)
    if widest == 1:  # nothing drafted (the rows' methods say whose skipped step this is)
        return proposals, [(m, 0) for b, m in enumerate(methods) if b not in own], 1
    priced = [b for b in sorted(own) if proposals[b].gains is not None]
    sized = own - set(priced)
    cuttable = len(proposals) - len(sized)
    if cuttable == 0 or (cuttable == 1 and priced):
        return proposals, None, widest
    trees = [(m, len(p.tree) - 1) for m, p in zip(methods, proposals)]
    plain = [t for b, t in enumerate(trees) if b not in own]
    chosen = budget.choose(plain, [proposals[b].gains for b in priced])
    width = max([chosen] + [len(proposals[b].tree) for b in sized])
    return (
        [p if len(p.tree) <= width or b in sized else p.cut(width) for b, p in enumerate(proposals)],
        [t for b, t in enumerate(trees) if b not in priced],
        width,
    )

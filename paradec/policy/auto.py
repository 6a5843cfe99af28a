"""``auto``'s choice: per row and step, which drafter proposes and how much of its tree is
verified, to maximize expected committed tokens per second (ProPD's cost model, generalized from
"how big a tree" to "which drafter, and how big").

For a row in a pass of ``batch`` rows, drafter a with its tree cut to w nodes (root included):

    value(a, w) = E_a(w) / (T(batch * w) / batch + d_a)

- E_a(w) = 1 + sum_{0 < n < w} r_a(n): the expected committed tokens. r_a(n), the chance that
  node n is on the accepted path, is learned online per drafter and context (prompt lookup: the
  size of its chain, which grows with the matched suffix), once for the engine (``Acceptance``:
  it describes this model on this text so far) and once per row (recent steps of this answer),
  the row's estimate shrunk towards the engine's: a code answer and a poem get different choices.
- T(n): the measured pass-cost curve of this CPU and format (``paradec.cpu``), its scale refit
  on the steps measured here. T(batch * w) / batch is a row's share of the pass when every row
  pads to w, as a batch of rows that choose alike does.
- d_a: what drafter a's proposal costs a row a step, measured (prompt lookup: ~0; EAGLE: its
  head's passes; an SSM: its passes): at one row, from a measurement on a made-up context when
  an engine's first `auto` request begins (``factories.draft_costs``), at other group sizes
  starting at 0 so that every drafter is tried. A drafter's
  passes serve every row of its group at once, so a row's share is the step's drafting time over
  the group's rows; ``choose_group`` then drops a drafter that too few of them chose to pay for.

`ar` is w = 1: value 1 / T(batch) / batch; an option that drafts is chosen over it only when its
value is HURDLE (5 %) higher (``policy.budget``). A drafter's statistics forget with its own observations
only, so one tried rarely keeps what was measured of it; a row whose choice has been `ar` for
EXPLORE_EVERY steps tries its next-best drafter once, so statistics that have drifted are seen again.

A model drafter costs something on every step it is offered, chosen or not: its set-up at
admission (EAGLE's head over the prompt), its state kept in step with every commit, the rows
that explore it. One that the engine chose on fewer than RETIRE_SHARE of RETIRE_AFTER row-steps
is retired for the engine (``AutoStats.retired``): no request builds it or offers it until
RETIRE_FOR more row-steps have gone by, then it is offered and judged again. Prompt lookup costs
nothing to offer and is never retired; a datastore's lookups (``rest``) cost ~0.1 ms a row-step
whether chosen or not, so it is retired like a model drafter.

Every input is known before the step's draws, so the output stays the target's: token for token in greedy mode,
in distribution when sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from paradec.cpu import PassCost
from paradec.policy.budget import HURDLE, Acceptance
from paradec.policy.dynamic import CurveLatency, LatencyModel

EXPLORE_EVERY = 48  # steps of `ar` in a row after which a row tries its next-best drafter once
ROW_WEIGHT = 4.0  # the engine's rate counts as this many of the row's own observations
ROW_DECAY = 0.9  # a row's own statistics forget fast: the text changes within an answer
RETIRE_AFTER = 64  # row-steps a model drafter is offered (its cost measured first) before the engine judges it
RETIRE_SHARE = 0.01  # chosen (on value, not to explore) on fewer of them: retired ...
RETIRE_FOR = 4096  # ... for this many of the engine's row-steps
FREE = frozenset({"pld"})  # drafters that cost nothing to offer: never retired
# drafters whose proposal is a row's own lookup (no passes shared by a group's rows): never dropped for a group
PER_ROW = frozenset({"pld", "rest"})
# the lookups' prior chance that a chain's first node is accepted (each next one, given its parent:
# PRIOR_ACCEPT, 0.6, as every drafter's): a chain a row declines is scored for free (``Shadow``), so
# `auto` need not verify chains in a new context to learn whether they pay, and a new engine
# verified them at a loss until it had (the demo's 64-token answers: 0.93x `ar` at 0.6, 0.95x at
# 0.3). Not lower: at 0.15 the datastore was chosen on too few of its first 64 row-steps and
# retired for the engine (RETIRE_SHARE) in one of two Spec-Bench runs, taking its gains with it
LOOKUP_PRIORS = dict.fromkeys(PER_ROW, 0.3)


@dataclass(frozen=True)
class Option:
    """One way a row may draft this step: ``drafter`` proposing ``size`` nodes past the root, in
    ``context`` (a key of its statistics)."""

    drafter: str
    size: int
    context: int = 0


@dataclass(frozen=True)
class Choice:
    drafter: str
    width: int  # nodes verified, root included (1: nothing drafted)
    context: int = 0
    value: float = 0.0  # expected committed tokens per second of the row
    explored: bool = False  # taken to look again (EXPLORE_EVERY), not because it was the best
    expected: float = 1.0  # expected committed tokens of the row
    rates: tuple[float, ...] = ()  # [node 1, ..., node size]: each node's chance to be accepted, as priced


@dataclass
class AutoStats:
    """What ``auto`` learns about this model on this machine, shared by every request of an engine:
    acceptance by drafter and context, the pass latency, each drafter's own cost per step."""

    curve: PassCost | None = None
    frozen: bool = False  # deterministic: no timings, no curve, so the choice follows the tokens alone
    accept: Acceptance = field(default_factory=lambda: Acceptance(per_key=True, priors=LOOKUP_PRIORS))
    # (drafter, rows of its group) -> seconds per row-step (recent average): a drafter's passes serve
    # all of a group's rows, so a row's share depends on how many there are, and a share measured at
    # one size never reprices another (EAGLE's 6.4 ms a row alone kept it out of groups of 4 for good)
    draft_s: dict[tuple[str, int], float] = field(default_factory=dict)
    steps: int = 0  # row-steps this engine has chosen for
    offered: dict[str, int] = field(default_factory=dict)  # model drafter -> row-steps offered (this term)
    chosen: dict[str, int] = field(default_factory=dict)  # ... and chosen on value
    retired: dict[str, int] = field(default_factory=dict)  # model drafter -> the row-step it is offered again
    rate: float = 0.0  # tokens per second of a pass shared with other groups' rows (recent average; 0: none yet)
    overhead: float = 0.0  # seconds a row's step costs besides the pass and drafting: accepting, committing
    hurdle: float = HURDLE  # how much more per second drafting must be expected to commit than `ar`

    def __post_init__(self) -> None:
        self.latency = CurveLatency(self.curve) if self.curve is not None else LatencyModel()
        self._shapes: dict[int, list[float]] = {}  # batch -> ``shares``' unscaled list

    def pass_s(self, positions: int) -> float:
        if self.frozen:  # no measurement of any kind (this CPU's curve neither): every width costs the same
            return 1.0
        return self.latency.predict(positions)

    def shares(self, batch: int, widest: int) -> tuple[float, list[float]]:
        """(scale, [0, s_1, ..., s_widest] at least): a row's share of a pass of ``batch`` rows that
        all pad to w tokens is scale * s_w seconds. The list is kept across passes (a pass moves its
        own size's factor only, ``CurveLatency``; the scale, each pass): `auto` prices every option
        of every row with it, between passes, when the pass has evicted Python's data from the cache."""
        if self.frozen:
            return 1.0, [0.0, *([1.0 / batch] * widest)]
        curve = isinstance(self.latency, CurveLatency)
        got = self._shapes.setdefault(batch, [0.0])
        shape = self.latency.shaped if curve else self.latency.predict
        got.extend(shape(batch * w) / batch for w in range(len(got), widest + 1))
        return (self.latency.scale() if curve else 1.0), got

    def observe_pass(self, positions: int, seconds: float) -> None:
        if not self.frozen:
            self.latency.observe(positions, seconds)
            if not isinstance(self.latency, CurveLatency):
                self._shapes.clear()  # a fit of every size at once
                return
            for batch, got in self._shapes.items():  # the one size whose factor moved
                w, left = divmod(positions, batch)
                if not left and w < len(got):
                    got[w] = self.latency.shaped(positions) / batch

    def observe_overhead(self, seconds: float, decay: float = 0.9) -> None:
        """A row's share of a step's time outside the pass and the drafting (recent average)."""
        if not self.frozen:
            self.overhead = self.overhead * decay + seconds * (1 - decay) if self.overhead else seconds

    def observe_rate(self, tokens: int, seconds: float, decay: float = 0.8) -> None:
        """A step of a pass shared with other groups committed ``tokens`` (all its rows') in ``seconds``."""
        if not self.frozen and seconds > 0:
            self.rate = self.rate * decay + tokens / seconds * (1 - decay) if self.rate else tokens / seconds

    def offers(self, drafter: str) -> bool:
        """Whether ``drafter`` is offered now (not retired, or its term is over)."""
        return self.retired.get(drafter, 0) <= self.steps

    def tally(self, offered: list[str], choice: Choice) -> None:
        """One row-step: the model drafters it offered and what it chose; retires those the engine
        keeps not choosing (see the module's docstring)."""
        self.steps += 1
        if self.frozen:  # a deterministic call: its choices follow its own tokens alone
            return
        for name in offered:
            if name in FREE:
                continue
            self.offered[name] = self.offered.get(name, 0) + 1
            if choice.drafter == name and not choice.explored:
                self.chosen[name] = self.chosen.get(name, 0) + 1
            if self.offered[name] >= RETIRE_AFTER:
                if self.chosen.get(name, 0) < RETIRE_SHARE * self.offered[name]:
                    self.retired[name] = self.steps + RETIRE_FOR
                self.offered[name] = self.chosen[name] = 0

    def observe_draft(self, drafter: str, seconds: float, rows: int = 1, decay: float = 0.8) -> None:
        if not self.frozen:
            key = (drafter, rows)
            self.draft_s[key] = self.draft_s.get(key, seconds) * decay + seconds * (1 - decay)

    def seed_draft_costs(self, seconds: dict[str, float]) -> None:
        """Each drafter's step at one row, measured before any row tried it (``factories.draft_costs``)."""
        if not self.frozen:
            for drafter, s in seconds.items():
                self.draft_s.setdefault((drafter, 1), s)

    def draft_cost(self, drafter: str, rows: int = 1) -> float:
        """A row's share of ``drafter``'s step in a group of ``rows`` (0 until measured: tried first)."""
        return 0.0 if self.frozen else self.draft_s.get((drafter, rows), 0.0)


class RowStats:
    """One row's own acceptance, shrunk towards the engine's (``ROW_WEIGHT``). It forgets with the
    row's steps (``tick``), not with its observations: a row whose drafts failed twice would
    otherwise choose `ar` and, observing nothing more, keep that verdict for the rest of its answer."""

    def __init__(self, shared: Acceptance) -> None:
        self.shared = shared
        self.own = Acceptance(1.0, per_key=True)  # counts in units of ``unit``
        self.plain = 0  # steps in a row that chose `ar`
        # what one observation adds to ``own`` now: 1 / ROW_DECAY more each step, which weighs the
        # earlier counts ROW_DECAY as much a step without touching them (a step's pass over every
        # count had cost ~20 us of each row's Python between passes)
        self.unit = 1.0

    def tick(self) -> None:
        """One step of the row went by: its own counts weigh ``ROW_DECAY`` as much."""
        self.unit /= ROW_DECAY
        if self.unit > 1e30:  # rescaled now and then (every ~650 steps), long before floats run out
            for counts in (self.own.hits, self.own.trials):
                for k in counts:
                    counts[k] = [c / self.unit for c in counts[k]]
            self.unit = 1.0

    def rates(self, key: tuple, nodes: int) -> list[float]:
        """[rate of node 1, ..., node ``nodes``]: the row's own counts over the engine's rates."""
        shared, unit = self.shared.rates(key, nodes), self.unit
        hits, trials = self.own.hits.get(key, ()), self.own.trials.get(key, ())
        seen = len(trials)  # nodes past it: no counts of the row's own
        return [
            ((hits[n] if n < seen else 0.0) / unit + ROW_WEIGHT * prior)
            / ((trials[n] if n < seen else 0.0) / unit + ROW_WEIGHT)
            for n, prior in enumerate(shared)
        ]

    def expected(self, key: tuple, nodes: int) -> float:
        return 1.0 + sum(self.rates(key, nodes))

    def observe(self, key: tuple, offered: int, accepted: list[int]) -> None:
        self.own.observe(key, offered, accepted, self.unit)
        self.shared.observe(key, offered, accepted)


def choose(stats: AutoStats, row: RowStats, options: list[Option], batch: int, rows: int = 1) -> Choice:
    """The row's best option and width by expected committed tokens per second (see the module's
    docstring), in a group of ``rows``; after EXPLORE_EVERY choices of `ar` in a row, the best
    option that drafts."""
    best, runner_up = _rank(stats, row, options, batch, rows)
    row.plain = row.plain + 1 if best.drafter == "ar" else 0
    if row.plain >= EXPLORE_EVERY and runner_up is not None:  # look again at what is not run
        row.plain = 0
        return replace(runner_up, explored=True)
    return best


def choose_group(stats: AutoStats, rows: list[RowStats], options: list[list[Option]], batch: int) -> list[Choice]:
    """One step of a group of rows whose model drafters each run once for all of its rows
    (``draft_s``: a drafter's time per row of the group): every row's ``choose``, then each model
    drafter that was chosen is dropped where the group commits more tokens per second without it.
    A drafter's passes cost the group as much for one row as for all of them, and a wider tree
    widens the whole padded pass, so a drafter that pays when every row takes it may not pay for
    one row alone (at 4 rows, EAGLE's head passes cost a row 10 ms against its 11 ms share of the
    pass when charged to the one row that chose it, and auto chose it on 1 step of 500)."""
    n = len(rows)
    choices = [choose(stats, row, opts, batch, n) for row, opts in zip(rows, options)]
    for arm in sorted({c.drafter for c in choices} - PER_ROW - {"ar"}):
        if any(c.explored for c in choices if c.drafter == arm):
            continue  # a row looking again pays for it on purpose
        without = [
            c if c.drafter != arm else _rank(stats, row, [o for o in opts if o.drafter != arm], batch, n)[0]
            for c, row, opts in zip(choices, rows, options)
        ]
        if _group_value(stats, without, batch) > _group_value(stats, choices, batch):
            choices = without
    return choices


def _rank(
    stats: AutoStats, row: RowStats, options: list[Option], batch: int, rows: int = 1
) -> tuple[Choice, Choice | None]:
    """(the best choice, the best that drafts or None) for one row of a group of ``rows``; no
    bookkeeping. Where other groups' rows share the pass (a server's requests), a row whose best
    rate is below the pass's (``AutoStats.rate``) takes the option that costs the pass least:
    its drafting runs before the pass and holds up every row, so it pays only at the pass's rate
    (e.g. 0.8 more tokens for a 6 ms head beside rows whose pass commits 170 tokens a second: more
    than `ar` is worth to the row, less than those 6 ms are worth to the pass).

    It runs for every row at every step, so it keeps to plain floats and tuples (value, expected
    tokens, option, width) and builds a ``Choice`` only for what it returns."""
    widest = 1 + max((opt.size for opt in options), default=0)
    scale, share = stats.shares(batch, widest)  # a row's share of a pass padded to w: scale * share[w]
    plain = (1.0 / (scale * share[1] + stats.overhead), 1.0, None, 1, ())
    best, runner_up, every = plain, None, [plain]
    bar = plain[0] * (1 + (0.0 if stats.frozen else stats.hurdle))  # what a drafting option must beat (HURDLE)
    for opt in options:
        cost = stats.draft_cost(opt.drafter, rows) + stats.overhead
        gained = 0.0
        rates = tuple(row.rates((opt.drafter, opt.context), opt.size))
        for w, rate in enumerate(rates, 2):
            gained += rate
            value = (1.0 + gained) / (scale * share[w] + cost)
            every.append((value, 1.0 + gained, opt, w, rates))
            if value > max(best[0], bar) * (1 + 1e-9):
                best = every[-1]
            if runner_up is None or value > runner_up[0]:
                runner_up = every[-1]
    rate = stats.rate if batch > rows else 0.0
    if rate > best[0]:  # each option's tokens less what its seconds would commit at the pass's rate
        best = max(every, key=lambda c: c[1] - rate * c[1] / c[0])
    return _choice(best), None if runner_up is None else _choice(runner_up)


def _choice(ranked: tuple[float, float, Option | None, int, tuple[float, ...]]) -> Choice:
    value, expected, opt, width, rates = ranked
    if opt is None:
        return Choice("ar", 1, 0, value)
    return Choice(opt.drafter, width, opt.context, value, expected=expected, rates=rates)


def _group_value(stats: AutoStats, choices: list[Choice], batch: int) -> float:
    """Expected committed tokens per second of a group making ``choices`` in a pass of ``batch``
    rows: its share of the pass padded to its widest tree, plus each model drafter it runs."""
    n = len(choices)
    drafters = {c.drafter for c in choices} - PER_ROW - {"ar"}
    drafting = n * sum(stats.draft_cost(d, n) for d in drafters)
    seconds = stats.pass_s(batch * max(c.width for c in choices)) * n / batch + drafting + n * stats.overhead
    return sum(c.expected for c in choices) / seconds

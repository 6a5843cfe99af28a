"""ProPD's cost model over a pass (``policy.budget``): greedy draft trees are cut to the width that
pays on the measured pass-cost curve, and the output stays `ar`'s; the drafting hurdle that every
cost model shares (the budget, ProPD's, EAGLE's)."""

from __future__ import annotations

import pytest

import paradec
from paradec.cpu import PassCost
from paradec.draft.eagle import EagleCostModel
from paradec.policy.budget import EXPLORE_EVERY, HURDLE, MAX_BACKOFF, BatchBudget
from paradec.policy.dynamic import CurveLatency, TreePolicy

# repetitive prompts: prompt lookup finds long matches, so chains are long and differ by row
PROMPTS = ["a b c d e f g a b c d e f g a b c", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n", "def f(x):\n    return x\n"]


@pytest.fixture(scope="module")
def engine(llama_dir):
    return paradec.load(llama_dir, dtype="fp32", cost=PassCost.flat())


class Fixed(BatchBudget):
    """A budget that always picks ``width`` (and records what it was asked)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.asked, self.priced = width, [], []

    def choose(self, chains, priced=()):
        self.asked.append(chains)
        self.priced.append(priced)
        return self.width


@pytest.mark.parametrize("width", [1, 2, 3])
def test_cut_chains_keep_ar_output(engine, width):
    ar = engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True)
    engine.budget = Fixed(width)
    try:
        cut = engine.generate(PROMPTS, method="pld", max_new_tokens=40, ignore_eos=True)
        asked = engine.budget.asked
    finally:
        engine.budget = BatchBudget()
    assert [g.token_ids for g in cut] == [g.token_ids for g in ar]
    assert asked and all(len(chains) == len(PROMPTS) for chains in asked)
    assert max(p for chains in asked for _, p in chains) > width - 1  # some chain was longer than the cut
    assert all(g.stats.verified <= g.stats.steps * width for g in cut)  # no pass verified more than width
    assert sum(g.stats.nodes for g in cut) > sum(g.stats.verified for g in cut)


def test_auto_prices_its_rows_and_the_batch_cuts_them(engine):
    """A pass is as wide as its widest row: auto hands the budget what each of its rows expects at
    each width, the budget cuts the batch, and auto learns from every node it proposed, the ones
    the cut left out scored by the tokens that follow (``tree.shadow``)."""
    ar = engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True)
    engine.policies.pop(("auto",), None)
    engine.budget = Fixed(2)
    try:
        out = engine.generate(PROMPTS, method="auto", max_new_tokens=40, ignore_eos=True)
        trials = dict(engine.policies[("auto",)].accept.trials)  # (drafter, context) -> times verified, by node
        solo = engine.generate(PROMPTS[0], method="auto", max_new_tokens=40, ignore_eos=True)
        priced = [tables for tables in engine.budget.priced if tables]
    finally:
        engine.budget = BatchBudget(PassCost.flat())
    assert [g.token_ids for g in out] == [g.token_ids for g in ar] and solo.token_ids == ar[0].token_ids
    assert priced and all(len(tables) == len(PROMPTS) for tables in priced)  # never asked for one row alone
    assert any(len(t) > 2 for tables in priced for t in tables)  # a row wanted more than the cut
    assert all(t[0] == 1.0 and t == sorted(t) for tables in priced for t in tables)  # tokens expected by width
    assert all(g.stats.verified <= g.stats.steps * 2 for g in out)
    assert max(n for counts in trials.values() for n, v in enumerate(counts, 1) if v > 0) > 1  # cut to 2, scored past


def test_the_budget_is_asked_at_batch_1_but_never_when_sampling(engine):
    engine.budget = Fixed(1)
    try:
        solo = engine.generate(PROMPTS[0], method="pld", max_new_tokens=24, ignore_eos=True)
        asked = list(engine.budget.asked)
        sampled = engine.generate(PROMPTS, method="pld", max_new_tokens=8, temperature=0.8, seed=0)
        assert len(engine.budget.asked) == len(asked)  # sampling: never cut by value
        assert asked and all(len(trees) == 1 for trees in asked)
        assert solo.stats.verified == solo.stats.steps  # width 1: the root alone, as `ar`
        assert len(sampled) == len(PROMPTS)
    finally:
        engine.budget = BatchBudget(PassCost.flat())
    ar = engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True)
    pld = engine.generate(PROMPTS, method="pld", max_new_tokens=40, ignore_eos=True)
    assert [g.token_ids for g in pld] == [g.token_ids for g in ar]


def test_trees_are_cut_to_a_prefix_and_keep_ar_output(llama_dir, drafters):
    """SpecInfer's expansion tree (not a chain) cut to its first 1..4 nodes, batch 1 and 3."""
    draft, _ = drafters
    eng = paradec.load(llama_dir, dtype="fp32", drafts=[draft], cost=PassCost.flat())
    ar = eng.generate(PROMPTS, max_new_tokens=24, ignore_eos=True)
    for width in (2, 4):
        eng.budget = Fixed(width)
        out = eng.generate(PROMPTS, method="specinfer", expansion=[2, 2, 1], max_new_tokens=24, ignore_eos=True)
        solo = eng.generate(PROMPTS[1], method="specinfer", expansion=[2, 2, 1], max_new_tokens=24, ignore_eos=True)
        assert [g.token_ids for g in out] == [g.token_ids for g in ar] and solo.token_ids == ar[1].token_ids
        assert all(g.stats.verified <= g.stats.steps * width < g.stats.nodes for g in out)


def test_a_steep_curve_falls_back_toward_ar_and_a_flat_one_verifies_every_chain(llama_dir):
    """Where one more verified position costs an `ar` step, prompt lookup's unsure chains are not
    verified (only the periodic look past the root); where positions are free, all of them are."""
    steep = paradec.load(llama_dir, dtype="fp32", cost=PassCost("steep", (1, 2, 4, 8), (0.01, 0.02, 0.04, 0.08)))
    flat = paradec.load(llama_dir, dtype="fp32", cost=PassCost.flat())
    ar = steep.generate(PROMPTS[2], max_new_tokens=40, ignore_eos=True)
    s = steep.generate(PROMPTS[2], method="pld", num_draft=6, max_new_tokens=40, ignore_eos=True)
    f = flat.generate(PROMPTS[2], method="pld", num_draft=6, max_new_tokens=40, ignore_eos=True)
    assert s.token_ids == f.token_ids == ar.token_ids
    assert s.stats.verified - s.stats.steps <= 2 * (s.stats.steps // EXPLORE_EVERY + 1)
    assert f.stats.verified == f.stats.nodes > f.stats.steps


def test_a_width_that_gains_less_than_the_hurdle_is_not_verified():
    """A node accepted 74 % of the time, where 2 tokens cost 1.7 steps: 2 % more tokens per second
    on paper, not verified (at hurdle 0: verified); accepted 90 % of the time: verified."""
    curve = PassCost("llamacpp-like", (1, 2, 4), (0.010, 0.017, 0.0266))
    for rate, hurdle, width in ((0.74, HURDLE, 1), (0.74, 0.0, 2), (0.9, HURDLE, 2)):
        budget = BatchBudget(curve)
        budget.hurdle = hurdle
        for i in range(400):
            budget.observe("pld", 1, 1, [1] if i * 7919 % 1000 < rate * 1000 else [])
        assert budget.choose([("pld", 1)]) == width, (rate, hurdle)


def test_the_budget_never_pads_a_pass_to_explore():
    """Chains that never get accepted: the root alone, every step, where positions cost and where
    they are free; what a cut leaves out is scored by what the rows commit (the next test), so no
    pass verifies 2 more nodes now and then to learn it (on 2 AVX2 cores a pass of 4 rows x 3
    nodes cost 2.1 plain ones)."""
    steep = PassCost("avx2-like", (1, 4, 8, 16), (0.028, 0.040, 0.064, 0.109))
    for curve in (steep, PassCost.flat()):
        budget = BatchBudget(curve)
        for _ in range(200):
            budget.observe("pld", 2, 2, [])
        assert {budget.choose([("pld", 2)] * 4) for _ in range(320)} == {1}, curve.format
    priced = BatchBudget(steep)
    assert {priced.choose([], [[1.0, 1.1, 1.15]] * 4) for _ in range(320)} == {1}


class Watching(Fixed):
    """Verifies the root alone and records what it learns (``observe``)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.seen = []

    def observe(self, method, proposed, offered, accepted):
        self.seen.append((method, proposed, offered, tuple(accepted)))
        super().observe(method, proposed, offered, accepted)


def test_nodes_the_budget_cuts_are_scored_by_what_the_row_commits(engine, monkeypatch):
    """Prompt lookup's chains, cut to the root: every one whose fate the answer decides is scored
    in full, as verifying it whole would have scored it (its first tokens that the answer goes
    on with), though no pass verified a node of it."""
    from paradec.draft import TreeDrafter

    chains = []
    propose = TreeDrafter.propose

    def spy(self, sequences, generators):
        out = propose(self, sequences, generators)
        chains.append(list(out[0].tree.tokens[1:]) if out[0].tree.is_chain else None)
        return out

    monkeypatch.setattr(TreeDrafter, "propose", spy)
    engine.budget = Watching()
    try:
        out = engine.generate(PROMPTS[1], method="pld", max_new_tokens=40, ignore_eos=True)
        seen = engine.budget.seen
    finally:
        engine.budget = BatchBudget(PassCost.flat())
    ids = out.token_ids
    assert out.stats.verified == out.stats.steps == len(ids)  # the root alone: one token a step
    want = []
    for t, chain in enumerate(chains):  # the chain drafted at step t guesses ids[t], ids[t + 1], ...
        assert chain is not None
        hits = 0
        while hits < len(chain) and t + hits < len(ids) and chain[hits] == ids[t + hits]:
            hits += 1
        if chain and (hits == len(chain) or t + hits < len(ids)):  # decided within the answer
            want.append(("pld", len(chain), len(chain), tuple(range(1, hits + 1))))
    drafted = sorted(o for o in seen if o[1])
    assert drafted == sorted(want) and sum(len(o[3]) for o in drafted) > 10  # and many nodes were on the path
    assert len(seen) - len(drafted) == sum(1 for c in chains if not c)  # a step that drafted nothing: seen as one


def test_eagles_cost_model_verifies_no_draft_that_gains_less_than_the_hurdle():
    """EAGLE's cost model, as the budget's: a node of path confidence 0.8 accepted 74 % of the time,
    where 2 tokens cost 1.7 steps, is 2 % more tokens per second on paper: not verified (at hurdle
    0: verified); accepted 90 % of the time: verified."""
    curve = PassCost("llamacpp-like", (1, 2, 4), (0.010, 0.017, 0.0266))
    for rate, hurdle, nodes in ((0.74, HURDLE, 0), (0.74, 0.0, 1), (0.9, HURDLE, 1)):
        cost = EagleCostModel(curve=curve)
        cost.hurdle = hurdle
        for i in range(400):
            cost.observe(0.8, i * 7919 % 1000 < rate * 1000)
        assert cost.choose(1, [[0.8]]) == nodes, (rate, hurdle)


def test_propds_cost_model_drafts_no_tree_that_gains_less_than_the_hurdle():
    """ProPD's cost model, as the budget's: a head guess accepted 74 % of the time, where 2 tokens
    cost 1.7 steps, is 2 % more tokens per second on paper: no tree (at hurdle 0: one node); 90 %: one node."""
    curve = PassCost("llamacpp-like", (1, 2, 4), (0.010, 0.017, 0.0266))
    for score, hurdle, nodes in ((0.74, HURDLE, 0), (0.74, 0.0, 1), (0.9, HURDLE, 1)):
        policy = TreePolicy([[0.5]], curve=curve)
        policy.hurdle = hurdle
        assert policy.choose(1, {0: [[score]]}) == nodes, (score, hurdle)


def test_curve_latency_keeps_the_shape_and_learns_the_scale():
    curve = PassCost("c", (1, 4, 16), (0.010, 0.020, 0.080))
    lat = CurveLatency(curve)
    assert lat.predict(4) == pytest.approx(0.020) and lat.predict(10) == pytest.approx(0.050)
    for _ in range(50):
        lat.observe(1, 0.030)  # passes run 3x the curve (a longer context, a busier machine)
    assert lat.predict(16) == pytest.approx(0.240)
    assert curve.predict(32) == pytest.approx(0.160)  # beyond the last width: the last slope
    assert PassCost.flat().relative(64) == 1.0


def test_a_measured_curve_learns_the_cost_of_each_pass_size_it_sees():
    """A load-time curve flat from 1 to 4 tokens, real passes of 4 costing 1.5x one: the budget's
    latency learns both sizes; a curve given by hand keeps its shape."""
    flat = (1, 4, 16), (0.010, 0.010, 0.040)
    measured, given = CurveLatency(PassCost("m", *flat, measured=True)), CurveLatency(PassCost("g", *flat))
    for _ in range(30):
        for lat in (measured, given):
            lat.observe(1, 0.010)
            lat.observe(4, 0.015)
    assert measured.predict(4) / measured.predict(1) == pytest.approx(1.5, rel=0.1)
    assert given.predict(4) == given.predict(1)
    assert measured.predict(16) / given.predict(16) == pytest.approx(1.0, rel=0.05)  # unseen: the overall scale


def test_a_pass_size_seen_rarely_keeps_what_its_own_passes_cost():
    """A size's factor on the scaled curve forgets with its own passes only: 4-token passes that
    cost 1.5x one are still priced so after 200 one-token passes (before, each pass aged every
    size's mean, and a size chosen rarely fell back to the curve's shape)."""
    lat = CurveLatency(PassCost("m", (1, 4, 16), (0.010, 0.010, 0.040), measured=True))
    for _ in range(20):
        lat.observe(1, 0.010)
        lat.observe(4, 0.015)
    for _ in range(200):
        lat.observe(1, 0.010)
    assert lat.predict(1) == pytest.approx(0.010, rel=0.05)
    assert lat.predict(4) / lat.predict(1) == pytest.approx(1.5, rel=0.15)  # shrunk a little to the curve
    assert lat.seen(4) < 0.1 < lat.seen(1)  # ... though it was not seen lately


def test_a_budget_that_drafts_takes_a_plain_pass_to_time_what_drafting_is_weighed_against():
    budget = BatchBudget(PassCost("m", (1, 8), (0.010, 0.010), measured=True))
    for _ in range(20):
        budget.observe("pld", 4, 4, [1, 2, 3, 4])  # chains accepted whole: drafting pays
    widths = [budget.next_width([("pld", 4)], 5) for _ in range(2 * EXPLORE_EVERY)]
    assert widths[:-1] == [5] * (2 * EXPLORE_EVERY - 1) and widths[-1] == 0
    budget.observe_pass(1, 0.010)  # that plain pass, timed
    assert 0 not in [budget.next_width([("pld", 4)], 5) for _ in range(2 * EXPLORE_EVERY)]


def test_skipped_drafting_looks_again_less_often_while_looks_do_not_pay():
    """A drafter whose chains are never accepted and whose drafting costs a pass: skipped, with
    a look (3 nodes) after 16, 32, 64, 128, 128 ... skipped steps; once a look finds chains
    accepted again, drafting resumes and the next streak starts at 16 again."""
    budget = BatchBudget(PassCost("m", (1, 8), (0.010, 0.010), measured=True))
    budget.observe_draft("ssm", 0.010)
    for _ in range(20):
        budget.observe("ssm", 4, 4, [])
    looks, step = [], 0
    while len(looks) < MAX_BACKOFF + 3:
        step += 1
        if budget.next_width([("ssm", 4)], 5) == 3:
            looks.append(step)
            budget.observe("ssm", 4, 2, [])  # what the look verified: nothing accepted
    gaps = [b - a for a, b in zip([0, *looks], looks)]
    assert gaps == [EXPLORE_EVERY << min(i, MAX_BACKOFF) for i in range(len(gaps))]
    for _ in range(40):
        budget.observe("ssm", 4, 4, [1, 2, 3, 4])  # the text changed: chains accepted whole
    assert budget.next_width([("ssm", 4)], 5) == 5
    budget.observe_draft("ssm", 1.0)  # drafting got slow: skipped again, the first look after 16
    widths = [budget.next_width([("ssm", 4)], 5) for _ in range(EXPLORE_EVERY)]
    assert widths == [0] * (EXPLORE_EVERY - 1) + [3]


def test_a_new_request_of_a_skipped_method_starts_skipped_and_its_looks_go_on_backing_off():
    """The engine's verdict carries over: a method whose drafting is skipped starts its next
    request skipped (``standing`` 0, not a full tree at its first step), and its skipped steps and
    looks go on counting from the last request (it does not look again after 16 steps of every
    new one); another method's rows (and its skipped steps) do not touch it."""
    budget = BatchBudget(PassCost("m", (1, 8), (0.010, 0.010), measured=True))
    budget.observe_draft("ssm", 0.010)
    for _ in range(20):
        budget.observe("ssm", 4, 4, [])
    assert budget.standing("ssm") is None  # nothing decided yet
    looks = []
    for step in range(1, 3 * EXPLORE_EVERY + 11):  # skipped, two looks that did not pay, 10 steps since
        if budget.next_width([("ssm", 4)], 5) == 3:
            looks.append(step)
            budget.observe("ssm", 4, 2, [])
    assert looks == [EXPLORE_EVERY, 3 * EXPLORE_EVERY]
    assert budget.next_width([("pld", 0)], 1) == 1  # a pld row that drafted nothing: no verdict of its own
    assert budget.standing("pld") is None and budget.standing("ssm") == 0
    widths = [budget.next_width([("ssm", 0)], 1) for _ in range(4 * EXPLORE_EVERY)]  # the new request's steps
    assert widths.index(3) == 4 * EXPLORE_EVERY - 10 - 1 and widths.count(3) == 1  # 64 steps after the last look


def _budget(base_s: float, per_position_s: float) -> BatchBudget:
    """A budget whose latency line is fit, with 12-token chains always accepted in full and
    2-token ones never."""
    budget = BatchBudget()
    budget.probe.clear()
    for positions in (16, 32, 64, 128):
        budget.observe_pass(positions, base_s + per_position_s * positions)
    for _ in range(200):
        budget.observe("pld", 12, 12, list(range(1, 13)))
        budget.observe("pld", 2, 2, [])
    return budget


def test_budget_widens_for_chains_that_get_accepted_and_narrows_when_positions_cost():
    costly = _budget(0.010, 0.001)  # a verified position costs a tenth of the pass's base
    assert costly.rate("pld", 12, 5) > 0.9 and costly.rate("pld", 2, 1) < 0.1
    assert costly.choose([("pld", 12)] * 16) >= 10  # sure chains pay for their positions
    assert costly.choose([("pld", 2)] * 16) == 1  # unsure ones do not
    mixed = [("pld", 12)] * 4 + [("pld", 2)] * 12  # 4 sure rows cannot pay for 16 rows' padding ...
    assert costly.choose(mixed) == 1
    assert _budget(0.030, 0.0003).choose(mixed) >= 10  # ... unless positions are cheap
    free = BatchBudget()
    free.probe.clear()
    for positions in (16, 32, 64):
        free.observe_pass(positions, 0.010)
    assert free.choose([("pld", 2)] * 16) == 3  # positions that cost nothing: every chain in full


class Skipping(BatchBudget):
    """Tells the drafters to skip drafting on two steps of every three (``next_width`` 0)."""

    def __init__(self) -> None:
        super().__init__(PassCost.flat())
        self.steps = 0

    def next_width(self, trees, width):
        self.steps += 1
        return 0 if self.steps % 3 else width


@pytest.mark.parametrize(
    "method, opts",
    [
        ("specinfer", {"expansion": [1, 2, 1]}),
        ("medusa", {}),
        ("eagle", {}),
        ("eagle+ngram", {}),
        ("specinfer+ngram", {}),
    ],
)
def test_drafters_that_skip_steps_catch_up_and_keep_ar_output(llama_dir, drafters, tmp_path, method, opts):
    """A drafter told to skip (an SSM's or EAGLE head's state falls behind by the skipped steps'
    tokens) catches up when it drafts again: output identical to `ar`, at batch 1 and 3."""
    import torch

    from paradec.models.eagle import EagleHead

    draft, heads = drafters
    eng = paradec.load(llama_dir, dtype="fp32", drafts=[draft], heads=heads, cost=PassCost.flat())
    torch.manual_seed(0)
    EagleHead(eng.model.config).save(tmp_path / "head", {})
    eng.load_companion("eagle", tmp_path / "head")
    ar = eng.generate(PROMPTS, max_new_tokens=30, ignore_eos=True)
    eng.budget = Skipping()
    out = eng.generate(PROMPTS, method=method, max_new_tokens=30, ignore_eos=True, **opts)
    solo = eng.generate(PROMPTS[0], method=method, max_new_tokens=30, ignore_eos=True, **opts)
    assert [g.token_ids for g in out] == [g.token_ids for g in ar] and solo.token_ids == ar[0].token_ids
    if method != "specinfer+ngram":  # (its prompt lookup drafts on every step: it costs nothing)
        assert all(g.stats.nodes < g.stats.steps * 3 for g in out)  # most steps drafted nothing

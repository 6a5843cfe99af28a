"""ProPD's cost model over a batch (``policy.budget``): batched greedy draft chains are cut to the
width that pays, and the output stays `ar`'s."""

from __future__ import annotations

import pytest

import paradec
from paradec.policy.budget import BatchBudget

# repetitive prompts: prompt lookup finds long matches, so chains are long and differ by row
PROMPTS = ["a b c d e f g a b c d e f g a b c", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n", "def f(x):\n    return x\n"]


@pytest.fixture(scope="module")
def engine(llama_dir):
    return paradec.load(llama_dir, dtype="fp32")


class Fixed(BatchBudget):
    """A budget that always picks ``width`` (and records what it was asked)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.asked = width, []

    def choose(self, chains):
        self.asked.append(chains)
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


def test_the_learned_budget_keeps_ar_output_and_is_not_asked_at_batch_1_or_when_sampling(engine):
    engine.budget = Fixed(1)
    try:
        solo = engine.generate(PROMPTS[0], method="pld", max_new_tokens=24, ignore_eos=True)
        sampled = engine.generate(PROMPTS, method="pld", max_new_tokens=8, temperature=0.8, seed=0)
        assert not engine.budget.asked  # one row: the method's own chain; sampling: never cut by value
        assert solo.stats.verified > solo.stats.steps  # its chains were verified in full
        assert len(sampled) == len(PROMPTS)
    finally:
        engine.budget = BatchBudget()
    ar = engine.generate(PROMPTS, max_new_tokens=40, ignore_eos=True)
    pld = engine.generate(PROMPTS, method="pld", max_new_tokens=40, ignore_eos=True)
    assert [g.token_ids for g in pld] == [g.token_ids for g in ar]


def _budget(base_s: float, per_position_s: float) -> BatchBudget:
    """A budget whose latency line is fit, with 12-token chains always accepted in full and
    2-token ones never."""
    budget = BatchBudget()
    budget.probe.clear()
    for positions in (16, 32, 64, 128):
        budget.observe_pass(positions, base_s + per_position_s * positions)
    for _ in range(200):
        budget.observe("pld", 12, 12, 12)
        budget.observe("pld", 2, 2, 0)
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

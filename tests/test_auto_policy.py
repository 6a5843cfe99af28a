"""`auto`'s choice (``policy.auto``) on made-up statistics and pass-cost curves: which drafter and
how wide, per row, per group, beside other requests; how a row's own statistics forget and when
a drafter is retired. The engine-level behaviour is in tests/test_auto.py."""

from __future__ import annotations

import pytest

from paradec.cpu import PassCost
from paradec.policy import auto as policy
from paradec.policy.auto import (
    EXPLORE_EVERY,
    RETIRE_AFTER,
    RETIRE_FOR,
    AutoStats,
    Option,
    RowStats,
    choose,
    choose_group,
)
from paradec.policy.budget import HURDLE

N_NEW = 24
REPEATS = ["a b c d e f g a b c d e f g a b c", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"]


# ---- the choice ---------------------------------------------------------------------------------
def steep_curve() -> PassCost:
    """8 positions cost 3.8 `ar` steps (an AVX2 core without native bf16, roughly)."""
    return PassCost("steep", (1, 64), (0.01, 0.01 + 63 * 0.004))


def proportional() -> PassCost:
    """A pass costs in proportion to its positions: no draft can pay."""
    return PassCost("proportional", (1, 64), (0.01, 0.64))


def knee(at: int = 16) -> PassCost:
    """Flat up to ``at`` positions, then linear (a wide core: a few positions cost one)."""
    return PassCost("knee", (1, at, 4 * at), (0.01, 0.01, 0.04))


def learned(stats: AutoStats, drafter: str, context: int, rate: float, nodes: int = 16, n: int = 200) -> None:
    """``n`` observations of a chain whose node k is accepted with probability ``rate`` ** k."""
    for i in range(n):
        depth = 0
        while depth < nodes and (i * 7919 + depth * 104729) % 1000 < rate * 1000:
            depth += 1
        stats.accept.observe((drafter, context), nodes, list(range(1, depth + 1)))


def test_a_flat_curve_verifies_a_sure_chain_whole_and_a_steep_one_only_what_pays():
    flat, steep = AutoStats(PassCost.flat()), AutoStats(steep_curve())
    for stats in (flat, steep):
        learned(stats, "pld", 4, 0.95)
        learned(stats, "eagle", 0, 0.3)
    options = [Option("pld", 16, 4), Option("eagle", 8)]
    assert choose(flat, RowStats(flat.accept), options, 1).drafter == "pld"
    assert choose(flat, RowStats(flat.accept), options, 1).width == 17
    # steep: pld's sure chain pays for a few nodes, eagle's unsure tree for none
    pick = choose(steep, RowStats(steep.accept), options, 1)
    assert pick.drafter == "pld" and 2 <= pick.width < 17
    assert choose(steep, RowStats(steep.accept), [Option("eagle", 8)], 1).drafter == "ar"


def test_a_draft_that_gains_less_than_the_hurdle_is_not_taken():
    """On llama.cpp's AVX2 curve (2 tokens cost 1.7 steps) a chain node accepted 74 % of the time
    is worth 2 % more tokens per second on paper, which its unmodeled costs eat: `ar` (at hurdle 0:
    the chain); one accepted 90 % of the time (12 %) is drafted."""
    curve = PassCost("llamacpp-like", (1, 2, 4), (0.010, 0.017, 0.0266))
    for rate, hurdle, drafter in ((0.74, HURDLE, "ar"), (0.74, 0.0, "pld"), (0.9, HURDLE, "pld")):
        stats = AutoStats(curve, hurdle=hurdle)
        learned(stats, "pld", 2, rate, nodes=1, n=400)
        assert choose(stats, RowStats(stats.accept), [Option("pld", 1, 2)], 1).drafter == drafter, (rate, hurdle)


def test_a_drafter_that_costs_more_than_it_saves_is_not_run():
    stats = AutoStats(PassCost.flat())
    learned(stats, "eagle", 0, 0.5)
    assert choose(stats, RowStats(stats.accept), [Option("eagle", 8)], 1).drafter == "eagle"
    stats.draft_s["eagle", 1] = 0.05  # five passes' worth of head passes for ~1 accepted token
    assert choose(stats, RowStats(stats.accept), [Option("eagle", 8)], 1).drafter == "ar"


def test_a_big_batch_drafts_less():
    stats = AutoStats(knee(16))
    learned(stats, "pld", 2, 0.6)
    row = RowStats(stats.accept)
    alone = choose(stats, row, [Option("pld", 8, 2)], 1)
    crowded = choose(stats, row, [Option("pld", 8, 2)], 16)
    # alone, the pass is flat: every node ever accepted is verified (deeper ones never were: rate ~0)
    assert alone.width >= 7 and crowded.drafter == "ar"  # 16 rows x 2 positions are past the knee


def test_a_chain_accepted_whole_looks_one_node_further():
    """A node never verified is priced from its parent's rate: a prompt-lookup match whose 2 drafted
    tokens are always accepted gets a 3rd verified (before: PRIOR_ACCEPT ** 3 kept it at 2 for good)."""
    stats = AutoStats(PassCost("gentle", (1, 64), (0.01, 0.01 + 63 * 0.002)))
    row = RowStats(stats.accept)
    for _ in range(20):
        row.observe(("pld", 4), 2, [1, 2])
    assert choose(stats, row, [Option("pld", 8, 4)], 1).width == 4
    for _ in range(20):  # ... and stops there once the 3rd is seen to fail
        row.observe(("pld", 4), 3, [1, 2])
    assert choose(stats, row, [Option("pld", 8, 4)], 1).width == 3


def test_a_rows_own_counts_forget_with_its_steps():
    """A row's rates are its own counts, each weighed ROW_DECAY ** (steps since), over the
    engine's: written out and compared with what ``RowStats`` keeps (which weighs new counts more
    instead of touching the old ones), over 2,000 random steps (past its rescaling, every ~650)."""
    import random

    rng = random.Random(0)
    stats = AutoStats(steep_curve())
    row = RowStats(stats.accept)
    seen = []  # (step, key, offered, accepted)
    for step in range(2000):
        if rng.random() < 0.6:
            key = ("pld", rng.randint(1, 3))
            offered = rng.randint(1, 4)
            accepted = list(range(1, rng.randint(0, offered) + 1))
            row.observe(key, offered, accepted)
            seen.append((step, key, offered, accepted))
        row.tick()
        if step % 97 == 0 or step == 1999:
            for key in {k for _, k, _, _ in seen}:
                hits, trials = [0.0] * 4, [0.0] * 4
                for when, k, offered, accepted in seen:
                    if k == key:
                        w = policy.ROW_DECAY ** (step + 1 - when)
                        for n in range(1, offered + 1):
                            trials[n - 1] += w
                            hits[n - 1] += w * (n in accepted)
                shared = stats.accept.rates(key, 4)
                want = [(h + policy.ROW_WEIGHT * p) / (t + policy.ROW_WEIGHT) for h, t, p in zip(hits, trials, shared)]
                assert row.rates(key, 4) == pytest.approx(want, rel=1e-9, abs=1e-12), (step, key)


def test_a_rows_own_text_moves_its_choice():
    stats = AutoStats(steep_curve())
    learned(stats, "pld", 1, 0.3)
    code, prose = RowStats(stats.accept), RowStats(stats.accept)
    for _ in range(30):  # this row's chains are accepted whole
        code.own.observe(("pld", 1), 4, [1, 2, 3, 4])
    options = [Option("pld", 4, 1)]
    assert choose(stats, code, options, 1).drafter == "pld"
    assert choose(stats, prose, options, 1).drafter == "ar"


def test_a_row_that_only_decodes_looks_again():
    stats = AutoStats(proportional())
    row = RowStats(stats.accept)
    picks = [choose(stats, row, [Option("eagle", 8)], 1).drafter for _ in range(EXPLORE_EVERY)]
    assert picks[:-1] == ["ar"] * (EXPLORE_EVERY - 1) and picks[-1] == "eagle"


def test_retirement_counts_choices_on_value_and_ends():
    stats = AutoStats(proportional())
    row = RowStats(stats.accept)
    for _ in range(RETIRE_AFTER):  # eagle never pays here: chosen only when the row looks again
        stats.tally(["eagle", "pld"], choose(stats, row, [Option("eagle", 8), Option("pld", 4)], 1))
    assert not stats.offers("eagle") and stats.offers("pld")  # prompt lookup costs nothing to offer
    for _ in range(RETIRE_FOR):
        stats.tally([], choose(stats, row, [Option("pld", 4)], 1))
    assert stats.offers("eagle")  # its term is over: offered and judged again

    paying = AutoStats(PassCost.flat())
    learned(paying, "eagle", 0, 0.6)
    row = RowStats(paying.accept)
    for _ in range(2 * RETIRE_AFTER):
        paying.tally(["eagle"], choose(paying, row, [Option("eagle", 8)], 1))
    assert paying.offers("eagle")
    frozen = AutoStats(proportional(), frozen=True)
    for _ in range(2 * RETIRE_AFTER):
        frozen.tally(["eagle"], choose(frozen, RowStats(frozen.accept), [Option("eagle", 8)], 1))
    assert frozen.offers("eagle")  # a deterministic call's choices follow its own tokens alone


def test_a_group_runs_a_model_drafter_only_where_its_rows_pay_for_it_together():
    """A model drafter's passes serve every row of its group, and a wider tree widens the whole
    padded pass: one row whose own acceptance makes EAGLE worth it for itself alone is overruled
    when the group as a whole commits more tokens per second without it; all four rows keep it."""
    gentle = PassCost("gentle", (1, 64), (0.01, 0.01 + 63 * 0.0005))
    options = [[Option("eagle", 8)] for _ in range(4)]
    weak = AutoStats(gentle)
    learned(weak, "eagle", 0, 0.05)
    weak.draft_s["eagle", 4] = 0.001  # per row of a group of 4
    rows = [RowStats(weak.accept) for _ in range(4)]
    for _ in range(40):
        rows[0].own.observe(("eagle", 0), 4, [1, 2, 3])  # this row's text suits the head
    assert choose(weak, rows[0], options[0], 4).drafter == "eagle"  # alone, it would draft
    assert [c.drafter for c in choose_group(weak, rows, options, 4)] == ["ar"] * 4
    strong = AutoStats(gentle)
    learned(strong, "eagle", 0, 0.6)
    strong.draft_s["eagle", 4] = 0.001
    picks = choose_group(strong, [RowStats(strong.accept) for _ in range(4)], options, 4)
    assert [c.drafter for c in picks] == ["eagle"] * 4 and all(c.expected > 1.5 for c in picks)


def test_a_drafters_cost_is_learned_per_group_size():
    """A row's share of a drafter's step measured alone does not price it in a group of 4 (where
    its passes serve 4 rows): that size starts unmeasured, so the drafter is tried there."""
    stats = AutoStats(PassCost.flat())
    learned(stats, "eagle", 0, 0.5)
    stats.observe_draft("eagle", 0.05, rows=1)  # alone: more than it saves
    row = RowStats(stats.accept)
    assert choose(stats, row, [Option("eagle", 8)], 1, rows=1).drafter == "ar"
    assert choose(stats, row, [Option("eagle", 8)], 4, rows=4).drafter == "eagle"
    assert stats.draft_cost("eagle", 4) == 0.0 and stats.draft_cost("eagle", 1) == 0.05


def test_a_row_beside_other_requests_drafts_only_at_the_rate_of_their_pass():
    """A server request is its own group: its drafting runs before the shared pass and holds up
    every row, so a drafter that beats `ar` for the row alone but commits fewer tokens per second
    than the pass does (``AutoStats.rate``) is not run; nothing changes without other groups."""
    gentle = PassCost("gentle", (1, 64), (0.01, 0.01 + 63 * 0.0002))
    stats = AutoStats(gentle)
    learned(stats, "eagle", 0, 0.5)
    stats.draft_s["eagle", 1] = 0.0005
    row, options = RowStats(stats.accept), [Option("eagle", 8)]
    beside = choose(stats, row, options, 4, rows=1)  # 4 rows in the pass, 1 of them this group's
    assert beside.drafter == "eagle"  # no rate measured yet: the row's own tokens per second
    stats.observe_rate(20, 0.02)  # the pass commits 1000 tokens/s
    assert stats.rate == 1000 and beside.value < 1000
    assert choose(stats, row, options, 4, rows=1).drafter == "ar"
    assert choose(stats, row, options, 4, rows=4).drafter == "eagle"  # the pass is this group's alone
    stats.rate = beside.value / 2  # a slower pass: the row's best is above its rate
    assert choose(stats, row, options, 4, rows=1) == beside

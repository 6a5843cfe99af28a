"""``auto``: per row and step, the drafter (or none) with the most expected tokens per second. Its
output is `ar`'s in greedy mode and the target's distribution when sampling, whatever it chooses;
the choice follows the measured curve, the drafters' costs and their learned acceptance."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, two_token_joint_tv

import paradec
from paradec import methods as registry
from paradec.config import SamplingConfig
from paradec.cpu import PassCost
from paradec.draft.auto import AutoDrafter
from paradec.draft.datastore import Datastore
from paradec.draft.eagle import EagleDrafter
from paradec.draft.heads import HeadDrafter
from paradec.draft.ngram import NgramDrafter
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
from paradec.tree.shadow import Shadow

N_NEW = 24
REPEATS = ["a b c d e f g a b c d e f g a b c", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"]


@pytest.fixture(scope="module")
def engine(llama_dir, drafters, tmp_path_factory):
    from paradec.models.eagle import EagleHead

    draft, heads = drafters
    engine = paradec.load(llama_dir, dtype="fp32", drafts=[draft], heads=heads, cost=PassCost.flat())
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("eagle") / "head"
    EagleHead(engine.model.config).save(path, {})
    engine.load_companion("eagle", path)
    # a datastore: the first halves of `ar`'s answers and sampled continuations of the sampling
    # tests' prompt, so that its chains are right (and wrong) in both modes
    prompts = PROMPTS + REPEATS
    ar = engine.generate(prompts, max_new_tokens=N_NEW, ignore_eos=True)
    texts = [p + g.token_ids[: N_NEW // 2] for p, g in zip(engine.tokenizer.hf(prompts).input_ids, ar)]
    f = engine.tokenizer.encode("def f(x):")
    drawn = engine.generate([f] * 24, max_new_tokens=3, temperature=0.15, top_k=3, seed=1, ignore_eos=True)
    store = tmp_path_factory.mktemp("datastore")
    Datastore.build(texts + [f + g.token_ids for g in drawn]).save(store)
    engine.load_companion("datastore", store)
    return engine


@pytest.mark.parametrize("deterministic", [False, True])
def test_greedy_is_ar_and_it_says_which_drafters_ran(engine, deterministic):
    prompts = PROMPTS + REPEATS
    ar = [g.token_ids for g in engine.generate(prompts, max_new_tokens=N_NEW, ignore_eos=True)]
    out = engine.generate(prompts, method="auto", max_new_tokens=N_NEW, ignore_eos=True, deterministic=deterministic)
    assert [g.token_ids for g in out] == ar
    ran = {}
    for g in out:
        assert sum(g.stats.drafters.values()) == g.stats.steps  # every step names its drafter
        assert g.stats.as_dict()["drafters"] == g.stats.drafters
        for name, n in g.stats.drafters.items():
            ran[name] = ran.get(name, 0) + n
    if deterministic:  # no timings (measured ones would make the choice this CPU's): the tokens decide
        assert {"pld", "rest", "eagle", "medusa", "specinfer"} <= set(ran)  # every loaded drafter is tried ...
        assert sum(g.stats.new_tokens for g in out) > sum(g.stats.steps for g in out)  # ... and some pay


def test_one_row_alone_and_a_fresh_engine_statistics_keep_ar(engine):
    engine.policies.pop(("auto",), None)  # the statistics start again from the prior
    for prompt in REPEATS:
        ar = engine.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True).token_ids
        assert engine.generate(prompt, method="auto", max_new_tokens=N_NEW, ignore_eos=True).token_ids == ar


def test_sampling_keeps_the_target_distribution(engine):
    tv, bound, _, _ = two_token_joint_tv(engine, method="auto")
    assert tv < bound


def test_deterministic_sampling_is_seeded(engine):
    opts = dict(method="auto", max_new_tokens=N_NEW, temperature=0.8, seed=7, deterministic=True, ignore_eos=True)
    first = engine.generate(PROMPTS, **opts)
    assert [g.token_ids for g in engine.generate(PROMPTS, **opts)] == [g.token_ids for g in first]


def test_llamacpp_like_runtime_without_drafters_is_ar(llama_dir):
    engine = paradec.load(llama_dir, dtype="fp32", cost=PassCost.flat())
    ar = [g.token_ids for g in engine.generate(REPEATS, max_new_tokens=N_NEW, ignore_eos=True)]
    out = engine.generate(REPEATS, method="auto", max_new_tokens=N_NEW, ignore_eos=True)
    assert [g.token_ids for g in out] == ar
    assert set().union(*(g.stats.drafters for g in out)) <= {"ar", "pld"}  # prompt lookup alone is loaded


def test_a_drafter_the_engine_keeps_not_choosing_is_retired_at_once(engine, monkeypatch):
    """Every model drafter, and the datastore, retired after 8 row-steps: they stop running within
    the request (no more proposals or lookups), the next request does not build them, and the
    tokens stay `ar`'s. Prompt lookup is never retired."""
    monkeypatch.setattr(policy, "RETIRE_AFTER", 8)
    monkeypatch.setattr(policy, "RETIRE_SHARE", 1.1)  # any share retires
    engine.policies.pop(("auto",), None)
    built, asked = [], []
    monkeypatch.setattr(EagleDrafter, "begin", _spy(built, EagleDrafter.begin))
    monkeypatch.setattr(HeadDrafter, "propose", _spy(asked, HeadDrafter.propose))
    prompt = REPEATS[0]
    ar = engine.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True).token_ids
    first = engine.generate(prompt, method="auto", max_new_tokens=N_NEW, ignore_eos=True, deterministic=True)
    assert first.token_ids == ar  # deterministic: frozen statistics, so nothing is retired
    assert {"eagle", "medusa", "specinfer"} <= set(first.stats.drafters) and len(asked) == first.stats.steps
    built.clear()
    asked.clear()
    outs = [engine.generate(prompt, method="auto", max_new_tokens=N_NEW, ignore_eos=True) for _ in range(2)]
    assert [out.token_ids for out in outs] == [ar, ar]
    assert set(engine.policies[("auto",)].retired) == {"eagle", "medusa", "specinfer", "rest"}
    assert outs[0].stats.steps > 8 and len(asked) == 8  # asked at every step until it was retired
    assert len(built) == 1  # built for the first request, not for the second
    assert set(outs[1].stats.drafters) <= {"ar", "pld"}


def test_eagle_starts_when_first_chosen_from_the_targets_features_of_the_context(engine, monkeypatch):
    """EAGLE's head is not run over the prompt at admission (a cost every request paid, chosen or
    not): it starts the step a row first chooses it, from the target's features of everything so
    far (the prefill's, then each commit's), as if that were the prompt; the tokens stay `ar`'s."""
    from paradec.draft import auto as draft_auto

    engine.policies.pop(("auto",), None)
    steps, begun = [], []
    real_choose, real_begin = draft_auto.choose_group, EagleDrafter.begin

    def eagle_from_step_4(stats, rows, options, batch):
        steps.append(1)
        keep = (lambda o: o.drafter == "eagle") if len(steps) > 3 else (lambda o: o.drafter != "eagle")
        return real_choose(stats, rows, [[o for o in opts if keep(o)] for opts in options], batch)

    def begin(self, prompts, max_len, features=None):
        begun.append(([list(p) for p in prompts], features))
        return real_begin(self, prompts, max_len, features)

    monkeypatch.setattr(draft_auto, "choose_group", eagle_from_step_4)
    monkeypatch.setattr(EagleDrafter, "begin", begin)
    prompt = PROMPTS[1]
    ar = engine.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True).token_ids
    out = engine.generate(prompt, method="auto", max_new_tokens=N_NEW, ignore_eos=True)
    assert out.token_ids == ar and out.stats.drafters.get("eagle", 0) > 0
    assert len(begun) == 1  # once, at the first step that chose it
    (context,), features = begun[0]
    prompt_ids = engine.encode(prompt)
    assert len(context) > len(prompt_ids) + 2 and context[: len(prompt_ids)] == prompt_ids
    model = engine.model
    with torch.no_grad():  # the target's final normed hidden state before each token but the first
        ids = torch.tensor([context])
        _, want = model.normed_logits(model.hidden(ids, torch.arange(len(context))[None], None, None))
    assert features.shape == (1, len(context) - 1, want.shape[-1])
    assert torch.allclose(features[0], want[0, :-1], atol=1e-3)


def test_a_declined_lookup_chain_is_scored_by_what_the_row_commits(engine, monkeypatch):
    """The engine believes lookup chains fail (learned at 5 %) and a 2-position pass costs 1.1 steps,
    so the row starts on `ar`. On a text that repeats itself, the chains it declines are scored by
    the tokens it commits next, and it starts drafting within the answer (never, if they are not)."""

    def run() -> paradec.Generation:
        stats = AutoStats(PassCost("gentle", (1, 64), (0.01, 0.01 + 63 * 0.001)))
        for matched in range(1, 5):
            learned(stats, "pld", matched, 0.05)
        drafter = AutoDrafter({}, {}, NgramDrafter(4, 16, 1, per_match=4), stats, SamplingConfig())
        return engine.generate(REPEATS[0], method="auto", drafter=drafter, max_new_tokens=N_NEW, ignore_eos=True)

    ar = engine.generate(REPEATS[0], max_new_tokens=N_NEW, ignore_eos=True).token_ids
    out = run()
    assert out.token_ids == ar and out.stats.drafters.get("pld", 0) >= 3
    monkeypatch.setattr(Shadow, "feed", lambda self, committed: False)  # never scored
    out = run()
    assert out.token_ids == ar and "pld" not in out.stats.drafters


def test_a_chosen_chain_the_batch_cuts_is_still_scored(engine):
    """The row chooses prompt lookup (learned at 90 %), the batch budget cuts every tree to the
    root: the chains are scored, all their nodes, by the tokens the row commits next (a chain cut
    to the root every step had left the row's statistics, and so its choice, as they were)."""
    from paradec.policy.budget import BatchBudget

    class RootOnly(BatchBudget):
        def choose(self, trees, priced=()):
            return 1

    stats = AutoStats(PassCost.flat())
    for matched in range(1, 5):
        learned(stats, "pld", matched, 0.9)
    seen = []
    observe = stats.accept.observe
    stats.accept.observe = lambda key, offered, accepted, weight=1.0: (
        seen.append((key, offered, accepted)),
        observe(key, offered, accepted, weight),
    )
    drafter = AutoDrafter({}, {}, NgramDrafter(4, 16, 1, per_match=4), stats, SamplingConfig())
    ar = [g.token_ids for g in engine.generate(REPEATS, max_new_tokens=N_NEW, ignore_eos=True)]
    budget, engine.budget = engine.budget, RootOnly(PassCost.flat())  # (a row alone keeps its own choice)
    try:
        out = engine.generate(REPEATS, method="auto", drafter=drafter, max_new_tokens=N_NEW, ignore_eos=True)
    finally:
        engine.budget = budget
    assert [g.token_ids for g in out] == ar
    assert all(g.stats.verified == g.stats.steps == N_NEW for g in out)  # the root alone, every step
    assert sum(g.stats.drafters.get("pld", 0) for g in out) > N_NEW  # chosen, then cut
    assert len(seen) > N_NEW and all(key[0] == "pld" for key, _, _ in seen)
    assert sum(len(accepted) for _, _, accepted in seen) > N_NEW  # the repeating texts: many nodes on the path


def _spy(calls: list, method):
    def wrapped(self, *args, **kwargs):
        calls.append(1)
        return method(self, *args, **kwargs)

    return wrapped


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


def test_a_drafters_cost_is_shared_by_the_rows_it_drafts_for(engine, monkeypatch):
    """A drafter's passes serve every row of its group at once: each row is charged its share of the
    step's drafting time, not the whole (which kept EAGLE out of batches). On a clock that advances
    one second a reading, prompt lookup or a model drafter over 4 rows costs a row 1/4 s."""
    from types import SimpleNamespace

    from paradec.draft import auto as draft_auto

    ticks = iter(range(10**6))
    monkeypatch.setattr(draft_auto, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    seen = []
    monkeypatch.setattr(
        AutoStats, "observe_draft", lambda self, name, seconds, rows=1, decay=0.8: seen.append((name, seconds, rows))
    )
    out = engine.generate([REPEATS[0]] * 4, method="auto", max_new_tokens=8, ignore_eos=True)
    assert all(g.token_ids == out[0].token_ids for g in out)
    assert [name for name, _, _ in seen if name == "pld"] and all((s, r) == (0.25, 4) for _, s, r in seen)


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


def test_a_request_joining_a_running_batch_prices_its_first_step_with_it(engine, monkeypatch):
    """A server request is its own group and shares every pass with the others: its first step is
    priced for the whole pass (``joins``), not as a pass of its own row alone (which had new
    requests choose EAGLE, and start its head over their prompt, where drafting did not pay)."""
    from paradec import methods
    from paradec.draft import auto as draft_auto
    from paradec.scheduler import Scheduler

    batches, real = [], draft_auto.choose_group
    monkeypatch.setattr(draft_auto, "choose_group", lambda *a: batches.append(a[3]) or real(*a))
    sched = Scheduler(engine, 3, 256)
    gen = engine.config(method="auto", max_new_tokens=4, ignore_eos=True)
    for prompt in [*REPEATS, PROMPTS[0]]:
        rows = engine.new_rows([engine.tokenizer.encode(prompt)], gen)
        sched.admit(rows, gen, methods.get("auto").drafter(engine, gen))
    list(sched.step())
    assert batches == [3, 3, 3]


def test_a_fresh_engine_times_its_model_drafters_before_any_row_tries_them(engine, monkeypatch):
    """With a measured pass-cost curve, an engine's first `auto` request times each loaded model
    drafter's step at one row (a made-up context) and its statistics start from those costs, not
    from 0 (every drafter tried once on every fresh engine). A curve not measured, or a
    deterministic request (no timings), seeds nothing."""
    gen = engine.config(method="auto", max_new_tokens=N_NEW)
    engine.policies.pop(("auto",), None)
    registry.get("auto").drafter(engine, gen)  # engine.cost: a flat curve, not measured
    assert engine.policies[("auto",)].draft_s == {}
    monkeypatch.setattr(engine, "cost", PassCost("measured", (1, 8), (0.01, 0.012), measured=True))
    engine.policies.pop(("auto",), None)
    registry.get("auto").drafter(engine, engine.config(method="auto", deterministic=True))
    assert ("auto",) not in engine.policies
    registry.get("auto").drafter(engine, gen)
    seeded = engine.policies[("auto",)].draft_s
    assert set(seeded) == {("eagle", 1), ("medusa", 1), ("specinfer", 1)} and all(s > 0 for s in seeded.values())
    ar = engine.generate(PROMPTS[0], max_new_tokens=N_NEW, ignore_eos=True).token_ids
    assert engine.generate(PROMPTS[0], method="auto", max_new_tokens=N_NEW, ignore_eos=True).token_ids == ar
    engine.policies.pop(("auto",), None)

"""``auto``: per row and step, the drafter (or none) with the most expected tokens per second. Its
output is `ar`'s in greedy mode and the target's distribution when sampling, whatever it chooses;
the choice follows the measured curve, the drafters' costs and their learned acceptance."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, two_token_joint_tv
from test_auto_policy import learned

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
    AutoStats,
)
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

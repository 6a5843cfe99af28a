"""Medusa and ProPD: greedy identical to ar (pruning on/off, static/dynamic trees, batch 1/4),
sampling distributed as ar, the pruned pass against a full pass, and the cost model."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, two_token_joint_tv

import paradec
import paradec.state
from paradec.draft import merge
from paradec.draft.base import DraftTree
from paradec.models.heads import EarlyHead, Heads, MedusaHeads, save_heads
from paradec.passes import prefill, verify_forward
from paradec.policy import Calibration, LatencyModel, TreePolicy
from paradec.scheduler import Scheduler
from paradec.tree.builders import top_paths
from paradec.verify.prune import prune_proposal, pruned_pass

PROMPTS4 = PROMPTS + ["class Stack:\n    def push(self, item):"]
N_NEW = 24


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory, llama_dir):
    torch.manual_seed(0)
    engine = paradec.load(llama_dir, dtype="fp32")
    d = engine.model.config.hidden_size
    medusa, early = MedusaHeads(d, 3), EarlyHead(d, 1e-6)
    for p in list(medusa.parameters()) + list(early.block.parameters()):
        torch.nn.init.normal_(p, std=0.3)  # random heads: any tree must still give ar's tokens
    rank = [[0.4, 0.2, 0.1, 0.05], [0.3, 0.15, 0.08, 0.04], [0.2, 0.1, 0.05, 0.02]]
    out = tmp_path_factory.mktemp("heads") / "heads"
    save_heads(Heads(medusa, early, 1, {"rank_accuracy": rank, "tree_nodes": 10}), out)
    return out


@pytest.fixture(scope="module")
def engine(llama_dir, heads_dir):
    engine = paradec.load(llama_dir, dtype="fp32", heads=heads_dir)
    # every tree verified whole: with the batch budget, whether a fixed-size tree is drafted (and
    # pruned) at all would depend on its drafting's measured time against the tiny model's pass
    engine.budget = None
    return engine


@pytest.fixture(scope="module")
def ar_tokens(engine):
    return [g.token_ids for g in engine.generate(PROMPTS4, max_new_tokens=N_NEW, ignore_eos=True)]


@pytest.mark.parametrize(
    "opts",
    [
        dict(method="medusa"),
        dict(method="medusa", tree_nodes=30),
        dict(method="propd"),
        dict(method="propd", prune=False),
        dict(method="propd", dynamic=False),
        dict(method="propd", prune_topk=64),
        dict(method="propd", step_scores=True),
    ],
)
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_identical_to_ar(engine, ar_tokens, opts, batch):
    if batch == 1:
        out = [engine.generate(p, max_new_tokens=N_NEW, ignore_eos=True, **opts) for p in PROMPTS4]
    else:
        out = engine.generate(PROMPTS4, max_new_tokens=N_NEW, ignore_eos=True, **opts)
    assert [g.token_ids for g in out] == ar_tokens
    if opts["method"] == "propd" and opts.get("dynamic") is False:
        # a fixed-size ProPD tree is pruned on every pass; a dynamic one prunes only where the
        # measured step times say it pays (test_policy_prunes_only_when_it_pays), so not always
        assert sum(g.stats.verified for g in out) < sum(g.stats.nodes for g in out)  # pruning pruned


def test_pruned_pass_equals_full_pass_over_pruned_tree(engine):
    prompt = engine.tokenizer.encode(PROMPTS4[1])
    draft = DraftTree([prompt[-1], 5, 6, 7, 8, 9, 10, 11], [-1, 0, 0, 1, 1, 2, 4, 5], [None] * 8)
    prop = merge(prompt[-1], [draft])
    with torch.inference_mode():
        cache = engine.model.new_cache(1, 64)
        prefill(engine.model, [paradec.state.Row(list(prompt), len(prompt), None, None)], cache)
        pruned, logits, _, slots, _ = pruned_pass(engine.model, engine.companions["heads"].early, 1, 256, [prop], cache)
        kept = pruned[0].tree
        assert 1 < len(kept) < len(prop.tree)  # the test needs a partial pruning
        fresh = engine.model.new_cache(1, 64)
        prefill(engine.model, [paradec.state.Row(list(prompt), len(prompt), None, None)], fresh)
        full, _ = verify_forward(engine.model, [kept], fresh)
    assert (logits[0, : len(kept)] - full[0]).abs().max() <= 1e-4
    assert [prop.tree.tokens[s] for s in slots[0]] == list(kept.tokens)


def test_prune_proposal_drops_subtrees():
    prop = merge(0, [DraftTree([0, 1, 2, 3], [-1, 0, 1, 0], [None] * 4)])
    pruned, survivors = prune_proposal(prop, [True, False, True, True])
    assert survivors == [0, 3] and pruned.tree.tokens == (0, 3) and pruned.tree.parents == (-1, 0)


@pytest.mark.parametrize(
    "opts", [dict(method="medusa"), dict(method="propd"), dict(method="propd", deterministic=True)]
)
def test_sampling_matches_target_joint(engine, opts):
    tv, bound, _, _ = two_token_joint_tv(engine, **opts)
    assert tv < bound


@pytest.mark.parametrize("method", ["medusa", "propd"])
def test_deterministic_mode_makes_a_seed_fix_the_text(engine, method):
    """With deterministic=True the tree never follows measured time or other calls' statistics,
    so a seed fixes sampled text even with other requests in between."""
    opts = dict(method=method, temperature=0.9, seed=5, max_new_tokens=N_NEW, ignore_eos=True, deterministic=True)
    first = engine.generate(PROMPTS4[0], **opts).token_ids
    engine.generate(PROMPTS4[1], method="propd", temperature=0.9, max_new_tokens=N_NEW)  # moves shared statistics
    engine.generate(PROMPTS4[2], method=method, max_new_tokens=N_NEW)
    assert engine.generate(PROMPTS4[0], **opts).token_ids == first
    assert engine.generate(PROMPTS4[0], **{**opts, "seed": 6}).token_ids != first  # the seed does matter


def test_latency_model_recovers_linear_cost():
    lat = LatencyModel(decay=0.99)
    for i in range(60):
        tokens = [1, 4, 8, 16, 32, 64][i % 6]
        lat.observe(tokens, 0.010 + 0.0005 * tokens)
    assert lat.a == pytest.approx(0.010, rel=1e-3) and lat.b == pytest.approx(0.0005, rel=1e-3)
    for _ in range(200):  # the cost changes; recent samples dominate
        lat.observe(8, 0.030)
        lat.observe(32, 0.030 + 0.002 * 24)
    assert lat.b == pytest.approx(0.002, rel=0.05)


def _policy(prior, a, b, lower_share=None, keep=1.0, recall=0.8):
    policy = TreePolicy(prior, lower_share=lower_share, recall=recall)
    policy.keep = keep
    policy.probe = []
    policy.explore_every = 10**9
    policy.latency = LatencyModel(a=a, b=b)
    policy.latency_pruned = LatencyModel(a=a, b=b)
    return policy


def _chosen(prior, a, b, batch=1):
    return _policy(prior, a, b).choose(batch)


def test_tree_size_moves_the_right_way():
    good = [[0.8, 0.1, 0.05, 0.02]] * 4
    poor = [[0.2, 0.1, 0.05, 0.02]] * 4
    cheap, dear = _chosen(good, 0.010, 0.00002), _chosen(good, 0.010, 0.001)
    assert cheap > dear  # verifying costs more per token -> a smaller tree
    assert _chosen(good, 0.010, 0.0003) >= _chosen(poor, 0.010, 0.0003)  # worse acceptance -> not larger
    assert _chosen(good, 0.010, 0.0003, batch=1) >= _chosen(good, 0.010, 0.0003, batch=8)  # bigger batch


def test_policy_prunes_only_when_it_pays():
    good = [[0.8, 0.1, 0.05, 0.02]] * 4
    unpruned = _chosen(good, 0.010, 0.001, batch=8)
    # an early head that keeps few nodes and never drops a right one: prune, and afford a bigger tree
    policy = _policy(good, 0.010, 0.001, lower_share=0.25, keep=0.2, recall=1.0)
    assert policy.choose(8) > unpruned and policy.prune_next
    # one that drops right nodes often: the pruned tree's expected length is not worth it
    policy = _policy(good, 0.010, 0.001, lower_share=0.25, keep=0.2, recall=0.3)
    assert policy.choose(8) == unpruned and not policy.prune_next
    for _ in range(500):
        policy.observe_recall(True)
    assert policy.recall > 0.95


def test_policy_learns_the_share_pruning_keeps():
    policy = TreePolicy([[0.5, 0.2]] * 2, lower_share=0.25)
    for _ in range(100):
        policy.observe_step(4, 17, 5, 0.02, pruned=True)  # 16 drafted nodes per row, 4 survive
    assert policy.keep == pytest.approx(0.25, abs=0.01)
    assert policy.cost_tokens(4, 17) == pytest.approx(4 * (0.25 * 17 + 0.75 * 5), rel=0.02)


def test_top_paths_is_a_tree_of_best_scores():
    paths = top_paths([[0.6, 0.2], [0.5, 0.1]], 3)
    assert paths == [(0,), (0, 0), (1,)]
    paths = top_paths([[0.5, 0.3, 0.1]] * 3, 10)
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)


def test_calibration_learns_what_a_head_probability_is_worth():
    cal = Calibration(depth=2, decay=1.0)
    for i in range(1000):  # depth 0: a guess given p = 0.6 is right 9 times in 10; p = 0.04 never
        cal.observe(0, [0.6, 0.04], [i % 10 != 0, False])
        cal.observe(1, [0.6, 0.04], [i % 10 < 3, False])  # depth 1: over-confident head
    (s0, s1), (t0, t1) = cal.scores([[0.6, 0.04], [0.6, 0.04]])
    assert s0 == pytest.approx(0.9, abs=0.01) and t0 == pytest.approx(0.3, abs=0.01)
    assert s1 < 0.01 and t1 < 0.01
    table = cal.table()
    assert all(a <= b for row in table for a, b in zip(row, row[1:]))  # monotone: scores fall with rank


def test_step_scores_give_sure_rows_deeper_trees():
    policy = _policy([[0.5, 0.1]] * 4, 0.010, 0.0003)
    sure = [[0.95, 0.02]] * 4
    unsure = [[0.3, 0.2]] * 4
    n = policy.choose(2, {0: sure, 1: unsure})
    deep, shallow = policy.paths(n, 0), policy.paths(n, 1)
    assert max(map(len, deep)) == 4 and max(map(len, shallow)) < 4
    for tree in (deep, shallow):  # each row's paths are a tree: every prefix is in it
        assert all(len(p) == 1 or p[:-1] in tree for p in tree)
    assert policy.choose(2, {0: unsure, 1: unsure}) < n  # nobody is sure: a smaller tree


def _admit(engine, sched, prompt, method, reports, **opts):
    gen = engine.config(method=method, max_new_tokens=N_NEW, ignore_eos=True, **opts)
    drafter = paradec.methods.get(method).drafter(engine, gen)
    observe = drafter.observe
    drafter.observe = lambda step: (reports.append(step), observe(step))
    return sched.admit(engine.new_rows([engine.tokenizer.encode(prompt)], gen), gen, drafter)


def test_a_pass_is_split_only_when_every_group_asks_for_it(engine, ar_tokens):
    """A fixed-size ProPD tree asks for the early-pruned pass at every step: alone it gets it and
    learns the early head's recall; beside an `ar` group (which asks for a full pass) it does not.
    Either way its tokens are `ar`'s."""
    for beside in (False, True):
        sched, reports = Scheduler(engine, 2, 512), []
        group = _admit(engine, sched, PROMPTS4[0], "propd", reports, dynamic=False)
        if beside:
            _admit(engine, sched, PROMPTS4[1], "ar", [])
        while sched.groups:
            list(sched.step())
        assert group.rows[0].new_ids == ar_tokens[0]
        split = [r.pruned for r in reports if r.drafted > 1]
        assert split and all(s != beside for s in split)
        assert any(r.recall for r in reports) != beside

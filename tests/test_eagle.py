"""EAGLE: a feature-level draft head's dynamic trees keep greedy output identical to `ar`, sampled
output distributed as the target's, its KV cache in step with what the target commits, and
every proposal a valid tree ranked by draft confidence."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import two_token_joint_tv

import paradec
from paradec.draft.eagle import EagleCostModel, EagleDrafter
from paradec.models.eagle import EagleHead
from paradec.models.native import available as native_available
from paradec.passes import prefill
from paradec.scheduler import Scheduler
from paradec.state import Row
from paradec.train.eagle import _batch_loss, draft_vocabulary, features

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):"]
N_NEW = 40


@pytest.fixture(scope="module")
def engine(llama_dir, tmp_path_factory):
    engine = paradec.load(llama_dir, dtype="fp32")
    torch.manual_seed(0)
    EagleHead(engine.model.config).save(tmp_path_factory.mktemp("eagle") / "random", {"random": True})
    return engine


@pytest.fixture(scope="module")
def heads(engine, tmp_path_factory):
    """A random head, one trained (briefly) on the tiny target's own greedy text, and one trained
    the same way that drafts over a small draft vocabulary (the 48 tokens the target emits most)."""
    root = tmp_path_factory.mktemp("eagle_heads")
    torch.manual_seed(0)
    EagleHead(engine.model.config).save(root / "random", {})
    texts = [
        "def f(x):\n",
        "import re\n",
        "class A:\n",
        "for i in range(",
        "x = [",
        "with open(p) as f:\n",
        "def g(a, b):\n",
        "print(",
        "return ",
        "if x is None:\n",
    ]
    seqs = [g.token_ids for g in engine.generate(texts, max_new_tokens=64, ignore_eos=True)]
    seqs = [engine.tokenizer.encode(t) + s for t, s in zip(texts, seqs)]
    feats, labels = features(engine.model, seqs)
    for name, vocab in (("trained", None), ("subset", draft_vocabulary(labels, 48, engine.model.config.vocab_size))):
        torch.manual_seed(0)
        head = EagleHead(engine.model.config)
        if vocab is not None:
            head.set_vocab(vocab)
        lm_w = head.lm_rows(engine.model.lm_head).detach()
        opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
        for step in range(60):
            idx = [(step * 4 + i) % len(seqs) for i in range(4)]
            loss, _, _ = _batch_loss(
                head,
                engine.model.embed,
                lm_w,
                [seqs[i] for i in idx],
                [feats[i] for i in idx],
                [labels[i] for i in idx],
                0.1,
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        head.save(root / name, {})
    return {"random": root / "random", "trained": root / "trained", "subset": root / "subset"}


@pytest.mark.parametrize("which", ["random", "trained", "subset"])
@pytest.mark.parametrize("method", ["eagle", "eagle+propd", "eagle+ngram"])
def test_greedy_equals_ar_batch_1_and_3(engine, heads, which, method, monkeypatch):
    from paradec.models.quant import Int8Linear

    engine.load_companion("eagle", heads[which])
    assert isinstance(
        engine.companions["eagle"].block.mlp.w_down, Int8Linear
    )  # a CPU drafts on int8 weights (load_eagle)
    ar = engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)
    batch = engine.generate(PROMPTS, method=method, max_new_tokens=N_NEW, ignore_eos=True)
    solo = [engine.generate(p, method=method, max_new_tokens=N_NEW, ignore_eos=True) for p in PROMPTS]
    assert [g.token_ids for g in batch] == [g.token_ids for g in ar] == [g.token_ids for g in solo]
    if which == "trained" and method == "eagle":  # training did something: more accepted per step
        # at the fixed tree size, every tree verified whole: what the heads propose, not what this
        # CPU's measured speed lets through (a busy machine's budget may cut every draft)
        monkeypatch.setattr(engine, "budget", None)
        fixed = dict(method=method, max_new_tokens=N_NEW, ignore_eos=True, deterministic=True)
        trained = engine.generate(PROMPTS, **fixed)
        engine.load_companion("eagle", heads["random"])
        rand = engine.generate(PROMPTS, **fixed)
        assert sum(g.stats.tau for g in trained) > sum(g.stats.tau for g in rand)


def test_sampling_matches_target_joint_and_top_k_children_fail(engine, heads):
    engine.load_companion("eagle", heads["trained"])
    tv, bound, _, _ = two_token_joint_tv(engine, method="eagle")
    assert tv < bound
    # negative control: the top-k tokens proposed as if drawn from q bias multi-step sampling
    orig = EagleDrafter._children

    def top_k_as_sampled(self, logits, generators):
        from paradec.sampling import probs

        q = probs(logits, self.sampling)
        top = q.topk(self.topk, dim=-1).indices.tolist()
        return [
            [(i, t, math.log(max(float(q[b, i, t]), 1e-30)), q[b, i]) for i, ts in enumerate(row) for t in ts]
            for b, row in enumerate(top)
        ]

    EagleDrafter._children = top_k_as_sampled
    try:
        bad, bound, _, _ = two_token_joint_tv(engine, method="eagle")
    finally:
        EagleDrafter._children = orig
    assert bad > bound, (bad, bound)


def test_eagle_ngram_samples_exactly(engine, heads):
    """eagle+ngram's trees (a lookup chain alone, or merged into the EAGLE tree) keep MSS exact."""
    engine.load_companion("eagle", heads["trained"])
    tv, bound, _, _ = two_token_joint_tv(engine, method="eagle+ngram")
    assert tv < bound


def first_proposals(engine, nodes: int) -> tuple[EagleDrafter, list]:
    """A fresh greedy drafter over the loaded head, begun on PROMPTS' prefill -> (drafter, its
    first proposals)."""
    gen = engine.config(method="eagle", max_new_tokens=20, ignore_eos=True, tree_nodes=nodes)
    drafter = EagleDrafter(
        engine.companions["eagle"], engine.model.embed, engine.model.lm_head, gen.sampling, nodes=nodes
    )
    seqs = [engine.tokenizer.encode(p) for p in PROMPTS]
    with torch.inference_mode():
        cache = engine.model.new_cache(3, 256)
        h = prefill(engine.model, [Row(s, len(s), None, None) for s in seqs], cache)
        drafter.begin(seqs, 256, engine.model.norm(h))
        return drafter, drafter.propose(seqs, [None] * 3)


def test_draft_vocabulary_head_drafts_only_its_tokens_and_samples_exactly(engine, heads):
    """A head with a draft vocabulary proposes only those tokens (q is zero elsewhere), and
    multi-step speculative sampling over it still gives the target's joint."""
    engine.load_companion("eagle", heads["subset"])
    vocab = set(engine.companions["eagle"].vocab.tolist())
    assert len(vocab) == 48
    _, props = first_proposals(engine, 16)
    assert all(set(p.tree.tokens[1:]) <= vocab for p in props)
    tv, bound, _, _ = two_token_joint_tv(engine, method="eagle")
    assert tv < bound


def _tree_depth(parents: list[int], n: int) -> int:
    return 0 if parents[n] < 0 else 1 + _tree_depth(parents, parents[n])


def test_fixed_size_drafting_stops_early_with_the_same_tree(engine, heads, monkeypatch):
    """With m fixed, drafting stops once no deeper node can enter the top m; the proposed trees
    are those of drafting every depth."""
    import paradec.draft.eagle as eagle_mod

    engine.load_companion("eagle", heads["trained"])
    with torch.no_grad():  # a confident head: its chains go deep, so a top m reaches past depth 2
        fc = engine.companions["eagle"].fc  # int8 on a CPU (Engine.load_eagle): its per-channel scales carry the size
        (fc.scales if hasattr(fc, "scales") else fc.weight).mul_(20)
        fc.bias.mul_(20)
    passes = {"early": 0, "every": 0}
    real_run = EagleDrafter._run

    def counted(key):
        def run(self, *args):
            passes[key] += 1
            return real_run(self, *args)

        return run

    deepest = 0
    for nodes in (1, 2, 3, 6, 12, 16):
        monkeypatch.setattr(EagleDrafter, "_run", counted("early"))
        _, early = first_proposals(engine, nodes)
        monkeypatch.setattr(EagleDrafter, "_run", counted("every"))
        monkeypatch.setattr(eagle_mod, "_settled", lambda *a: False)
        _, every = first_proposals(engine, nodes)
        monkeypatch.undo()
        for a, b in zip(early, every):
            assert (a.tree.tokens, a.tree.parents) == (b.tree.tokens, b.tree.parents)
            deepest = max(deepest, max(_tree_depth(b.tree.parents, n) for n in range(len(b.tree.parents))))
    assert passes["early"] < passes["every"] and deepest >= 3


def test_head_cache_stays_in_step_after_partial_acceptance(engine, heads):
    """After steps that accept part of a tree, the live drafter proposes what a fresh drafter
    given the committed text (and the target's features of it) proposes."""
    engine.load_companion("eagle", heads["trained"])
    gen = engine.config(method="eagle", max_new_tokens=30, ignore_eos=True)
    rows = engine.new_rows([engine.tokenizer.encode(PROMPTS[0])], gen)
    sched = Scheduler(engine, 1, 256)
    drafter = EagleDrafter(engine.companions["eagle"], engine.model.embed, engine.model.lm_head, gen.sampling)
    group = sched.admit(rows, gen, drafter)
    partial = 0
    for _ in range(6):
        for _, event in sched.step():
            partial += 0 < len(event.token_ids) - 1 < drafter.depth
    assert partial >= 1  # some step accepted part of the tree
    tokens = list(group.rows[0].tokens)
    assert drafter.propose([tokens], [None])[0].tree == fresh_tree(engine, gen, tokens)


def fresh_tree(engine, gen, tokens: list[int]):
    """The first tree of a fresh EAGLE drafter begun on ``tokens`` (the target's features of them)."""
    fresh = EagleDrafter(engine.companions["eagle"], engine.model.embed, engine.model.lm_head, gen.sampling)
    with torch.inference_mode():
        cache = engine.model.new_cache(1, 256)
        h = prefill(engine.model, [Row(tokens, len(tokens), None, None)], cache)
        fresh.begin([tokens], 256, engine.model.norm(h))
    return fresh.propose([tokens], [None])[0].tree


def test_head_catches_up_after_lookup_steps(engine, heads):
    """eagle+ngram: steps drafted by prompt lookup alone leave the committed pairs pending; the
    head's next pass over them leaves it where a fresh drafter on the committed text is."""
    from paradec.draft.ngram import NgramDrafter

    engine.load_companion("eagle", heads["trained"])
    gen = engine.config(method="eagle+ngram", max_new_tokens=40, ignore_eos=True)
    prompt = engine.tokenizer.encode("x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n")
    sched = Scheduler(engine, 1, 256)
    drafter = EagleDrafter(
        engine.companions["eagle"],
        engine.model.embed,
        engine.model.lm_head,
        gen.sampling,
        lookup=NgramDrafter(3, 8, min_ngram=2),
    )
    group = sched.admit(engine.new_rows([prompt], gen), gen, drafter)
    ran = []
    while len(ran) < 20 and not (True in ran and ran[-1] is False):
        list(sched.step())
        ran.append(drafter.head_ran)
    assert True in ran and ran[-1] is False  # both kinds of step; the last left pairs pending
    tokens = list(group.rows[0].tokens)
    drafter.lookup = None  # the head's own tree now, over the pairs it has not seen
    assert drafter.propose([tokens], [None])[0].tree == fresh_tree(engine, gen, tokens)


def test_every_proposal_is_a_tree_ranked_by_confidence(engine, heads):
    engine.load_companion("eagle", heads["trained"])
    drafter, props = first_proposals(engine, 12)
    for b, prop in enumerate(props):
        tree = prop.tree
        assert len(tree) == 13 and all(0 <= p < i for i, p in enumerate(tree.parents) if i)
        ranked = [path for path, _ in drafter.candidates[b]]
        rank = {path: i for i, path in enumerate(ranked)}
        paths = {0: ()}
        for i in range(1, len(tree)):
            paths[i] = paths[tree.parents[i]] + (tree.tokens[i],)
            if tree.parents[i]:
                assert rank[paths[tree.parents[i]]] < rank[paths[i]]  # the parent ranks above the child
        assert {paths[i] for i in range(1, len(tree))} == set(ranked[:12])  # the top-12 by confidence
        scores = [s for _, s in drafter.candidates[b]]
        assert scores == sorted(scores, reverse=True)


def test_cost_model_picks_bigger_trees_when_they_pay():
    cost = EagleCostModel()
    cost.probe = []
    for tokens in (1, 8, 16, 32, 64):
        for _ in range(5):
            cost.latency.observe(tokens, 0.010 + 0.0001 * tokens)  # verifying more is nearly free
    sure = [[0.95] * 64]
    assert cost.choose(1, sure) >= 32
    cost.latency = type(cost.latency)()
    for tokens in (1, 8, 16, 32, 64):
        for _ in range(5):
            cost.latency.observe(tokens, 0.010 + 0.01 * tokens)  # every node costs a full step
    assert cost.choose(1, [[0.05] * 64]) == 0


@pytest.mark.skipif(not native_available(), reason="no C compiler for the native path")
def test_drafting_passes_run_in_c_and_read_the_int8_head(engine, heads):
    """A CPU's head (int8 linears) drafts in C, one call a pass, predicting the features torch's
    ops do up to the activations' int8 rounding; its draft logits read the target's int8 LM head's
    own rows of the draft vocabulary (not the dequantized head) where that head is int8."""
    from paradec.models.quant import quantize_linears

    engine.load_companion("eagle", heads["subset"])
    head = engine.companions["eagle"]
    fc, plan, table = head._native()
    assert table is not None  # every linear an int8 C kernel: the pass in one call
    g = torch.Generator().manual_seed(0)
    n, hidden = 6, engine.model.config.hidden_size
    feats = torch.randn(1, n, hidden, generator=g)
    tokens, pos = torch.randint(0, 200, (1, n), generator=g), torch.arange(n)[None]
    with torch.inference_mode():
        c_out = head(feats, tokens, pos, engine.model.embed, None, head.new_cache(1, 32))
        built, head._plan = head._plan, (head._plan[0], None)  # torch's ops this once
        try:
            torch_out = head(feats, tokens, pos, engine.model.embed, None, head.new_cache(1, 32))
        finally:
            head._plan = built
    scale = torch_out.abs().max()
    assert (c_out - torch_out).abs().max() < 0.05 * scale  # int8 activations, not another computation
    assert (c_out[:, -1] - torch_out[:, 0]).abs().max() > 0.05 * scale  # (positions do differ)
    target = engine.model
    int8_head = copy.deepcopy(target.lm_head)
    holder = torch.nn.Module()
    holder.lm_head = int8_head
    quantize_linears(holder, "none", head="int8")
    with torch.inference_mode():
        logits = head.draft_logits(holder.lm_head)(c_out)  # [1, n, K]
        dense = c_out @ holder.lm_head.dequantized()[head.vocab].T
    assert logits.shape == (1, n, len(head.vocab))
    assert (logits - dense).abs().max() < 0.05 * dense.abs().max()
    assert torch.equal(logits.argmax(-1), dense.argmax(-1))

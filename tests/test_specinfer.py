"""SpecInfer and prompt lookup: greedy output identical to ar; sampling distributed as ar."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import PROMPTS, two_token_joint_tv
from safetensors.torch import load_file, save_file

import paradec
from paradec.config import SamplingConfig
from paradec.cpu import PassCost
from paradec.draft import DraftTree, NgramDrafter, merge
from paradec.sampling import probs
from paradec.testing import make_checkpoint
from paradec.verify import accept_mss, accept_naive

N_NEW = 30


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, tokenizer, checkpoints):
    root = tmp_path_factory.mktemp("drafts")
    ssm1 = make_checkpoint(root / "ssm1", tokenizer=tokenizer, seed=11, num_layers=1, hidden_size=32, num_heads=2)
    ssm2 = make_checkpoint(root / "ssm2", tokenizer=tokenizer, seed=12, num_layers=1, hidden_size=32, num_heads=2)
    # never right: a zero final norm makes every logit 0, so it always proposes tokens 0, 1, 2 ...
    wrong = make_checkpoint(root / "wrong", tokenizer=tokenizer, seed=13, num_layers=1)
    weights = load_file(wrong / "model.safetensors")
    weights["model.norm.weight"].zero_()
    save_file(weights, str(wrong / "model.safetensors"), metadata={"format": "pt"})
    return {"ssm1": ssm1, "ssm2": ssm2, "wrong": wrong, "self": checkpoints["llama"]}


def engine_with(llama_dir, *drafts):
    # a fixed curve, and every tree verified whole: whether a method drafts must not depend on
    # the CPU running the suite (the batch budget weighs the SSM's measured time; test_budget.py)
    engine = paradec.load(llama_dir, dtype="fp32", drafts=list(drafts), cost=PassCost.flat())
    engine.budget = None
    return engine


@pytest.fixture(scope="module")
def ar_tokens(llama_dir):
    engine = paradec.load(llama_dir, dtype="fp32")
    return [g.token_ids for g in engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)]


CASES = {
    "chain": (["ssm1"], dict(expansion=[1, 1, 1, 1])),
    "expansion": (["ssm1"], dict(expansion=[1, 1, 3, 1, 1, 1, 1, 1])),
    "merged-2-ssms": (["ssm1", "ssm2"], dict(expansion=[2, 1, 2])),
    "ssm+ngram": (["ssm1"], dict(expansion=[1, 2, 1], with_ngram=True, ngram_branches=2)),
    "self+random": (["ssm1", "self"], dict(expansion=[1, 1, 3, 1])),
    "pld": ([], dict(method="pld", num_draft=5)),
    "pld-tree": ([], dict(method="pld", num_draft=4, ngram_branches=3, max_ngram=2)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identical_to_ar(llama_dir, drafts, ar_tokens, case, batch):
    names, opts = CASES[case]
    engine = engine_with(llama_dir, *[drafts[n] for n in names])
    opts = {"method": "specinfer", **opts}
    if batch == 1:
        out = [engine.generate(p, max_new_tokens=N_NEW, ignore_eos=True, **opts) for p in PROMPTS]
    else:
        out = engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True, **opts)
    assert [g.token_ids for g in out] == ar_tokens
    assert all(g.stats.steps <= N_NEW and len(g.stats.accept_per_depth) >= 1 for g in out)


@pytest.mark.parametrize("expansion", [[1, 1, 1], [1, 1, 3, 1, 1, 1, 1, 1], [2, 2]])
def test_self_draft_accepts_whole_deepest_path(llama_dir, drafts, ar_tokens, expansion):
    engine = engine_with(llama_dir, drafts["self"])
    out = engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True, method="specinfer", expansion=expansion)
    per_step = len(expansion) + 1
    for g, ref in zip(out, ar_tokens):
        assert g.token_ids == ref
        assert g.stats.steps == math.ceil(N_NEW / per_step)
        assert g.stats.accept_per_depth == [1.0] * len(expansion)


def test_never_right_draft_gives_tau_1(llama_dir, drafts, ar_tokens):
    assert not {0, 1, 2} & {t for ref in ar_tokens for t in ref}  # the wrong draft's proposals
    engine = engine_with(llama_dir, drafts["wrong"])
    out = engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True, method="specinfer", expansion=[3, 1])
    assert [g.token_ids for g in out] == ar_tokens
    assert all(g.stats.tau == 1.0 and g.stats.steps == N_NEW for g in out)


def test_merge_is_a_trie_union_with_multiplicity():
    a = DraftTree([9, 1, 2], [-1, 0, 1], [None] * 3)
    b = DraftTree([9, 1, 3, 1], [-1, 0, 0, 1], [None] * 4)
    prop = merge(9, [a, b])
    assert prop.tree.tokens == (9, 1, 2, 3, 1) and prop.tree.parents == (-1, 0, 1, 0, 1)
    assert [d.child for d in prop.draws[0]] == [1, 1, 3] and [d.child for d in prop.draws[1]] == [2, 4]


def test_ngram_finds_latest_continuations():
    ng = NgramDrafter(max_ngram=2, num_draft=3, branches=2)
    assert ng.continuations([5, 6, 7, 8, 5, 6, 9, 9, 5, 6]) == [[9, 9, 5], [7, 8, 5]]
    assert ng.continuations([1, 2, 3]) == []


def test_ngram_drafts_further_on_a_longer_match():
    ng = NgramDrafter(max_ngram=3, num_draft=5, per_match=2)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ng.continuations(text + [7]) == [[8, 9]]  # 1 matched token: 2 drafted
    assert ng.continuations(text + [6, 7]) == [[8, 9, 6, 7]]  # 2 matched: 4 drafted
    assert ng.continuations([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]) == [[4, 5, 6, 7, 8]]  # 3 matched: 6, capped at 5


def test_ngram_lookup_is_the_plain_scan():
    """The vectorized lookup, and the n-gram index a list seen again is looked up in, against a
    scan written out: the longest suffix (max_ngram down to min_ngram) seen before, its distinct
    continuations newest first, on random short texts over small vocabularies (many repeats,
    overlapping and adjacent matches, no match)."""

    def scan(tokens, max_ngram, num_draft, branches, min_ngram, per_match):
        for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
            length = num_draft if per_match is None else min(num_draft, per_match * n)
            found = []
            for start in range(len(tokens) - n - 1, -1, -1):
                cont = tokens[start + n : start + n + length]
                if tokens[start : start + n] == tokens[-n:] and cont not in found:
                    found.append(cont)
            if found:
                return found[:branches], n
        return [], 0

    rng = random.Random(0)
    for i in range(3000):
        tokens = [rng.randrange(rng.choice([2, 3, 6])) for _ in range(rng.randint(1, 40))]
        opts = dict(
            max_ngram=rng.randint(1, 5),
            num_draft=rng.randint(1, 6),
            branches=rng.randint(1, 3),
            min_ngram=rng.randint(1, 3),
            per_match=rng.choice([None, 1, 3]),
        )
        ng = NgramDrafter(**opts)
        assert (ng.continuations(tokens), ng.matched) == scan(tokens, **opts), (tokens, opts)
        if i % 3 == 0:  # a row's tokens, growing: the same list looked up at every length (its index)
            grown = []
            for tok in tokens:
                grown.append(tok)
                assert (ng.continuations(grown), ng.matched) == scan(grown, **opts), (grown, opts)
            grown[-3:] = [7, 7]  # changed under it: looked up as it is now
            assert (ng.continuations(grown), ng.matched) == scan(grown, **opts), (grown, opts)


# ---- sampling: distribution tests ---------------------------------------------------------


def _tv(counts: dict, exact: dict) -> float:
    n = sum(counts.values())
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


def _toy_tree(k: int, q: torch.Tensor, gen: torch.Generator, iid: bool) -> tuple:
    """Root with k children drawn from q (i.i.d., or deterministic top-k), one grandchild each."""
    kids = torch.multinomial(q, k, replacement=True, generator=gen).tolist() if iid else q.topk(k).indices.tolist()
    tokens, parents, qs = [0], [-1], [None]
    for tok in kids:
        tokens.append(tok)
        parents.append(0)
        qs.append(q if iid else q)
    return DraftTree(tokens, parents, qs)


def _mss_no_residual(proposal, logits, cfg, gen):
    """Broken on purpose: on rejection keeps testing against the unmodified p."""
    p = probs(logits[0], cfg)
    for i in torch.randperm(len(proposal.draws[0]), generator=gen).tolist():
        d = proposal.draws[0][i]
        x = proposal.tree.tokens[d.child]
        if float(torch.rand((), generator=gen)) * float(d.q[x]) <= float(p[x]):
            return x
    return int(torch.multinomial(p, 1, generator=gen))


@pytest.mark.parametrize(
    "variant, should_pass", [("mss", True), ("naive", True), ("no-residual", False), ("top-k children", False)]
)
def test_acceptor_first_token_distribution(variant, should_pass):
    """Vocab 6, 3 children per node: the first token must follow p (TV within a sample bound)."""
    gen = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(temperature=1.0)
    p_logits = torch.tensor([2.0, 1.5, 0.2, -0.5, 0.0, -2.0])
    q = torch.tensor([0.05, 0.10, 0.40, 0.25, 0.15, 0.05])
    p = probs(p_logits, cfg)
    logits = p_logits.expand(4, 6)
    n, counts = 6000, {}
    for _ in range(n):
        draft = _toy_tree(3, q, gen, iid=variant != "top-k children")
        prop = merge(0, [draft])
        if variant == "no-residual":
            tok = _mss_no_residual(prop, logits, cfg, gen)
        else:
            rule = accept_naive if variant == "naive" else accept_mss
            v = rule(prop, logits, cfg, gen)
            tok = prop.tree.tokens[v.nodes[1]] if len(v.nodes) > 1 else v.bonus
        counts[tok] = counts.get(tok, 0) + 1
    tv = _tv(counts, {i: float(p[i]) for i in range(6)})
    bound = 0.5 * math.sqrt(6 / n) + 0.01
    assert (tv < bound) == should_pass, (variant, tv, bound)


@pytest.mark.parametrize(
    "opts",
    [
        dict(method="specinfer", expansion=[1, 1]),
        dict(method="specinfer", expansion=[3, 2]),
        dict(method="specinfer", expansion=[2, 2], acceptor="naive"),
        dict(method="specinfer", expansion=[2, 1], with_ngram=True),
    ],
)
def test_engine_sampling_matches_target_joint_of_two_tokens(llama_dir, drafts, opts):
    """First two sampled tokens under MSS vs the exact target joint (top-k 3 keeps 9 cells)."""
    tv, bound, counts, exact = two_token_joint_tv(engine_with(llama_dir, drafts["ssm1"]), **opts)
    assert tv < bound
    # the bound is tight enough to reject a wrong joint: swap the most and least likely cells
    wrong = dict(exact)
    keys = sorted(wrong, key=wrong.get)
    wrong[keys[-1]], wrong[keys[0]] = wrong[keys[0]], wrong[keys[-1]]
    assert _tv(counts, wrong) > bound


def test_sampling_is_seeded(llama_dir, drafts):
    engine = engine_with(llama_dir, drafts["ssm1"], drafts["ssm2"])
    kw = dict(method="specinfer", expansion=[2, 2, 1], max_new_tokens=20, temperature=0.8, ignore_eos=True)
    a = engine.generate(PROMPTS[:2], seed=5, **kw)
    b = engine.generate(PROMPTS[:2], seed=5, **kw)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_draft_with_other_vocabulary_is_refused(llama_dir, tmp_path):
    from paradec.errors import ParadecError

    other = make_checkpoint(tmp_path / "other", vocab_size=300, num_layers=1)
    with pytest.raises(ParadecError, match="tokenizer"):
        engine_with(llama_dir, other)


def test_an_ssm_catches_up_rows_that_owe_different_chains(drafters):
    """After skipped steps (``set_width(0)``) the rows of a batch owe the SSM chains of different
    lengths; the next tree is the one each row gets alone, and padding a row with many committed
    tokens to another row's long chain must not overflow the SSM's cache."""
    from paradec.draft.model import ModelDrafter
    from paradec.models import load_model

    ssm = load_model(drafters[0], torch.float32)
    prompts = [list(range(3, 33)), [5, 6, 7]]  # 30 and 3 tokens: row 0 has the longer history
    greedy = SamplingConfig(temperature=0.0)

    def drafter(rows: list[list[int]]) -> ModelDrafter:
        d = ModelDrafter(ssm, (2, 1), greedy)
        d.begin(rows, max_len=34)  # room for row 0's 30 tokens and 4 more, no more
        return d

    both = drafter(prompts)
    both.width = 0  # what ``TreeDrafter.set_width`` hands it
    both.propose([None, None])
    both.commit(0, [], 40)  # row 0: one token more; row 1: thirteen
    both.commit(1, list(range(8, 20)), 20)
    both.width = None
    trees = both.propose([None, None])  # without the catch-up: row 0 padded to 14 + the tree, past 34 + slack
    for b, history in enumerate([prompts[0] + [40], prompts[1] + list(range(8, 21))]):
        alone = drafter([history])
        assert alone.propose([None])[0].tokens == trees[b].tokens


def test_drafts_take_the_c_path_where_the_target_does(llama_dir, drafts):
    """An SSM runs its passes as the target does: in C where that runs (exact there at no cost;
    an SSM's look on 2 AVX2 cores took 40 % less time than on torch's ops), else torch's plain
    attention (its rounding never reaches the output)."""
    engine = engine_with(llama_dir, drafts["ssm1"])
    (ssm,) = engine.companions["drafts"]
    assert ssm.runs_native() == engine.model.runs_native()
    assert ssm.exact == ssm.runs_native()

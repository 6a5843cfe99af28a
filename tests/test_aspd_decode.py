"""ASPD's hybrid engine: parallel branches decode as each branch would alone; its per-token
mask and positions are the training layout's for the same flattened sequence."""

from __future__ import annotations

import pytest
import torch

import paradec
from paradec.parallel.decode import aspd_decode, aspd_decode_batch
from paradec.parallel.grammar import MAX_BRANCHES, MAX_TITLE_TOKENS, MIN_BRANCH_TOKENS, Specials, serial_mask
from paradec.parallel.layout import layout
from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text
from paradec.train.tokenizer import ASPD_TOKENS


@pytest.fixture(scope="module")
def aspd_engine(tmp_path_factory):
    tok = make_tokenizer(512, stdlib_text(60_000), special=ASPD_TOKENS)
    path = make_checkpoint(tmp_path_factory.mktemp("aspd") / "m", tokenizer=tok, seed=3, num_heads=4, num_kv_heads=2)
    return paradec.load(path, dtype="fp32")


def _prompt(engine, titles=("alpha", "beta", "gamma")):
    hf = engine.tokenizer.hf
    text = "Write three helpers.\n" + "".join(f"<|title|>{t}<|/title|>" for t in titles) + "<|para|>"
    return list(hf(text, add_special_tokens=False).input_ids)


def test_branches_decode_as_each_alone(aspd_engine):
    engine = aspd_engine
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompt = _prompt(engine)
    new, stats = aspd_decode(engine.model, sp, prompt, 60, frozenset(), max_branch_tokens=12)
    assert stats.groups >= 1 and stats.branches == 3 and stats.parallel_steps < stats.parallel_tokens
    # split the merged branches back out of the flattened output
    branches, cur = [], None
    for tok in new:
        if tok == sp.branch:
            cur = [tok]
        elif cur is not None:
            cur.append(tok)
            if tok == sp.end_branch:
                branches.append(cur)
                cur = None
        if len(branches) == 3:
            break
    suppress = [sp.title, sp.end_title, sp.para, sp.end_para, sp.branch]
    for branch in branches:
        colon = engine.tokenizer.hf(":", add_special_tokens=False).input_ids[-1]
        ref = branch[: branch.index(colon) + 1]  # the forced prefix
        with torch.inference_mode():
            while ref[-1] != sp.end_branch and len(ref) < len(branch):
                logits = engine.model(torch.tensor([prompt + ref]))[0, -1]  # the branch alone
                logits[suppress] = float("-inf")
                ref.append(int(logits.argmax()) if len(ref) < 12 else sp.end_branch)
        assert ref == branch


def test_engine_mask_and_positions_equal_training_layout(aspd_engine):
    engine = aspd_engine
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompt = _prompt(engine, ("a", "bb"))
    new, stats = aspd_decode(engine.model, sp, prompt, 96, frozenset(), record=True, max_branch_tokens=6)
    _assert_trace_is_training_layout(sp, prompt, new, stats)


def test_generate_method_aspd_returns_plain_text(aspd_engine):
    g = aspd_engine.generate(_prompt(aspd_engine), method="aspd", max_new_tokens=30, ignore_eos=True)
    assert "<|branch|>" not in g.text and "<|title|>" not in g.text
    assert g.stats.extra["branches"] == 3 and g.stats.steps < g.stats.new_tokens


def test_batch_equals_each_prompt_alone(aspd_engine):
    """Rows in different modes (one opens a group at once, one decodes serially with another
    plan, one is short) share every pass, padded; each row's tokens are its solo tokens."""
    engine = aspd_engine
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompts = [_prompt(engine), _prompt(engine, ("x", "yy")), engine.tokenizer.encode("def f(a):\n")]
    solo = [aspd_decode(engine.model, sp, p, 40, frozenset(), max_branch_tokens=10)[0] for p in prompts]
    batch = [ids for ids, _ in aspd_decode_batch(engine.model, sp, prompts, 40, frozenset(), max_branch_tokens=10)]
    assert batch == solo
    assert sp.para not in prompts[2] and all(len(ids) == 40 for ids in batch)
    together = engine.generate(prompts, method="aspd", max_new_tokens=40, ignore_eos=True)
    alone = [engine.generate(p, method="aspd", max_new_tokens=40, ignore_eos=True) for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.text for g in together] == [g.text for g in alone]


def test_grammar_titles_unique_and_bounded(aspd_engine):
    sp = Specials.from_tokenizer(aspd_engine.tokenizer.hf)
    vocab = aspd_engine.model.config.vocab_size
    a, b = 300, 301
    plan = [7, sp.title, a, b, sp.end_title, sp.title, a]
    assert serial_mask(sp, plan, False, vocab)[sp.end_title]  # "a" is not a title yet
    many = [7] + [t for i in range(MAX_BRANCHES) for t in (sp.title, 300 + i, sp.end_title)]
    allowed = serial_mask(sp, many, False, vocab)
    assert allowed.sum() == 1 and allowed[sp.para]  # the plan is full: open the group
    allowed = serial_mask(sp, [7, sp.title] + [a] * MAX_TITLE_TOKENS, False, vocab)
    assert allowed.sum() == 1 and allowed[sp.end_title]  # a title has a length limit
    allowed = serial_mask(sp, [7, 8], False, vocab)
    assert allowed[sp.title] and not allowed[sp.para] and not allowed[sp.branch] and not allowed[sp.end_title]
    colon = aspd_engine.tokenizer.hf(":", add_special_tokens=False).input_ids[-1]
    assert allowed[colon] and colon in sp.not_in_titles  # serial text may have colons, a title may not
    assert not serial_mask(sp, [7, sp.title], False, vocab)[colon]
    assert not serial_mask(sp, [7, sp.title, a], False, vocab)[colon]
    # the budget: a plan grows only while every branch keeps room, and opens only where two fit
    # (three 1-token titles: <|para|> + 3 x (<|branch|> title : + content + <|/branch|>) + <|/para|>)
    two = [7, sp.title, a, sp.end_title, sp.title, b, sp.end_title]
    need = 2 + 3 * (1 + 3 + MIN_BRANCH_TOKENS)
    assert serial_mask(sp, two, False, vocab, budget_left=need)[sp.title]
    allowed = serial_mask(sp, two, False, vocab, budget_left=need - 1)
    assert allowed.sum() == 1 and allowed[sp.para]
    assert not serial_mask(sp, [7, 8], False, vocab, budget_left=2 + 2 * (1 + 3 + MIN_BRANCH_TOKENS) - 1)[sp.title]


class _Scripted:
    """The model, except that its 1-token passes return the scripted tokens as argmax, in order."""

    def __init__(self, model, script):
        self.model, self.script = model, list(script)
        self.embed, self.config, self.new_cache = model.embed, model.config, model.new_cache

    def __call__(self, x, pos, mask, cache, prefill=False):
        logits = self.model(x, pos, mask, cache, prefill)
        if x.shape[1] == 1 and self.script:
            logits[0, 0, self.script.pop(0)] = 1e4
        return logits


def test_a_repeated_title_is_retried_then_ends_the_plan(aspd_engine):
    """Greedy small models like to repeat the first title. Titles are unique: a repeat is rolled
    back (history, cache, trace) and decoded again with its first token banned; when the retries
    are used up, the plan is complete and the group opens with the titles so far."""
    engine = aspd_engine
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    x = engine.tokenizer.hf("x", add_special_tokens=False).input_ids[-1]
    prompt = engine.tokenizer.encode("def f(a):\n")
    script = [sp.title, x, sp.end_title, sp.title, x, sp.end_title]
    new, stats = aspd_decode(
        _Scripted(engine.model, script), sp, prompt, 96, frozenset(), record=True, max_branch_tokens=6
    )
    plan = new[: new.index(sp.para)] if sp.para in new else new
    titles = [
        plan[i + 1 : plan.index(sp.end_title, i)]
        for i, t in enumerate(plan)
        if t == sp.title and sp.end_title in plan[i:]
    ]
    assert titles[0] == [x] and len(titles) >= 2 and titles[1][0] != x  # retried with "x" banned
    assert len({tuple(t) for t in titles}) == len(titles)
    _assert_trace_is_training_layout(sp, prompt, new, stats)
    new, stats = aspd_decode(
        _Scripted(engine.model, script), sp, prompt, 96, frozenset(), record=True, max_branch_tokens=6, title_retries=0
    )
    assert new[:5] == [sp.title, x, sp.end_title, sp.para, sp.branch] and stats.branches == 1
    _assert_trace_is_training_layout(sp, prompt, new, stats)


def test_a_numbered_title_repeats_its_words_not_its_number(aspd_engine):
    """Numbered items' titles carry their number ("2. x"), so "2. x" after "1. x" is a repeat:
    it is rolled back and decoded again with "x" banned right after the number, not at the
    title's first token (which is the number, and must stay free)."""
    engine = aspd_engine
    sp = Specials.from_tokenizer(engine.tokenizer.hf)

    def tok(s):
        return engine.tokenizer.hf(s, add_special_tokens=False).input_ids[-1]

    x, one, two, dot = tok("x"), tok("1"), tok("2"), tok(".")
    assert {one, two, dot} <= sp.numbering and x not in sp.numbering
    assert sp.core([two, dot, x]) == [x] and sp.core([two, dot]) == [dot]  # a title is never empty
    prompt = engine.tokenizer.encode("def f(a):\n")
    script = [sp.title, one, dot, x, sp.end_title, sp.title, two, dot, x, sp.end_title, two, dot, x]
    new, stats = aspd_decode(
        _Scripted(engine.model, script), sp, prompt, 96, frozenset(), record=True, max_branch_tokens=6
    )
    plan = new[: new.index(sp.para)] if sp.para in new else new
    titles = [
        plan[i + 1 : plan.index(sp.end_title, i)]
        for i, t in enumerate(plan)
        if t == sp.title and sp.end_title in plan[i:]
    ]
    assert titles[0] == [one, dot, x] and len(titles) >= 2
    assert titles[1][:2] == [two, dot] and titles[1][2] != x  # the number kept, "x" banned after it
    assert len({tuple(sp.core(t)) for t in titles}) == len(titles)
    _assert_trace_is_training_layout(sp, prompt, new, stats)


def _assert_trace_is_training_layout(sp, prompt, new, stats):
    flat = prompt + new
    lay = layout(flat, sp.branch, sp.end_branch)
    # map cache slots to flattened indices: serial slots in order, branch slots by (branch, j)
    starts = [i for i, t in enumerate(flat) if t == sp.branch]
    slot_to_flat, serial_i, seen = {}, 0, {}
    for slot, (*_, br) in enumerate(stats.trace):
        if br < 0:
            while lay.branch[serial_i] > 0:
                serial_i += 1
            slot_to_flat[slot] = serial_i
            serial_i += 1
        else:
            j = seen.get(br, 0)
            seen[br] = j + 1
            slot_to_flat[slot] = starts[br] + j
    for slot, (tok, pos, vis, _) in enumerate(stats.trace):
        i = slot_to_flat[slot]
        assert flat[i] == tok and int(lay.positions[i]) == pos
        assert sorted(slot_to_flat[v] for v in vis) == lay.mask[i].nonzero().flatten().tolist()


def test_stream_shows_branches_in_plan_order_while_they_decode(aspd_engine):
    """A plan of three branches: the stream shows the first branch live and each later one once
    the ones before it are done; the pieces are `generate`'s text, and come step by step."""
    ids = _prompt(aspd_engine)
    full = aspd_engine.generate(ids, method="aspd", max_new_tokens=60, ignore_eos=True)
    assert full.stats.extra["branches"] == 3
    pieces = list(aspd_engine.stream(ids, method="aspd", max_new_tokens=60, ignore_eos=True))
    assert "".join(pieces) == full.text
    assert len(pieces) > 3  # not one buffered piece, nor one per branch


def test_stream_is_generate_and_stop_strings_end_the_text(aspd_engine):
    prompt = "def area(r):\n    return 3.14 * r * r\n\n\n"
    full = aspd_engine.generate(prompt, method="aspd", max_new_tokens=40, ignore_eos=True)
    streamed = "".join(aspd_engine.stream(prompt, method="aspd", max_new_tokens=40, ignore_eos=True))
    assert streamed == full.text and full.text
    stop = full.text.strip()[:2]
    cut = aspd_engine.generate(prompt, method="aspd", max_new_tokens=40, ignore_eos=True, stop=[stop])
    assert cut.text == full.text[: full.text.find(stop)] and cut.finish_reason == "stop"
    assert (
        "".join(aspd_engine.stream(prompt, method="aspd", max_new_tokens=40, ignore_eos=True, stop=[stop])) == cut.text
    )

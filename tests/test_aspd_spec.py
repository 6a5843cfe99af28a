"""``aspd+spec``: drafts inside ASPD's branches (and in serial mode) verified in one pass give
token for token what plain ``aspd`` gives with the same model (fp32, greedy)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from test_aspd_decode import _assert_trace_is_training_layout

import paradec
from paradec.parallel.decode import aspd_decode, aspd_decode_batch
from paradec.parallel.grammar import Specials
from paradec.parallel.spec import SpecRowDecoder, extra_slots
from paradec.testing import make_checkpoint, make_tokenizer, stdlib_text
from paradec.train.tokenizer import ASPD_TOKENS


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tok = make_tokenizer(512, stdlib_text(60_000), special=ASPD_TOKENS)
    path = make_checkpoint(
        tmp_path_factory.mktemp("aspd_spec") / "m", tokenizer=tok, seed=3, num_heads=4, num_kv_heads=2
    )
    return paradec.load(path, dtype="fp32")


class _Planner:
    """The model, except that the token fed at a scripted position predicts the scripted token
    (+1e4): a plan the random model would not write, placed by position so that every schedule
    of the same text (one token per pass, or chains of drafts) sees the same script."""

    def __init__(self, model, script: dict[int, int]):
        self.model, self.script = model, script
        self.embed, self.config, self.new_cache = model.embed, model.config, model.new_cache

    def __call__(self, x, pos, mask, cache, prefill=False):
        logits = self.model(x, pos, mask, cache, prefill)
        for (b, i), p in zip(torch.ones_like(pos).nonzero().tolist(), pos.flatten().tolist()):
            if p in self.script:
                logits[b, i, self.script[p]] += 1e4
        return logits


def _plan(engine, prompt: list[int], at: int, titles: list[str]) -> dict[int, int]:
    """A plan of ``titles`` written from ``at`` new tokens into the answer of ``prompt``."""
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    toks = []
    for t in titles:
        toks += [sp.title, *engine.tokenizer.hf(t, add_special_tokens=False).input_ids, sp.end_title]
    toks.append(sp.para)
    start = len(prompt) - 1 + at
    return {start + j: tok for j, tok in enumerate(toks)}


def _spec(k: int = 4) -> dict:
    return {"row_type": partial(SpecRowDecoder, draft_tokens=k), "extra_slots": extra_slots(k)}


def test_spec_equals_aspd_with_a_three_branch_plan(engine):
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompt = engine.tokenizer.encode("Write helpers for the parser.\n")
    model = _Planner(engine.model, _plan(engine, prompt, 5, ["alpha", "beta", "gamma"]))
    plain, st0 = aspd_decode(model, sp, prompt, 160, frozenset(), max_branch_tokens=24)
    spec, st1 = aspd_decode(model, sp, prompt, 160, frozenset(), max_branch_tokens=24, record=True, **_spec())
    assert st0.groups >= 1 and st0.branches >= 3
    assert spec == plain
    assert st1.accepted > 0 and st1.steps < st0.steps  # the drafts did something
    _assert_trace_is_training_layout(sp, prompt, spec, st1)  # kept slots: the training layout


def test_spec_batch_equals_aspd_solo(engine):
    """Three rows in different modes share every pass: one plans at once, one later, one never."""
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompts = [engine.tokenizer.encode(t) for t in ("Write helpers.\n", "def f(a):\n    return a\n\n", "x = 1\n")]
    script = {**_plan(engine, prompts[0], 0, ["a", "bb", "ccc"]), **_plan(engine, prompts[1], 9, ["one", "two", "six"])}
    model = _Planner(engine.model, script)
    solo = [aspd_decode(model, sp, p, 140, frozenset(), max_branch_tokens=20)[0] for p in prompts]
    batch = aspd_decode_batch(model, sp, prompts, 140, frozenset(), max_branch_tokens=20, **_spec())
    assert [ids for ids, _ in batch] == solo
    assert sum(st.groups for _, st in batch) >= 2 and sum(st.accepted for _, st in batch) > 0


def test_without_the_position_remap_the_trace_breaks(engine):
    """Negative control for the layout check above: a spec decoder that forgets to move the kept
    slots' visibility after compaction does not reproduce the training layout."""
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    prompt = engine.tokenizer.encode("Write helpers for the parser.\n")
    model = _Planner(engine.model, _plan(engine, prompt, 5, ["alpha", "beta", "gamma"]))

    class Forgetful(SpecRowDecoder):
        def kept(self, length):
            extras = [list(it.extra) for it in self.fed_items]
            keep = super().kept(length)
            for it, e in zip(self.fed_items, extras):
                it.extra = e
            return keep

    spec, st = aspd_decode(
        model,
        sp,
        prompt,
        160,
        frozenset(),
        max_branch_tokens=24,
        record=True,
        row_type=partial(Forgetful, draft_tokens=4),
        extra_slots=extra_slots(4),
    )
    with pytest.raises(AssertionError):
        _assert_trace_is_training_layout(sp, prompt, spec, st)


def test_generate_and_stream_aspd_spec(engine):
    ids = engine.tokenizer.hf(
        "Write three helpers.\n<|title|>alpha<|/title|><|title|>beta<|/title|><|title|>gamma<|/title|><|para|>",
        add_special_tokens=False,
    ).input_ids
    plain = engine.generate(ids, method="aspd", max_new_tokens=60, ignore_eos=True)
    spec = engine.generate(ids, method="aspd+spec", max_new_tokens=60, ignore_eos=True)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.stats.extra["branches"] == 3 and spec.stats.extra["drafted"] > 0
    assert spec.stats.steps <= plain.stats.steps
    pieces = list(engine.stream(ids, method="aspd+spec", max_new_tokens=60, ignore_eos=True))
    assert "".join(pieces) == spec.text and len(pieces) > 3
    stop = spec.text.strip()[:3]
    cut = engine.generate(ids, method="aspd+spec", max_new_tokens=60, ignore_eos=True, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == spec.text[: spec.text.find(stop)]
    assert "".join(engine.stream(ids, method="aspd+spec", max_new_tokens=60, ignore_eos=True, stop=[stop])) == cut.text


def test_served_aspd_and_aspd_spec_equal_generate(engine):
    """`paradec serve` runs ASPD's own loop next to the scheduler's: concurrent aspd, aspd+spec
    and ar requests, streamed or not, each get the text `generate` gives."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from concurrent.futures import ThreadPoolExecutor

    from test_serve import _Server

    from paradec.serve import build_app

    prompt = "Write three helpers.\n<|title|>alpha<|/title|><|title|>beta<|/title|><|title|>gamma<|/title|><|para|>"
    expected = {
        m: engine.generate(prompt, method=m, max_new_tokens=40, ignore_eos=True).text
        for m in ("aspd", "aspd+spec", "ar")
    }
    assert expected["aspd"] == expected["aspd+spec"]
    app = build_app(engine, "tiny", max_batch=2, max_queue=16)
    server = _Server(app)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)

        def one(job):
            method, stream = job
            kw = dict(
                model="tiny",
                prompt=prompt,
                max_tokens=40,
                temperature=0,
                extra_body={"method": method, "ignore_eos": True},
            )
            if stream:
                return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
            return client.completions.create(**kw).choices[0].text

        jobs = [(m, s) for m in ("aspd", "aspd+spec", "ar") for s in (False, True)]
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(one, jobs))
        assert got == [expected[m] for m, _ in jobs]
    finally:
        server.stop()

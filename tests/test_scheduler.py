"""The shared loop as a server drives it: a long prompt is prefilled a chunk per step while the
others decode, a group's own failure ends that group only, and neither changes anyone's tokens."""

from __future__ import annotations

import pytest
import torch

import paradec
from paradec import methods, scheduler
from paradec.cpu import PassCost
from paradec.draft import RootDrafter
from paradec.policy.budget import BatchBudget
from paradec.scheduler import Scheduler

LOOKUP = "a b c d e f g a b c d e f g a b c"  # prompt lookup finds a chain at every step
LONG = "import os\nimport sys\n\n" + "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))


@pytest.fixture(scope="module")
def engine(llama_dir):
    # a flat pass-cost curve: whether a chain pays must not depend on this CPU's measured speed
    return paradec.load(llama_dir, dtype="bf16", warmup=False, cost=PassCost.flat())


def _group(engine, sched, prompt, method="ar", **opts):
    gen = engine.config(method=method, max_new_tokens=10, ignore_eos=True, **opts)
    rows = engine.new_rows([engine.tokenizer.encode(prompt)], gen)
    return sched.admit(rows, gen, methods.get(method).drafter(engine, gen))


def test_a_long_prompt_is_prefilled_a_chunk_per_step_while_the_others_decode(engine, monkeypatch):
    monkeypatch.setattr(scheduler, "PREFILL_CHUNK", 32)
    long_ids = engine.tokenizer.encode(LONG)
    assert len(long_ids) > 4 * 32
    alone = {
        p: engine.generate(p, method=m, max_new_tokens=10, ignore_eos=True).token_ids
        for p, m in ((LONG, "pld"), ("def f(x):", "ar"))
    }  # prefilled in the same chunks, all at once
    sched = Scheduler(engine, 3, 512, interleave_prefill=True)
    long = _group(engine, sched, LONG, "pld")
    short = _group(engine, sched, "def f(x):")
    assert not long.ready and short.ready  # the short prompt does not wait behind the long one
    chunks = -(-(len(long_ids) - 1) // 32)
    assert chunks < 10  # the short request is still decoding meanwhile
    for step in range(chunks):
        events = [g for g, _ in sched.step()]
        assert short in events  # the short request decoded at every step
        assert (long in events) == (step == chunks - 1)  # the long one from its last chunk's step on
    while sched.groups:
        list(sched.step())
    assert long.rows[0].new_ids == alone[LONG] and short.rows[0].new_ids == alone["def f(x):"]


def test_a_group_whose_sampling_fails_ends_alone(engine, monkeypatch):
    solo = engine.generate("def f(x):", max_new_tokens=10, ignore_eos=True).token_ids
    sched = Scheduler(engine, 2, 512)
    bad = _group(engine, sched, "import os", temperature=0.7, seed=1)
    good = _group(engine, sched, "def f(x):")
    real = Scheduler._accept

    def accept(self, proposals, logits, rows, gen):
        if not gen.sampling.greedy:
            raise FloatingPointError("probabilities are nan")
        return real(self, proposals, logits, rows, gen)

    monkeypatch.setattr(Scheduler, "_accept", accept)
    while sched.groups:
        list(sched.step())
    assert bad.error and "nan" in bad.error and good.error is None
    assert good.rows[0].new_ids == solo


def test_a_group_whose_drafter_fails_ends_alone(engine):
    class Broken(RootDrafter):
        def propose(self, sequences, generators):
            raise RuntimeError("drafter bug")

    solo = engine.generate("def f(x):", max_new_tokens=10, ignore_eos=True).token_ids
    sched = Scheduler(engine, 2, 512)
    gen = engine.config(max_new_tokens=10, ignore_eos=True)
    bad = sched.admit(engine.new_rows([engine.tokenizer.encode("import os")], gen), gen, Broken())
    good = _group(engine, sched, "def f(x):")
    while sched.groups:
        list(sched.step())
    assert bad.error == "RuntimeError: drafter bug" and good.rows[0].new_ids == solo
    with pytest.raises(RuntimeError, match="drafter bug"):
        engine.generate("x", drafter=Broken(), max_new_tokens=4)


def test_chunked_prefill_gives_the_features_one_pass_gives(engine, monkeypatch):
    """EAGLE's drafter starts from the prompt's hidden states: chunked, they are the same ones."""
    ids = engine.tokenizer.encode(LONG)[:100]
    seen = {}

    class Spy(RootDrafter):
        def begin(self, prompts, max_len, features=None):
            seen[len(seen)] = features

    for chunk in (512, 32):
        monkeypatch.setattr(scheduler, "PREFILL_CHUNK", chunk)
        sched = Scheduler(engine, 1, 256)
        gen = engine.config(max_new_tokens=2)
        sched.admit(engine.new_rows([ids], gen), gen, Spy())
    one, chunked = seen[0], seen[1]
    assert one.shape == chunked.shape == (1, len(ids) - 1, engine.model.config.hidden_size)
    torch.testing.assert_close(chunked.float(), one.float(), atol=0.05, rtol=0.05)


def test_auto_beside_rows_that_drafted_nothing_keeps_every_rows_tokens(engine):
    """A server's mix: auto's priced chain in one row, nothing drafted in the others. The batch
    cut weighs them together, and the next width is asked of rows that drafted nothing (once
    max() of an empty sequence: every stream beside it failed)."""
    prompts = {LOOKUP: "auto", "def f(x):": "ar", "x = 1\n": "pld"}
    alone = {p: engine.generate(p, method=m, max_new_tokens=10, ignore_eos=True).token_ids for p, m in prompts.items()}
    sched = Scheduler(engine, 3, 512, budget=BatchBudget(PassCost.flat()))
    groups = {p: _group(engine, sched, p, m) for p, m in prompts.items()}
    drafted = 0
    while sched.groups:
        drafted += sum(e.drafted > 0 for g, e in sched.step() if g is groups[LOOKUP])
    assert {p: g.rows[0].new_ids for p, g in groups.items()} == alone
    assert drafted and all(g.error is None for g in groups.values())


def test_every_group_learns_what_the_whole_pass_cost_and_committed(engine, monkeypatch):
    """A server's pass carries other groups' rows: a group verifying its root alone beside a
    prompt-lookup chain sees the pass as wide as that chain, every group's drafting time, and
    every row's committed tokens, so it never prices a 1-wide pass at a wide pass's time."""
    sched = Scheduler(engine, 2, 512, budget=None)
    plain = _group(engine, sched, "def f(x):")
    lookup = _group(engine, sched, LOOKUP, "pld")
    reports = {plain: [], lookup: []}
    for g in reports:
        monkeypatch.setattr(g.drafter, "observe", reports[g].append)
    committed = []
    for _ in range(4):
        committed.append(sum(len(event.token_ids) for _, event in sched.step()))
    for mine, other in ((reports[plain], reports[lookup]), (reports[lookup], reports[plain])):
        assert [r.committed for r in mine] == committed
        assert [r.width for r in mine] == [r.width for r in other] and [r.drafting for r in mine] == [
            r.drafting for r in other
        ]
    assert all(r.verified == 1 for r in reports[plain])  # its own tree: the root
    assert max(r.width for r in reports[plain]) > 1  # the pass: as wide as the chain beside it
    assert all(r.width >= r.verified for g in reports for r in reports[g])


def test_the_demo_times_its_methods_in_lockstep(engine, monkeypatch):
    """``paradec demo`` (and ``bench --lockstep``) steps every method's scheduler in turn, so the
    machine's drift falls on all of them alike: each gets the tokens ``generate`` gives it, and no
    method runs two steps while another still has one to run."""
    from paradec.bench.lockstep import lockstep

    order = []
    step = Scheduler.step

    def spy(self):
        order.append(id(self))
        return step(self)

    monkeypatch.setattr(Scheduler, "step", spy)
    methods = {"ar": {}, "pld": {"method": "pld"}}
    out = lockstep(engine, engine.encode(LOOKUP), methods, 12)
    monkeypatch.setattr(Scheduler, "step", step)
    for name, options in methods.items():
        want = engine.generate(LOOKUP, max_new_tokens=12, **options)
        assert out[name].token_ids == want.token_ids and out[name].stats.wall_s > 0
    assert out["pld"].stats.steps < out["ar"].stats.steps == 12  # the lookup text: pld drafts
    lanes = len(set(order))
    assert lanes == 2
    pairs = order[: 2 * out["pld"].stats.steps]  # while both run, each turn steps each once
    assert all(len(set(pairs[i : i + 2])) == 2 for i in range(0, len(pairs), 2))

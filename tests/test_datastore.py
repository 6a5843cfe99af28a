"""Retrieval drafting (`rest`, and `auto` offering it): the datastore's suffix search and chains,
saved whole and loaded back; the method greedy-identical to `ar` and sampled as the target; the
zoo's recipe; bad input."""

from __future__ import annotations

import json

import pytest
from conftest import PROMPTS, run_cli, two_token_joint_tv

import paradec
from paradec.cpu import PassCost
from paradec.draft.datastore import Datastore, DatastoreLookup, confidence
from paradec.errors import ParadecError
from paradec.testing import write_chat_gguf
from paradec.train.chat_data import load_questions
from paradec.train.chat_recipes import split

N_NEW = 24
DOCS = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 5], [9, 2, 3, 7]]


def test_a_chain_follows_the_most_frequent_continuation_of_the_longest_suffix():
    store = Datastore.build(DOCS)
    # [8, 1, 2, 3] never occurs, [1, 2, 3] does 3 times: then 4 (3 of 3), then 5 (2 of 3), then a document ends
    assert store.continuation([8, 1, 2, 3], 4) == (3, 3, [4, 5])
    assert store.continuation([8, 1, 2, 3], 1) == (3, 3, [4])
    # [0, 2, 3] never occurs; [2, 3] does 4 times: 4 three times, 7 once
    assert store.continuation([0, 2, 3], 4) == (2, 3, [4, 5])
    # every match of [4, 5] ends a document: nothing follows it, and a 1-token suffix is not searched
    assert store.continuation([3, 4, 5], 4) == (0, 0, [])
    assert store.continuation([42, 43], 4) == (0, 0, [])
    lookup = DatastoreLookup(store, num_draft=2)
    tree = lookup.propose([7, 1, 2, 3])
    assert tree.tokens == [3, 4, 5] and tree.parents == [-1, 0, 1]
    assert lookup.matched == confidence(3, 3) > confidence(3, 1) > confidence(2, 3) > 0
    assert lookup.propose([42, 43]).tokens == [43] and lookup.matched == 0


def test_a_datastore_is_saved_whole_and_loaded_back(tmp_path):
    store = Datastore.build(DOCS, {"answers_train": 4})
    store.save(tmp_path / "ds")
    back = Datastore.load(tmp_path / "ds")
    assert back.tokens.tolist() == store.tokens.tolist() and back.meta["answers_train"] == 4
    assert back.continuation([8, 1, 2, 3], 4) == store.continuation([8, 1, 2, 3], 4)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["datastore.json", "datastore.npz"]
    with pytest.raises(ParadecError, match="paradec train datastore"):
        Datastore.load(tmp_path)
    with pytest.raises(ParadecError, match="at least one"):
        Datastore.build([[], []])


@pytest.fixture(scope="module")
def engine(llama_dir, tmp_path_factory):
    """The tiny llama with a datastore of the first halves of its own answers and of random text:
    chains are right until the answer leaves what the store holds, and wrong in between."""
    import random

    engine = paradec.load(llama_dir, dtype="fp32", cost=PassCost.flat())  # a flat curve: drafts pay on any CPU
    ar = [g.token_ids for g in engine.generate(PROMPTS, max_new_tokens=N_NEW, ignore_eos=True)]
    rng = random.Random(0)
    noise = [[rng.randrange(engine.model.config.vocab_size) for _ in range(40)] for _ in range(20)]
    path = tmp_path_factory.mktemp("datastore")
    Datastore.build([p + a[: N_NEW // 2] for p, a in zip(engine.tokenizer.hf(PROMPTS).input_ids, ar)] + noise).save(
        path
    )
    engine.load_companion("datastore", path)
    return engine, ar


@pytest.mark.parametrize("batch", [1, 3])
def test_rest_gives_ar_tokens(engine, batch):
    engine, ar = engine
    if batch == 1:
        out = [engine.generate(p, method="rest", max_new_tokens=N_NEW, ignore_eos=True) for p in PROMPTS]
    else:
        out = engine.generate(PROMPTS, method="rest", max_new_tokens=N_NEW, ignore_eos=True)
    assert [g.token_ids for g in out] == ar
    assert sum(g.stats.steps for g in out) < len(PROMPTS) * N_NEW  # its chains were accepted


def test_auto_offers_the_datastore_and_stays_ar(engine):
    engine, ar = engine
    out = engine.generate(PROMPTS, method="auto", max_new_tokens=N_NEW, ignore_eos=True, deterministic=True)
    assert [g.token_ids for g in out] == ar
    assert sum(g.stats.drafters.get("rest", 0) for g in out) > 0


def test_rest_sampling_is_seeded(engine):
    engine, _ = engine
    kw = dict(method="rest", max_new_tokens=N_NEW, temperature=0.8, ignore_eos=True, seed=5)
    a, b = engine.generate(PROMPTS, **kw), engine.generate(PROMPTS, **kw)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_rest_samples_the_target_joint(llama_dir, tmp_path):
    """The first two sampled tokens with the datastore's chains (built from samples, so they are
    often right) against the target's exact joint; the bound rejects a wrong joint."""
    engine = paradec.load(llama_dir, dtype="fp32", cost=PassCost.flat())
    prompt = engine.tokenizer.encode("def f(x):")
    samples = engine.generate([prompt] * 24, max_new_tokens=3, temperature=0.15, top_k=3, seed=1, ignore_eos=True)
    Datastore.build([prompt + g.token_ids for g in samples]).save(tmp_path / "ds")
    engine.load_companion("datastore", tmp_path / "ds")
    tv, bound, counts, exact = two_token_joint_tv(engine, method="rest")
    assert tv < bound
    wrong = dict(exact)
    keys = sorted(wrong, key=wrong.get)
    wrong[keys[-1]], wrong[keys[0]] = wrong[keys[0]], wrong[keys[-1]]
    assert 0.5 * sum(abs(counts.get(k, 0) / 1600 - wrong.get(k, 0.0)) for k in set(counts) | set(wrong)) > bound


def test_rest_without_a_datastore_is_one_clear_error(llama_dir, tmp_path):
    r = run_cli("generate", "--model", str(llama_dir), "--method", "rest", "--max-new-tokens", "2", "x")
    assert r.returncode == 2 and "needs a datastore" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("generate", "--model", str(llama_dir), "--datastore", str(tmp_path), "x")
    assert r.returncode == 2 and "is not a datastore" in r.stderr and "Traceback" not in r.stderr


def test_the_recipe_builds_from_the_targets_training_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("PARADEC_HOME", str(tmp_path / "home"))
    model = write_chat_gguf(tmp_path / "chat.gguf")
    qs = [{"question_id": f"q{n}", "turns": [f"Name {n} colours."]} for n in range(12)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    other = {"question_id": "q1", "choices": [{"index": 0, "turns": ["Red, green and blue."]}]}
    (tmp_path / "a.jsonl").write_text(json.dumps(other) + "\n")
    out, run = tmp_path / "ds", tmp_path / "run"
    args = ["train", "datastore", "--target", str(model), "--questions", str(tmp_path / "q.jsonl"), "--out", str(out)]
    r = run_cli(*args, "--run-dir", str(run), "--answers", str(tmp_path / "a.jsonl"))
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "datastore.json").read_text())
    records = [json.loads(line) for line in (run / "answers.jsonl").read_text().splitlines()]
    held = {q for q, _ in split(load_questions(tmp_path / "q.jsonl"))[1]}
    assert meta["answers_train"] + meta["answers_heldout"] == len(records) == 12
    assert meta["answers_other_models"] == (0 if "q1" in held else 1)
    store = Datastore.load(out)
    train = [r["answer_ids"] for r in records if r["question_id"] not in held and r["answer_ids"]]
    assert len(store) >= sum(len(a) + 1 for a in train)  # every training answer, and a separator each
    r = run_cli("train", "datastore", "--questions", str(tmp_path / "missing.jsonl"), "--out", str(out))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr

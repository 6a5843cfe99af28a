"""ASPD on a chat model (the default model's recipe, on tiny random GGUF files): chat answers'
independent list items become training examples; fine-tuning adds the six ASPD tokens to a
vocabulary that lacks them; the adapter over the GGUF-converted base loads, equals transformers
on the merged weights, and decodes with aspd and aspd+spec."""

from __future__ import annotations

import json

import pytest
import torch

import paradec
from paradec.models.adapter import read_adapter
from paradec.models.checkpoint import merge_to_hf
from paradec.parallel.markup import BRANCH, TITLE
from paradec.testing import make_tokenizer, stdlib_text, write_gguf
from paradec.train.aspd import AspdTrainConfig, aspd_tokenizer, train_aspd
from paradec.train.aspd_chat import chat_examples, is_heldout
from paradec.train.aspd_data import collate

TIPS = [
    "Drink a glass of water every morning before breakfast.",
    "Walk for thirty minutes at a brisk pace.",
    "Sleep eight hours in a dark and quiet room.",
    "Eat vegetables with lunch and with dinner.",
    "Keep a short journal of what you are grateful for.",
]


def _answer(n: int, k: int) -> str:
    items = "".join(f"{i + 1}. {TIPS[(n + i) % len(TIPS)]}\n" for i in range(k))
    return f"Here are some tips for question {n}:\n\n{items}\nStay healthy!"


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    qs = [{"question_id": f"q{n}", "turns": [f"Give me {3 + n % 3} health tips, please ({n})."]} for n in range(24)]
    (d / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    answers = [{"question_id": f"q{n}", "choices": [{"index": 0, "turns": [_answer(n, 3 + n % 3)]}]} for n in range(24)]
    answers.append({"question_id": "q0", "choices": [{"index": 0, "turns": ["No list here at all."]}]})
    (d / "a.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    return d


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def gguf_base(request, tmp_path_factory):
    tok = make_tokenizer(320, stdlib_text(40_000), special=("<|im_start|>", "<|im_end|>"))
    path = tmp_path_factory.mktemp("gguf") / "base.gguf"
    write_gguf(
        path, tok, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, tie=request.param
    )
    return path


@pytest.fixture(autouse=True)
def paradec_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PARADEC_HOME", str(tmp_path / "home"))


def test_chat_examples_mark_lists_and_mask_the_prompt(chat_data, gguf_base):
    from paradec.models.gguf import resolve_model

    tok, new = aspd_tokenizer(resolve_model(gguf_base), add_markers=True)
    assert len(new) == 6 and tok.convert_tokens_to_ids(TITLE) >= 320
    train, held, stats = chat_examples(
        chat_data / "question.jsonl", [chat_data / "a.jsonl"], tok, "<|im_end|>", max_tokens=4096
    )
    assert stats["answers"] == 25 and stats["with_groups"] == 24 and stats["examples"] == 24
    assert {e.question_id for e in held} == {f"q{n}" for n in range(24) if is_heldout(f"q{n}")}
    ex = train[0]
    marked = tok.decode(ex.marked, skip_special_tokens=False)
    assert marked.count(BRANCH) == ex.branches >= 3 and marked.endswith("<|im_end|>")
    assert (
        tok.decode(ex.plain, skip_special_tokens=False) == _answer(int(ex.question_id[1:]), ex.branches) + "<|im_end|>"
    )
    _, y, _, _ = collate([ex.prompt + ex.marked], tok.convert_tokens_to_ids(BRANCH), None, loss_from=[len(ex.prompt)])
    assert (y[0, : len(ex.prompt) - 1] == -100).all() and (y[0, len(ex.prompt) - 1 :] != -100).all()
    # too long for the whole answer: cut after the last group that fits, no end of turn
    short, _, st = chat_examples(
        chat_data / "question.jsonl",
        [chat_data / "a.jsonl"],
        tok,
        "<|im_end|>",
        max_tokens=len(ex.prompt) + len(ex.marked) - 2,
    )
    cut = next(e for e in short if e.question_id == ex.question_id)
    assert st["cut"] >= 1 and cut.marked == ex.marked[: len(cut.marked)] or not tok.decode(cut.marked).endswith("!")


def test_adapter_over_gguf_base_equals_transformers_and_decodes(chat_data, gguf_base, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = AspdTrainConfig(
        questions=str(chat_data / "question.jsonl"),
        answers=(str(chat_data / "a.jsonl"),),
        rank=4,
        alpha=8.0,
        epochs=2,
        batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        eval_every=4,
        max_tokens=512,
    )
    out = tmp_path / "aspd"
    summary = train_aspd(gguf_base, out, tmp_path / "run" / "model", cfg)
    assert (
        summary["done"]
        and summary["heldout_loss"]
        < json.loads((tmp_path / "run" / "model" / "log.jsonl").read_text().splitlines()[0])["heldout_loss"]
    )
    acfg, base, _ = read_adapter(out)
    assert len(acfg.new_tokens) == 6 and base == gguf_base.resolve()
    engine = paradec.load(out, dtype="fp32")
    vocab = engine.model.config.vocab_size
    assert vocab == 320 + 6 and engine.tokenizer.hf.convert_tokens_to_ids(TITLE) == 320
    hf_dir = merge_to_hf(out, tmp_path / "merged", torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 320, 40, 321, 99, 324, 7, 325]])  # the new tokens too
    with torch.inference_mode():
        ours = engine.model(ids)
        theirs = ref(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4)
    old = torch.tensor([[5, 17, 40, 99, 7]])
    with torch.inference_mode():
        assert not torch.allclose(
            engine.model(old)[..., :320], paradec.load(gguf_base, dtype="fp32").model(old), atol=1e-3
        )  # the adapter changed the model
    msgs = [{"role": "user", "content": "Give me 3 health tips, please (7)."}]
    plain = engine.generate(msgs, method="aspd", max_new_tokens=60, ignore_eos=True)
    spec = engine.generate(msgs, method="aspd+spec", max_new_tokens=60, ignore_eos=True)
    assert spec.token_ids == plain.token_ids
    twin = train_aspd(
        gguf_base, tmp_path / "twin", tmp_path / "run" / "twin", AspdTrainConfig(**{**cfg.__dict__, "twin": True})
    )
    assert twin["done"] and paradec.load(tmp_path / "twin", dtype="fp32").model.config.vocab_size == 320

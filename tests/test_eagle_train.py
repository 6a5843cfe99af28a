"""EAGLE's training recipe (``paradec.train.eagle``): `paradec train eagle` end to end on a tiny
chat model, and the training-time test reading what a deep draft node reads at decode time."""

from __future__ import annotations

import pytest
import torch

import paradec
from paradec.models.eagle import EagleHead


def test_train_eagle_end_to_end_on_a_tiny_chat_model(tmp_path, monkeypatch):
    """`paradec train eagle`'s recipe on a tiny GGUF chat model: the target's answers plus another
    model's answers, a draft vocabulary; the shipped head loads and stays lossless; a warm start
    (``init``) on more answers computes only the new sequences' features; a run dir holding
    another configuration's unfinished state is refused, not silently resumed."""
    import json

    from paradec.errors import ParadecError
    from paradec.testing import write_chat_gguf
    from paradec.train.eagle import EagleTrainConfig, train_eagle

    monkeypatch.setenv("PARADEC_HOME", str(tmp_path / "home"))
    gguf = write_chat_gguf(tmp_path / "base.gguf")
    qs = [{"question_id": f"q{n}", "turns": [f"Write a function number {n}."]} for n in range(30)]
    (tmp_path / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    answers = [
        {"question_id": f"q{n}", "choices": [{"index": 0, "turns": [f"def f{n}(x):\n    return x + {n}\n"]}]}
        for n in range(30)
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    cfg = EagleTrainConfig(
        epochs=2, draft_vocab=64, answers=(str(tmp_path / "a.jsonl"),), max_len=96, accept_prompts=2, accept_tokens=16
    )
    summary = train_eagle(gguf, tmp_path / "head", tmp_path / "run", tmp_path / "question.jsonl", cfg)
    assert summary["done"] and summary["draft_vocab"] == 64
    assert summary["train_sequences"] > summary["train_sequences_target"] > 0
    assert 0 < summary["heldout_label_coverage"] <= 1 and len(summary["accept_per_depth"]) == 5
    engine = paradec.load(gguf, dtype="fp32", eagle=tmp_path / "head")
    assert len(engine.companions["eagle"].vocab) == 64
    msgs = [{"role": "user", "content": "Write a function number 7."}]
    ar = engine.generate(msgs, max_new_tokens=24, ignore_eos=True)
    assert engine.generate(msgs, method="eagle", max_new_tokens=24, ignore_eos=True).token_ids == ar.token_ids
    # more answers, warm-started from the head: only the new sequences' features are computed
    import paradec.train.eagle as recipe

    computed = []
    real_features = recipe.features
    monkeypatch.setattr(recipe, "features", lambda model, seqs: computed.extend(seqs) or real_features(model, seqs))
    more = [
        {"question_id": f"q{n}", "choices": [{"index": 0, "turns": [f"def g{n}(y):\n    return y * {n}\n"]}]}
        for n in range(30)
    ]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(a) + "\n" for a in more))
    warm = EagleTrainConfig(
        **{
            **cfg.__dict__,
            "answers": (str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")),
            "init": str(tmp_path / "head"),
            "epochs": 1,
            "ttt_steps": 2,
        }
    )
    summary2 = train_eagle(gguf, tmp_path / "head2", tmp_path / "run", tmp_path / "question.jsonl", warm)
    assert summary2["done"] and summary2["train_sequences"] > summary["train_sequences"]
    assert len(summary2["heldout_top1_per_step"]) == 2  # the training-time test's second depth is reported
    assert 0 < len(computed) <= summary2["train_sequences"] - summary["train_sequences"]
    assert all("def g" in engine.tokenizer.decode(seq) for seq in computed)  # the new answers only
    warmed = paradec.load(gguf, dtype="fp32", eagle=tmp_path / "head2").companions["eagle"]
    assert torch.equal(warmed.vocab, engine.companions["eagle"].vocab)  # the draft vocabulary came with the weights
    # an unfinished run is resumed by the same configuration only
    stopped = EagleTrainConfig(**{**cfg.__dict__, "minutes": 1e-9})
    assert not train_eagle(gguf, tmp_path / "head3", tmp_path / "run3", tmp_path / "question.jsonl", stopped)["done"]
    with pytest.raises(ParadecError, match="unfinished run"):
        train_eagle(
            gguf,
            tmp_path / "head3",
            tmp_path / "run3",
            tmp_path / "question.jsonl",
            EagleTrainConfig(**{**cfg.__dict__, "draft_vocab": 32}),
        )


def test_training_time_test_reads_what_a_deep_draft_node_reads(llama_dir):
    """EAGLE-3's training-time test: step k's prediction at position t equals the head run as a
    depth-(k + 1) draft chain at decode time: the true pairs up to t - k, then k pairs each reading
    the feature the head predicted one position before; and step k never sees its own step's
    other positions (a per-step causal mask is not the mask)."""
    from paradec.train.eagle import ttt_mask, ttt_predict

    engine = paradec.load(llama_dir, dtype="fp32")
    torch.manual_seed(0)
    cfg = engine.model.config
    head = EagleHead(cfg).float().eval()
    embed = engine.model.embed
    width, steps = 7, 3
    f_in = torch.randn(2, width, cfg.hidden_size)
    x_in = torch.randint(0, cfg.vocab_size, (2, width))
    with torch.no_grad():
        pred = ttt_predict(head, embed, f_in, x_in, steps).view(2, steps, width, -1)
        for k in range(steps):
            for t in range(k, width):
                feats, toks = f_in[:, : t - k + 1], x_in[:, : t - k + 1]
                for _ in range(k):  # one deeper: the next position reads the last prediction
                    out = head(feats, toks, torch.arange(feats.shape[1]).expand(2, -1), embed)
                    feats = torch.cat([feats, out[:, -1:]], 1)
                    toks = x_in[:, : feats.shape[1]]
                want = head(feats, toks, torch.arange(feats.shape[1]).expand(2, -1), embed)[:, -1]
                torch.testing.assert_close(pred[:, k, t], want, atol=1e-4, rtol=1e-4)
    mask = ttt_mask(width, steps)
    assert torch.equal(mask[:width, :width], torch.ones(width, width, dtype=torch.bool).tril())
    block_causal = torch.block_diag(*[torch.ones(width, width, dtype=torch.bool).tril()] * steps)
    assert not torch.equal(mask, block_causal | mask)  # step k sees none of its own step's other positions

"""Drafters for a chat model (the default SmolLM2-135M-Instruct): the SSM pool and the Medusa
heads, trained on the target's own answers to non-evaluation questions.

Data (``paradec.train.chat_data``): the target's greedy answers to every question (cached in the
run directory, resumable); questions are split into train / held-out by a hash of their id. The
SSMs are pretrained on other models' answers to the train questions (arena-hard ships six), then
boost-tuned on windows of the target's own answers. The heads read the target's hidden states
over whole (prompt + answer) sequences.

The SSM is sized for this machine: its step must cost <= 1/10 of a target step. The vocabulary
matrix (49k x d, tied) dominates a small draft's step, so d is small (192) and the embedding
starts as the target's embedding projected on its top principal directions.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import torch

from paradec.config import ModelConfig
from paradec.engine import load
from paradec.errors import ParadecError
from paradec.train.boost import DISTILL, PRETRAIN, boost_pool
from paradec.train.chat_data import answer_windows, chat_stream, load_questions, self_answers
from paradec.train.heads import fit_heads
from paradec.train.lm import StreamBatches

HELD_OUT_EVERY = 10  # crc32(question_id) % 10 == 0: held out


def ssm_config(target: ModelConfig) -> ModelConfig:
    """2 layers, d192, 3 heads of 64 (3 KV heads), SwiGLU 512, tied embeddings: ~10.3M
    parameters, 9.4M of them the vocabulary matrix."""
    return replace(
        target,
        hidden_size=192,
        intermediate_size=512,
        num_layers=2,
        num_heads=3,
        num_kv_heads=3,
        head_dim=64,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
    )


def pca_embedding(embed: torch.Tensor, dim: int) -> torch.Tensor:
    """embed [vocab, d_target] -> [vocab, dim]: coordinates on the top ``dim`` principal
    directions, rescaled to unit RMS per coordinate x 0.02 (the init scale of a fresh model)."""
    e = embed.float()
    _, _, vt = torch.linalg.svd(e - e.mean(0), full_matrices=False)
    proj = e @ vt[:dim].T
    return proj / proj.pow(2).mean().sqrt() * 0.02


def split(questions: list[tuple[str, str]]) -> tuple[list, list]:
    held = [q for q in questions if zlib.crc32(q[0].encode()) % HELD_OUT_EVERY == 0]
    train = [q for q in questions if zlib.crc32(q[0].encode()) % HELD_OUT_EVERY != 0]
    return train, held


def target_answers(target, questions_path: str | Path, run_dir: Path, max_new_tokens: int = 256) -> tuple:
    """(train records, held-out records) of the target's own greedy answers (cached)."""
    questions = load_questions(questions_path)
    if not questions:
        raise ParadecError(f"{questions_path} has no questions")
    records = self_answers(target, questions, run_dir / "answers.jsonl", max_new_tokens)
    held_ids = {q[0] for q in split(questions)[1]}
    return (
        [r for r in records if r["question_id"] not in held_ids],
        [r for r in records if r["question_id"] in held_ids],
    )


def train_chat_ssms(
    target_dir: str | Path,
    out_root: str | Path,
    run_dir: str | Path,
    questions_path: str | Path,
    answer_files: list[str | Path],
    num_ssms: int = 2,
    ctx_len: int = 64,
    cont_len: int = 32,
    stride: int = 8,
    pretrain_steps: int = 500,
    distill_steps: int = 250,
) -> dict:
    """Collective boost-tuning of ``num_ssms`` chat SSMs for the target: pretrained on answers to the
    training questions, then distilled on the target's own answers (``boost_pool``)."""
    target = load(target_dir, dtype="bf16", pack=False)  # trained through: plain linears
    train_recs, held_recs = target_answers(target, questions_path, Path(run_dir))
    train = answer_windows(train_recs, ctx_len, cont_len, stride)
    held = answer_windows(held_recs, ctx_len, cont_len, stride * 4)
    questions = dict(load_questions(questions_path))
    held_ids = {q for q, _ in split(list(questions.items()))[1]}
    hf = target.tokenizer.hf
    stream = chat_stream(hf, answer_files, {k: v for k, v in questions.items() if k not in held_ids})
    held_stream = chat_stream(hf, answer_files, {k: v for k, v in questions.items() if k in held_ids})
    if len(stream) < 10_000 or len(held_stream) < 2_000:
        raise ParadecError(
            "the answer files give too little pretraining text for the SSMs (need answers to the "
            "questions in questions=); pass answers=FILE ... (FastChat model_answer jsonl)"
        )
    cfg = ssm_config(target.model.config)
    init = _init_state(cfg, target.model.embed.weight.detach())
    pretrain = replace(
        PRETRAIN, batch_size=16, max_steps=pretrain_steps, warmup_steps=30, eval_every=100, eval_batches=8
    )
    distill = replace(DISTILL, seq_len=ctx_len + cont_len - 1, max_steps=distill_steps)
    report = {
        "target": Path(target_dir).name,
        "questions": Path(questions_path).name,
        "answers_train": len(train_recs),
        "answers_heldout": len(held_recs),
        "pretrain_tokens": int(len(stream)),
        "answer_files": [Path(a).name for a in answer_files],
    }
    return boost_pool(
        target,
        cfg,
        StreamBatches(stream),
        StreamBatches(held_stream).fixed(8, 16, 128),
        train,
        held,
        ctx_len,
        out_root,
        run_dir,
        num_ssms,
        pretrain,
        distill,
        init_state=init,
        save_tokenizer=False,
        report=report,
    )


def _init_state(cfg: ModelConfig, target_embed: torch.Tensor) -> dict:
    from paradec.models.llama import Transformer
    from paradec.train.lm import init_weights

    torch.manual_seed(0)
    model = Transformer(cfg)
    init_weights(model)
    model.embed.weight.data.copy_(pca_embedding(target_embed, cfg.hidden_size))
    return model.state_dict()


def train_chat_heads(
    target_dir: str | Path,
    out_dir: str | Path,
    run_dir: str | Path,
    questions_path: str | Path,
    num_heads: int = 4,
    early_layer: int | None = None,
    epochs: int = 2,
    batch: int = 512,
) -> dict:
    """Collective boost-tuning of ``num_ssms`` chat SSMs for the target: pretrained on answers to the
    training questions, then distilled on the target's own answers (``boost_pool``)."""
    target = load(target_dir, dtype="bf16", pack=False)  # trained through: plain linears
    train_recs, held_recs = target_answers(target, questions_path, Path(run_dir))

    def spans(recs):
        seqs = [r["prompt_ids"] + r["answer_ids"] for r in recs if len(r["answer_ids"]) > 1]
        return seqs, [
            (len(s) - len(r["answer_ids"]) - 1, len(s) - 1)
            for s, r in zip(seqs, [r for r in recs if len(r["answer_ids"]) > 1])
        ]

    meta = fit_heads(
        target.model,
        spans(train_recs),
        spans(held_recs),
        out_dir,
        num_heads,
        early_layer,
        epochs,
        batch=batch,
        cache=run_dir / "heads_features.pt",
        run_dir=run_dir / "heads",
    )
    meta["answers_train"], meta["answers_heldout"] = len(train_recs), len(held_recs)
    tmp = Path(out_dir) / "heads.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    tmp.replace(Path(out_dir) / "heads.json")
    return meta

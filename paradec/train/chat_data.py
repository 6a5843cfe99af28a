"""Training data for drafters of a chat model: its own answers (self-distillation) and other
models' answers to the same non-evaluation questions.

- ``self_answers``: the target's greedy answer to every question, through its chat template,
  appended to a jsonl file batch by batch (a rerun skips what is there: resumable).
- ``answer_windows``: fixed-size (context, continuation) samples cut from those answers. A greedy
  answer is, at every position, the target's greedy continuation of what precedes it, so every
  window whose continuation lies inside the answer is a self-distillation sample.
- ``chat_stream``: other models' answers (arena-hard's six) as one chat-formatted token stream,
  to pretrain a draft model before it is distilled on the target's own text.

Only questions outside the evaluation sets go in (arena-hard by default); MT-bench,
Vicuna-bench, Spec-Bench and HumanEval are for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from paradec.errors import ParadecError


def load_questions(path: str | Path) -> list[tuple[str, str]]:
    """(question_id, first turn) of a FastChat question.jsonl."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append((str(rec["question_id"]), str(rec["turns"][0])))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise ParadecError(
                f"{path}:{n} is not a question record with question_id and turns; pass a FastChat question.jsonl"
            ) from None
    return out


def self_answers(
    engine,
    questions: list[tuple[str, str]],
    out_path: str | Path,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 384,
    batch: int = 16,
) -> list[dict]:
    """The target's greedy answers, one jsonl record per question: ``question_id``,
    ``prompt_ids`` (chat template applied), ``answer_ids``, ``finish_reason``. Questions whose
    prompt is longer than ``max_prompt_tokens`` are skipped. Resumable."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = {r["question_id"] for r in read_jsonl(out_path)}
    todo = []
    for qid, text in questions:
        ids = engine.tokenizer.encode(text, chat=True)
        if qid not in done and len(ids) <= max_prompt_tokens:
            todo.append((qid, ids))
    todo.sort(key=lambda q: len(q[1]))  # similar lengths share a batch: less padding
    with open(out_path, "a") as f:
        for i in tqdm(range(0, len(todo), batch), desc="self-answers", unit="batch", dynamic_ncols=True):
            chunk = todo[i : i + batch]
            gens = engine.generate([ids for _, ids in chunk], max_new_tokens=max_new_tokens)
            for (qid, ids), g in zip(chunk, gens):
                f.write(
                    json.dumps(
                        {
                            "question_id": qid,
                            "prompt_ids": ids,
                            "answer_ids": g.token_ids,
                            "finish_reason": g.finish_reason,
                        }
                    )
                    + "\n"
                )
            f.flush()
    return read_jsonl(out_path)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by an interrupted run: drop it, it is redone
            continue
    return out


def answer_windows(records: list[dict], ctx_len: int, cont_len: int, stride: int) -> np.ndarray:
    """[n, ctx_len + cont_len] windows of prompt + answer whose last ``cont_len`` tokens lie in
    the answer; contexts shorter than ``ctx_len`` are left out."""
    out = []
    for rec in records:
        seq = rec["prompt_ids"] + rec["answer_ids"]
        first = max(len(rec["prompt_ids"]), ctx_len)  # where the first continuation may start
        for start in range(first, len(seq) - cont_len + 1, stride):
            out.append(seq[start - ctx_len : start + cont_len])
    return np.asarray(out, dtype=np.int64).reshape(-1, ctx_len + cont_len)


def chat_conversations(tokenizer, answer_files: list[str | Path], questions: dict[str, str]) -> list[list[int]]:
    """Other models' first-turn answers to ``questions``, each pair (question, answer) through
    the chat template: one token list per conversation."""
    out: list[list[int]] = []
    for path in answer_files:
        for rec in read_jsonl(Path(path)):
            q = questions.get(str(rec.get("question_id")))
            try:
                answer = rec["choices"][0]["turns"][0]
            except (KeyError, IndexError, TypeError):
                continue
            if q is None or not isinstance(answer, str):
                continue
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": q}, {"role": "assistant", "content": answer}], tokenize=False
            )
            out.append(tokenizer(text, add_special_tokens=False).input_ids)
    return out


def chat_stream(tokenizer, answer_files: list[str | Path], questions: dict[str, str]) -> np.ndarray:
    """Other models' answers to ``questions`` as one token stream: the chat conversations
    (``chat_conversations``) concatenated."""
    return np.asarray(
        [t for conv in chat_conversations(tokenizer, answer_files, questions) for t in conv], dtype=np.int64
    )

"""ASPD training data from chat answers: list items and sections that do not use one another.

The paper fine-tunes an instruct model on chat answers whose parallel structure its pipeline
extracted. Here the answers are arena-hard's (six models' answers to 478 questions, never an
evaluation set) plus, when given, the target's own greedy answers to the same questions
(``paradec.train.chat_data.self_answers``). ``paradec aspd extract``'s rules find the groups
(``find_groups``: lists and sections whose items are long enough and refer to no other item;
Python functions that use no sibling), ``mark_up`` writes them in the ASPD format, and the Seq
twin is the same answer without markup.

Each example is one conversation through the model's chat template: the prompt (system prompt,
question, the assistant turn opened; no loss) and the answer (loss), closed by the template's
end-of-turn token when the whole answer fits. An answer longer than ``max_tokens`` is cut at the
end of the last group that fits (a group is never cut), and the end-of-turn token is left out,
so the model never learns to stop mid-answer. Questions are split into train / held-out by
``crc32(question_id) % 10 == 0`` (the heads recipe's split).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from paradec.errors import ParadecError
from paradec.parallel.extract import find_groups
from paradec.parallel.markup import Group, mark_up
from paradec.train.chat_data import load_questions, read_jsonl


@dataclass(frozen=True)
class ChatExample:
    question_id: str
    source: str  # which answer file (model) it came from
    prompt: list[int]  # chat-template prompt, no loss
    marked: list[int]  # the answer in the ASPD format (+ end of turn when complete)
    plain: list[int]  # the same answer without markup (the Seq twin)
    groups: int
    branches: int


def is_heldout(question_id: str) -> bool:
    return zlib.crc32(question_id.encode()) % 10 == 0


def read_answers(path: Path, tokenizer) -> list[tuple[str, str]]:
    """(question_id, first-turn answer text) of a FastChat model_answer file, or of a
    ``self_answers`` file (token ids, decoded)."""
    out = []
    for rec in read_jsonl(path):
        if "answer_ids" in rec:
            out.append((str(rec["question_id"]), tokenizer.decode(rec["answer_ids"], skip_special_tokens=True)))
            continue
        try:
            out.append(
                (
                    str(rec["question_id"]),
                    str(
                        rec["choices"][0]["turns"][0]["content"]
                        if isinstance(rec["choices"][0]["turns"][0], dict)
                        else rec["choices"][0]["turns"][0]
                    ),
                )
            )
        except (KeyError, IndexError, TypeError):
            raise ParadecError(
                f"{path}: a record has neither answer_ids nor choices[0].turns[0]; "
                "pass FastChat model_answer files or paradec's self-answers"
            ) from None
    return out


def _fit(text: str, groups: list[Group], budget: int, count) -> tuple[str, list[Group], bool] | None:
    """The longest prefix of ``text`` within ``budget`` marked tokens: the whole answer, or the
    answer cut at the end of its last group that fits. -> (text, groups, complete) or None."""
    if count(mark_up(text, groups)) <= budget:
        return text, groups, True
    for k in range(len(groups), 0, -1):
        cut = text[: groups[k - 1].branches[-1].end]
        if count(mark_up(cut, groups[:k])) <= budget:
            return cut, groups[:k], False
    return None


def chat_examples(
    questions_path: str | Path,
    answer_paths: list[str | Path],
    tokenizer,
    end_of_turn: str,
    max_tokens: int = 512,
    max_prompt_tokens: int = 192,
    min_branches: int = 2,
) -> tuple[list[ChatExample], list[ChatExample], dict]:
    """(train, held-out, stats): one example per answer that has a group of at least
    ``min_branches`` branches and whose prompt fits ``max_prompt_tokens``."""
    questions = dict(load_questions(questions_path))

    def count(s: str) -> int:
        return len(tokenizer(s, add_special_tokens=False).input_ids)

    train, held = [], []
    stats = {"answers": 0, "with_groups": 0, "prompt_too_long": 0, "too_long": 0, "examples": 0, "cut": 0}
    for path in map(Path, answer_paths):
        if not path.is_file():
            raise ParadecError(f"answer file {str(path)!r} does not exist; pass FastChat model_answer files")
        for qid, text in read_answers(path, tokenizer):
            stats["answers"] += 1
            if qid not in questions:
                continue
            groups = [g for g in find_groups(text) if len(g.branches) >= min_branches]
            if not groups:
                continue
            stats["with_groups"] += 1
            msgs = [{"role": "user", "content": questions[qid]}]
            prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            prompt_ids = list(tokenizer(prompt, add_special_tokens=False).input_ids)
            if len(prompt_ids) > max_prompt_tokens:
                stats["prompt_too_long"] += 1
                continue
            fit = _fit(text, groups, max_tokens - len(prompt_ids) - 1, count)
            if fit is None:
                stats["too_long"] += 1
                continue
            text, groups, complete = fit
            stats["cut"] += not complete
            end = end_of_turn if complete else ""
            ex = ChatExample(
                qid,
                path.stem,
                prompt_ids,
                list(tokenizer(mark_up(text, groups) + end, add_special_tokens=False).input_ids),
                list(tokenizer(text + end, add_special_tokens=False).input_ids),
                len(groups),
                sum(len(g.branches) for g in groups),
            )
            (held if is_heldout(qid) else train).append(ex)
    stats["examples"] = len(train) + len(held)
    stats.update(train=_totals(train), heldout=_totals(held))
    return train, held, stats


def _totals(examples: list[ChatExample]) -> dict:
    return {
        "examples": len(examples),
        "groups": sum(e.groups for e in examples),
        "branches": sum(e.branches for e in examples),
        "answer_tokens_marked": sum(len(e.marked) for e in examples),
        "answer_tokens_plain": sum(len(e.plain) for e in examples),
        "prompt_tokens": sum(len(e.prompt) for e in examples),
    }


def save_examples(path: Path, train: list[ChatExample], held: list[ChatExample], stats: dict) -> None:
    from dataclasses import asdict

    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"train": [asdict(e) for e in train], "heldout": [asdict(e) for e in held], "stats": stats})
    )
    tmp.replace(path)

"""A datastore for retrieval drafting (``rest``; ``paradec train datastore``): the target's own
greedy answers to the training questions (``chat_recipes.target_answers``: cached in the run
directory, held-out questions kept out), and other models' answers to them if given.

The held-out answers measure it as a drafter, without timing anything: at every position of
every held-out answer, the chain the datastore proposes for the context so far, and how many of
its tokens the answer goes on with (greedy acceptance: what the target would accept).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paradec.draft.datastore import REST_DRAFT, Datastore, DatastoreLookup
from paradec.engine import load
from paradec.errors import ParadecError
from paradec.train.chat_data import load_questions, read_jsonl
from paradec.train.chat_recipes import split, target_answers


def build_chat_datastore(
    target_dir: str | Path,
    out_dir: str | Path,
    run_dir: str | Path,
    questions_path: str | Path,
    answer_files: tuple[str | Path, ...] = (),
    max_new_tokens: int = 256,
) -> dict:
    """Write ``out_dir``/datastore.{npz,json}; -> its meta (sizes, held-out acceptance)."""
    target = load(target_dir, batch=16)  # the answers are generated 16 at a time
    train_recs, held_recs = target_answers(target, questions_path, Path(run_dir), max_new_tokens)
    sequences = [r["answer_ids"] for r in train_recs]
    others = 0
    if answer_files:
        train_ids = {q[0] for q in split(load_questions(questions_path))[0]}
        for f in answer_files:
            for rec in read_jsonl(Path(f)):
                if str(rec.get("question_id")) not in train_ids:
                    continue
                for turn in rec["choices"][0]["turns"]:
                    text = turn["content"] if isinstance(turn, dict) else turn
                    sequences.append(target.tokenizer.encode(text))
                    others += 1
    if not sequences:
        raise ParadecError(f"{questions_path}: no training answers to build a datastore from")
    store = Datastore.build(sequences)
    held = heldout_acceptance(store, held_recs, REST_DRAFT["none"])
    store.meta = {
        "target": Path(target_dir).name,
        "answers_train": len(train_recs),
        "answers_other_models": others,
        "answers_heldout": len(held_recs),
        "heldout": held,
    }
    store.save(out_dir)
    return json.loads((Path(out_dir) / "datastore.json").read_text())


def heldout_acceptance(store: Datastore, records: list[dict], num_draft: int) -> dict:
    """Over every position of each held-out answer: the share with a chain, the share whose first
    token is the answer's, and the mean tokens of the chain the answer goes on with."""
    lookup = DatastoreLookup(store, num_draft)
    positions = chains = first = 0
    accepted: list[int] = []
    for rec in records:
        seq, start = rec["prompt_ids"] + rec["answer_ids"], len(rec["prompt_ids"])
        for i in range(start, len(seq) - 1):
            found = lookup.continuations(seq[: i + 1])
            positions += 1
            if not found:
                continue
            chain, rest = found[0], seq[i + 1 : i + 1 + num_draft]
            n = next((k for k, (a, b) in enumerate(zip(chain, rest)) if a != b), min(len(chain), len(rest)))
            chains += 1
            first += n > 0
            accepted.append(n)
    return {
        "positions": positions,
        "with_chain": round(chains / max(positions, 1), 4),
        "first_token_right": round(first / max(positions, 1), 4),
        "tokens_accepted_per_chain": round(float(np.mean(accepted)) if accepted else 0.0, 4),
    }

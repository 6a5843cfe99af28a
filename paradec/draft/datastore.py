"""Retrieval drafting (REST, He et al. 2023): propose what most often followed the context's
suffix in a datastore of text. No model, like prompt lookup, but the text it searches is a
corpus kept beside the model, not the prompt: the zoo's is the model's own answers to training
questions (``paradec train datastore``), so it proposes the model's habits (list markup, set
phrases, its way of opening and closing an answer) where the prompt has nothing to repeat.

The store is the corpus's tokens, documents separated by -1, and its positions sorted by the
``KEY`` tokens before them, nearest first (``np.lexsort``, at load). A context's suffix read
backwards narrows one range of that order a column at a time (``np.searchsorted``): the range
after n columns holds the occurrences of its n-token suffix, so one pass finds every length.
From the longest suffix that occurs (at least ``min_ngram`` tokens), the chain follows the most
frequent next token among the matches, keeps the matches that continue with it, and so on: the
path of a frequency-weighted trie, as REST drafts. Deterministic, so each token is a point-mass
draft.

``matched`` says how sure the chain is, as prompt lookup's matched suffix does: the suffix's
length and how many matches agreed on its first token (``confidence``); ``auto`` keeps its
acceptance statistics per value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paradec.errors import ParadecError
from paradec.options import option
from paradec.tree.proposal import DraftTree

KEY = 4  # the longest suffix searched
MIN_NGRAM = 2  # the shortest: one token matches almost anywhere and predicts little
SAMPLE = 512  # matches read per step of a chain at most (evenly spaced over the range): bounded time
FORMAT = 1  # datastore.json's version
# the longest chain by weight format, as prompt lookup's (``ngram.PLD_DRAFT``): a bf16 pass verifies
# 8 tokens for about the price of one, the packed int kernels' (and llama.cpp's) cost grows with the rows
REST_DRAFT = {"none": 8, "int8": 4, "int4": 4, "gguf": 4}


@dataclass(frozen=True)
class DatastoreOptions:
    """Retrieval drafting's options (rest)."""

    rest_draft: int | None = option(
        None,
        "rest: most tokens a chain drafts (default: " + ", ".join(f"{v} for {q}" for q, v in REST_DRAFT.items()) + ")",
    )

    def __post_init__(self) -> None:
        if self.rest_draft is not None and not 1 <= self.rest_draft <= 32:
            raise ParadecError(f"rest_draft must be in 1..32, got {self.rest_draft}")


class Datastore:
    """A corpus of token sequences, searchable by suffix. ``tokens`` [corpus]: documents separated by -1."""

    def __init__(self, tokens: np.ndarray, meta: dict | None = None) -> None:
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)  # [corpus]
        self.meta = meta or {}
        n = len(self.tokens)
        front = np.concatenate([np.full(KEY, -1, np.int32), self.tokens])
        # KEY x [corpus]: column i holds, for each position, the token i + 1 places before it, so
        # every suffix of a context (read backwards) narrows one range column by column
        columns = [front[KEY - 1 - i : KEY - 1 - i + n] for i in range(KEY)]
        self.order = np.lexsort(columns[::-1]).astype(np.int32)  # [corpus]: positions by the tokens before them
        self.sorted = [c[self.order] for c in columns]  # KEY x [corpus]
        # [largest token + 2]: where each token's range of the first column starts (token t: first[t + 1]
        # to first[t + 2], -1 at 0): two reads where a binary search over the corpus missed the caches ~17 times
        self.first = np.searchsorted(self.sorted[0], np.arange(-1, int(self.tokens.max(initial=0)) + 2), "left")
        self.padded = np.concatenate([self.tokens, np.full(33, -1, np.int32)])  # a chain never reads past the end

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def build(cls, sequences: list[list[int]], meta: dict | None = None) -> Datastore:
        parts = [np.asarray([*s, -1], dtype=np.int32) for s in sequences if s]
        if not parts:
            raise ParadecError("a datastore needs at least one non-empty token sequence")
        return cls(np.concatenate(parts), meta)

    def save(self, out: str | Path) -> None:
        """``out``/datastore.npz (the tokens) and datastore.json, each written whole or not at all."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "datastore.tmp.npz"
        np.savez_compressed(tmp, tokens=self.tokens)
        tmp.replace(out / "datastore.npz")
        meta = {"format": FORMAT, "tokens": len(self), **self.meta}
        (out / "datastore.json.tmp").write_text(json.dumps(meta, indent=1) + "\n")
        (out / "datastore.json.tmp").replace(out / "datastore.json")

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        path = Path(path)
        try:
            meta = json.loads((path / "datastore.json").read_text())
            with np.load(path / "datastore.npz") as f:
                tokens = f["tokens"]
        except (OSError, ValueError, KeyError) as e:
            raise ParadecError(
                f"{path} is not a datastore ({type(e).__name__}: {e}); pass a directory "
                "`paradec train datastore` wrote (datastore.npz + datastore.json)"
            ) from None
        if meta.get("format") != FORMAT:
            raise ParadecError(f"{path} is datastore format {meta.get('format')}, this paradec reads {FORMAT}")
        return cls(tokens, meta)

    def spans(self, tokens: list[int]) -> list[tuple[int, int, int]]:
        """(n, lo, hi) for each suffix of ``tokens`` of n = 1, 2, .. <= KEY tokens that occurs:
        ``order[lo:hi]`` are the positions right after its occurrences, where they go on."""
        if not tokens or not 0 <= tokens[-1] < len(self.first) - 2:
            return []
        lo, hi = int(self.first[tokens[-1] + 1]), int(self.first[tokens[-1] + 2])
        if lo == hi:
            return []
        out = [(1, lo, hi)]
        back = np.asarray(tokens[-2 : -KEY - 1 : -1], dtype=np.int32)  # int32: searchsorted never copies a column
        for i, (col, tok) in enumerate(zip(self.sorted[1:], back), 1):
            part = col[lo:hi]
            lo, hi = lo + int(part.searchsorted(tok, "left")), lo + int(part.searchsorted(tok, "right"))
            if lo == hi:
                break
            out.append((i + 1, lo, hi))
        return out

    def continuation(self, tokens: list[int], length: int, min_ngram: int = MIN_NGRAM) -> tuple[int, int, list[int]]:
        """(suffix length matched, matches that agree on the first token, chain of <= ``length``
        tokens) for the longest suffix of ``tokens`` that occurs and goes on: (0, 0, []) if none does."""
        for n, lo, hi in reversed(self.spans(tokens)):
            if n < min_ngram:
                break
            at = self.order[lo:hi]  # [matches]: where each match's continuation starts
            if len(at) > SAMPLE:
                at = at[:: -(-len(at) // SAMPLE)]
            chain, agree = [], 0
            while len(chain) < length:
                if len(at) == 1:  # one match left: the rest of its text, up to its document's end
                    tail = self.padded[at[0] : at[0] + length - len(chain)].tolist()
                    tail = tail[: tail.index(-1)] if -1 in tail else tail
                    agree = agree if chain else int(bool(tail))
                    chain += tail
                    break
                nxt = self.padded[at]
                tok, count = _most_frequent(nxt)
                if count == 0:
                    break
                if not chain:
                    agree = count
                chain.append(tok)
                at = at[nxt == tok] + 1
            if chain:  # else every match ended a document: a shorter suffix may go on
                return n, agree, chain
        return 0, 0, []


def _most_frequent(tokens: np.ndarray) -> tuple[int, int]:
    """(the most frequent token >= 0 of ``tokens``, its count); ties: the smallest. (-1, 0): none."""
    if len(tokens) <= 64:  # counted in a dict: ~2-4x faster than a Counter, ~5x than np.unique
        counts: dict[int, int] = {}
        for t in tokens.tolist():
            if t >= 0:
                counts[t] = counts.get(t, 0) + 1
        best, most = -1, 0
        for t, c in counts.items():
            if c > most or (c == most and t < best):
                best, most = t, c
        return best, most
    values, counts = np.unique(tokens[tokens >= 0], return_counts=True)
    if not len(values):
        return -1, 0
    best = int(counts.argmax())  # the first of the largest: the smallest token
    return int(values[best]), int(counts[best])


def confidence(n: int, agree: int) -> int:
    """A chain's statistics key: its suffix length (2..KEY) and whether 1, 2-3 or 4+ matches agreed."""
    return 0 if n == 0 else n * 4 + (0 if agree <= 1 else 1 if agree <= 3 else 2)


class DatastoreLookup:
    """Retrieval drafting with prompt lookup's interface (``continuations``, ``propose``, ``matched``)."""

    def __init__(self, store: Datastore, num_draft: int = 8, min_ngram: int = MIN_NGRAM) -> None:
        self.store, self.num_draft, self.min_ngram = store, num_draft, min_ngram
        self.matched = 0  # the last chain's ``confidence`` (0: none)

    @property
    def max_nodes(self) -> int:
        return self.num_draft

    def continuations(self, tokens: list[int]) -> list[list[int]]:
        n, agree, chain = self.store.continuation(tokens, self.num_draft, self.min_ngram)
        self.matched = confidence(n, agree) if chain else 0
        return [chain] if chain else []

    def propose(self, tokens: list[int]) -> DraftTree:
        """``tokens`` = prompt + generated so far (the last one is the root)."""
        out = DraftTree([tokens[-1]], [-1], [None])
        for parent, tok in enumerate(next(iter(self.continuations(tokens)), [])):
            out.tokens.append(tok)
            out.parents.append(parent)
            out.q.append(None)
        return out

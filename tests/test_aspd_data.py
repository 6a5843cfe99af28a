"""ASPD training data: marked windows decode back to the source; collate applies the layout."""

from __future__ import annotations

import torch
from conftest import THREE_FUNCTIONS

from paradec.parallel.markup import strip_markup
from paradec.testing import make_tokenizer, stdlib_text
from paradec.train.aspd_data import collate, examples_from_sources
from paradec.train.tokenizer import ASPD_TOKENS

SOURCE = '"""A module."""\n' + THREE_FUNCTIONS


def test_examples_and_collate():
    tok = make_tokenizer(512, stdlib_text(60_000), special=ASPD_TOKENS)
    (ex,) = examples_from_sources([SOURCE], tok)
    marked_text = tok.decode(ex.marked)
    assert "<|para|>" in marked_text and strip_markup(marked_text) == tok.decode(ex.plain) == SOURCE
    b_open, b_close = tok.convert_tokens_to_ids(["<|branch|>", "<|/branch|>"])
    x, y, pos, mask = collate([ex.marked, ex.plain], b_open, b_close)
    n = len(ex.marked) - 1
    assert x.shape == y.shape == pos.shape == (2, n) and mask.shape == (2, 1, n, n)
    starts = [i for i, t in enumerate(ex.marked[:-1]) if t == b_open]
    assert len(starts) == 2 and pos[0, starts[0]] == pos[0, starts[1]]  # siblings share positions
    assert not mask[0, 0, starts[1], starts[0]]  # ... and do not see each other
    pad = len(ex.plain) - 1
    assert (y[1, pad:] == -100).all() and mask[1, 0, pad:, :pad].sum() == 0
    _, _, pos_seq, mask_seq = collate([ex.plain], None, None)
    assert torch.equal(pos_seq[0], torch.arange(len(ex.plain) - 1)) and torch.equal(
        mask_seq[0, 0], mask_seq[0, 0].tril()
    )


def test_a_group_too_long_for_one_window_is_split_into_runs():
    tok = make_tokenizer(512, stdlib_text(60_000), special=ASPD_TOKENS)
    funcs = "".join(f"def f{i}(x):\n    return x * {i} + {i * 7} - len(str(x)) // 3\n\n\n" for i in range(6))
    source = '"""Six independent functions."""\n\n\n' + funcs + "print(f0(1))\n"
    (whole,) = examples_from_sources([source], tok, before=40, after=40)  # fits: one example, six branches
    assert tok.decode(whole.marked).count("<|branch|>") == 6
    limit = len(whole.marked) * 2 // 3
    parts = examples_from_sources([source], tok, max_tokens=limit, before=40, after=40)
    assert len(parts) >= 2
    for ex in parts:
        text = tok.decode(ex.marked)
        assert len(ex.marked) <= limit and text.count("<|branch|>") >= 2
        assert strip_markup(text) == tok.decode(ex.plain) and tok.decode(ex.plain) in source
    titles = [t for ex in parts for t in tok.decode(ex.marked).split("<|para|>")[0].split("<|title|>")[1:]]
    assert len(titles) == len(set(titles))  # runs do not overlap

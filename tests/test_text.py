"""TextStream, the one output processor: incremental text equal to decoding the whole answer,
for a byte-level BPE tokenizer and a SentencePiece-style one (a decode drops the first token's
leading space; bytes fall back to <0xNN> tokens), partial UTF-8 held back, stop strings found
at the step the whole-text check finds them, and a cost that stays linear in the answer."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models

from paradec.text import TextStream

WORDS = ["▁the", "▁cat", "▁sat", "a", "b", "▁", "é", "日本", "▁def", "(", ")", ":", "\n", "▁\n", "▁x", "y"]


@pytest.fixture(scope="module")
def sentencepiece():
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    vocab.update({w: len(vocab) + i for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return lambda ids: tok.decode(ids, skip_special_tokens=True), len(vocab)


@pytest.fixture(scope="module")
def bytelevel(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True), len(tokenizer)


def _answers(vocab: int, n: int, seed: int, valid_bytes: bool) -> list[list[list[int]]]:
    """Answers as lists of steps; about a third of the tokens are bytes of multi-byte characters,
    split across steps (``valid_bytes``: whole UTF-8 characters; else random lead and
    continuation bytes too). A byte-fallback decoder turns a whole run of byte tokens into
    U+FFFD when any of it is invalid, so only there the stream sees valid characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = []
        while len(ids) < rng.randrange(1, 60):
            if rng.random() < 0.7:
                ids.append(rng.randrange(257 if valid_bytes else 1, vocab))
            elif valid_bytes:
                ids += [b + 1 for b in rng.choice(["é", "日", "😀", "ß"]).encode()]
            else:
                ids.append(rng.choice([0xE6, 0x97, 0xA5, 0xC3, 0xA9]) + 1)
        steps, i = [], 0
        while i < len(ids):
            k = rng.randrange(1, 7)
            steps.append(ids[i : i + k])
            i += k
        out.append(steps)
    return out


@pytest.mark.parametrize("which", ["sentencepiece", "bytelevel"])
def test_pieces_concatenate_to_the_whole_decode(request, which):
    decode, vocab = request.getfixturevalue(which)
    for steps in _answers(vocab, 200, seed=1, valid_bytes=which == "sentencepiece"):
        stream, pieces = TextStream(decode), []
        for ids in steps:
            assert not stream.add(ids)
            piece = stream.piece()
            assert "\ufffd" not in piece[-1:] or not piece  # an unfinished character is never sent
            pieces.append(piece)
        pieces.append(stream.close())
        whole = decode([t for ids in steps for t in ids])
        assert "".join(pieces) == stream.text == whole


@pytest.mark.parametrize("which", ["sentencepiece", "bytelevel"])
def test_a_stop_string_ends_the_text_at_the_step_the_whole_text_shows_it(request, which):
    decode, vocab = request.getfixturevalue(which)
    rng = random.Random(2)
    checked = 0
    for steps in _answers(vocab, 300, seed=3, valid_bytes=which == "sentencepiece"):
        whole = decode([t for ids in steps for t in ids]).replace("\ufffd", "")
        if len(whole) < 6:
            continue
        start = rng.randrange(len(whole) - 3)
        stop = whole[start : start + rng.randrange(1, 4)]
        # the reference: the whole answer so far decoded after every step
        so_far, expected_step = [], None
        for k, ids in enumerate(steps):
            so_far += ids
            if stop in decode(so_far):
                expected_step = k
                break
        text = decode(so_far)
        stream, pieces = TextStream(decode, stop=(stop, "never-there")), []
        for k, ids in enumerate(steps):
            if stream.add(ids):
                assert k == expected_step
                break
            pieces.append(stream.piece())
        else:
            assert expected_step is None
        pieces.append(stream.close())
        assert "".join(pieces) == stream.text == (text[: text.find(stop)] if expected_step is not None else text)
        checked += expected_step is not None
    assert checked > 100


def test_held_back_text_waits_for_the_rest_of_a_stop_string(sentencepiece):
    decode, _ = sentencepiece
    ids = {w: 257 + i for i, w in enumerate(WORDS)}
    stream = TextStream(decode, stop=("▁cat sat".replace("▁", ""),))
    stream.add([ids["▁the"], ids["▁cat"]])
    assert stream.piece() == "t"  # the last 6 characters may begin "cat sat": held back
    assert stream.add([ids["▁sat"]]) and stream.close() == "he " and stream.text == "the "


def test_show_takes_a_text_rendered_anew(sentencepiece):
    decode, _ = sentencepiece
    stream = TextStream(decode, stop=("END",))
    assert not stream.show("1. a") and stream.piece() == "1."  # "END" may begin in the last 2
    assert not stream.show("1. ab\n2. c") and stream.piece() == " ab\n2."
    assert stream.show("1. ab\n2. cEND and more") and stream.close() == " c" and stream.text == "1. ab\n2. c"


def test_decoding_stays_linear_in_the_answer():
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return "".join(chr(97 + t % 26) for t in ids)

    stream = TextStream(decode, stop=("zzzzzz",))
    for _ in range(2000):
        stream.add([1, 2, 3])
        stream.piece()
    assert sum(calls) < 2000 * 2 * 7  # each add decodes two windows of about one step, not the answer
    stream.close()
    assert len(stream.text) == 6000

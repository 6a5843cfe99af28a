"""ASPD behind ``Engine.generate`` / ``Engine.stream``: the hybrid decoder's marked-up tokens
as the plain text users read (titles and markers dropped, branches in plan order).

Streaming shows text in plan order as it becomes final: serial text as it is decoded, and in
a parallel group the first unfinished branch live, while later branches are buffered until
every branch before them is done (``_RowDecoder.visible``). A plan's titles never show. The
pieces concatenate to ``generate``'s text.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import partial

from paradec.config import MAX_TREE_NODES
from paradec.errors import ParadecError
from paradec.options import option
from paradec.parallel.decode import _RowDecoder, aspd_decode_batch, aspd_steps
from paradec.parallel.grammar import Specials
from paradec.parallel.markup import strip_markup
from paradec.parallel.quality import well_formed
from paradec.parallel.spec import SpecRowDecoder, extra_slots
from paradec.state import Generation, Stats
from paradec.text import TextStream


@dataclass(frozen=True)
class AspdOptions:
    """ASPD's hybrid decoder."""

    title_retries: int = option(
        3, "aspd: decode a title that repeats the plan again this often (0: a repeat ends the plan)"
    )
    aspd_draft: int = option(0, "aspd: prompt-lookup tokens drafted after every branch and serial token")

    def __post_init__(self) -> None:
        if self.title_retries < 0:
            raise ParadecError(f"title_retries must be >= 0, got {self.title_retries}")
        if not 0 <= self.aspd_draft <= MAX_TREE_NODES:
            raise ParadecError(f"aspd_draft must be in [0, {MAX_TREE_NODES}], got {self.aspd_draft}")


def _plain(hf, ids: list[int]) -> str:
    """Marked-up token ids -> the text a user reads."""
    text = strip_markup(hf.decode(ids, skip_special_tokens=False))
    for special in hf.all_special_tokens:  # EOS and any other leftovers
        text = text.replace(special, "")
    return text


def _setup(engine, prompts: list[list[int]], gen) -> tuple[Specials, frozenset, int]:
    sp = Specials.from_tokenizer(engine.tokenizer.hf)
    eos = frozenset() if gen.ignore_eos else engine.tokenizer.eos_ids
    budget = min(gen.max_new_tokens, engine.model.config.context_length - max(len(p) for p in prompts))
    return sp, eos, budget


def _rows(gen) -> dict:
    """The row decoder: plain ASPD, or with drafts (``aspd_draft`` tokens per chain)."""
    k = gen.option(AspdOptions).aspd_draft
    return (
        {"row_type": partial(SpecRowDecoder, draft_tokens=k), "extra_slots": extra_slots(k)}
        if k
        else {"row_type": _RowDecoder}
    )


def generate_aspd(engine, prompts: list[list[int]], gen) -> list[Generation]:
    """``Engine.generate(method="aspd" | "aspd+spec")``: greedy hybrid decoding of a batch,
    plain text out."""
    hf = engine.tokenizer.hf
    sp, eos, budget = _setup(engine, prompts, gen)
    out = []
    for ids, st in aspd_decode_batch(
        engine.model, sp, prompts, budget, eos, title_retries=gen.option(AspdOptions).title_retries, **_rows(gen)
    ):
        text = _plain(hf, ids)
        extra = {
            "parallel_steps": st.parallel_steps,
            "parallel_tokens": st.parallel_tokens,
            "groups": st.groups,
            "branches": st.branches,
            "degree_of_parallelism": round(st.parallel_tokens / max(1, len(ids)), 4),
            "well_formed": well_formed(hf.decode(ids, skip_special_tokens=False)),
        }
        if gen.option(AspdOptions).aspd_draft:
            extra.update(
                drafted=st.drafted, accepted=st.accepted, acceptance=round(st.accepted / max(1, st.drafted), 4)
            )
        stats = Stats(
            gen.method,
            new_tokens=len(ids),
            steps=st.steps,
            wall_s=st.wall_s,
            extra=extra,
        )
        reason = "eos" if ids and ids[-1] in eos else "length"
        plain = TextStream(engine.tokenizer.decode, gen.stop)
        if plain.show(text):  # stop strings end the plain text (the decode itself ran to its end)
            reason = "stop"
        plain.close()
        out.append(Generation(plain.text, ids, reason, stats))
    return out


def stream_aspd(engine, prompt: list[int], gen) -> Generator[str, None, tuple[str, int]]:
    """``Engine.stream(method="aspd")``: the text of one prompt in plan order, one piece per
    forward pass ("" when a pass showed nothing new: a plan being decoded, a later branch), so
    a server can interleave it with other work pass by pass. Holds back what a stop string or
    an unfinished UTF-8 sequence may still change; a stop string ends the stream (and the
    decode). Returns (finish reason, marked tokens decoded)."""
    hf = engine.tokenizer.hf
    sp, eos, budget = _setup(engine, [prompt], gen)
    text = TextStream(engine.tokenizer.decode, gen.stop)  # shown its plain text anew each pass
    rows, reason = [], None
    for rows in aspd_steps(
        engine.model, sp, [prompt], budget, eos, title_retries=gen.option(AspdOptions).title_retries, **_rows(gen)
    ):
        if text.show(_plain(hf, rows[0].visible()[:budget])):
            reason = "stop"
            break
        yield text.piece()
    else:
        ids = rows[0].new[:budget] if rows else []
        reason = "stop" if text.show(_plain(hf, ids)) else "eos" if ids and ids[-1] in eos else "length"
    rest = text.close()
    if rest:
        yield rest
    return reason, len(rows[0].new[:budget]) if rows else 0

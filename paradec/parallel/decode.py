"""ASPD's hybrid decoding engine: serial decoding under a grammar, parallel branches on one cache.

Serial mode is plain decoding whose logits are masked by the grammar of papers.md §3.5 (titles
first, then ``<|para|>``; branch markers never appear serially). When the model emits
``<|para|>``, the titles it listed become branches: each starts from the forced prefix
``<|branch|> TITLE ":"`` and all active branches advance one token per forward pass, together,
on the same KV cache — the j-th token of every branch at the shared position p + 1 + j, each
seeing the prefix (up to and including ``<|para|>``) and its own earlier tokens only. A branch
ends at ``<|/branch|>`` (EOS counts as one), which is fed once more so it enters the cache. Then
``<|/para|>`` resumes serial decoding on the same cache: its position is the cache length,
which is the flattened index the training layout gives it, and it sees every branch. No
re-prefill, no KV copy. Greedy (branches and serial text alike).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from paradec.parallel.grammar import Specials, last_index, serial_mask, titles_of


@dataclass
class AspdStats:
    new_tokens: int = 0
    steps: int = 0  # target forward passes after prefill
    parallel_steps: int = 0
    parallel_tokens: int = 0  # branch tokens decoded in parallel mode
    groups: int = 0
    branches: int = 0
    wall_s: float = 0.0
    drafted: int = 0  # aspd+spec: draft tokens fed (forced branch prefixes included)
    accepted: int = 0  # ... and kept
    trace: list = field(default_factory=list)  # per cache slot: (token, position, visible slots, branch or -1)


@dataclass
class _Item:
    """One token fed in a pass: it may see slots [0, upto) and ``extra`` (absolute, own slot included)."""

    token: int
    position: int
    upto: int
    extra: list[int]
    branch: int = -1  # branch index in its group, -1 for serial tokens


class _RowDecoder:
    """One prompt's state machine: serial mode under the grammar, parallel mode on <|para|>."""

    def __init__(
        self,
        sp: Specials,
        prompt: list[int],
        max_new_tokens: int,
        eos: frozenset,
        vocab: int,
        max_branch_tokens: int,
        title_retries: int = 3,
    ) -> None:
        self.sp, self.eos, self.vocab = sp, eos, vocab
        self.max_new, self.max_branch, self.title_retries = max_new_tokens, max_branch_tokens, title_retries
        self.history = list(prompt)  # flattened sequence: prompt + everything generated
        self.new: list[int] = []
        self.root, self.just_merged = prompt[-1], False
        self.done = max_new_tokens < 1
        self.parallel = False
        self.stats = AspdStats()
        self.fed_items: list[_Item] = []
        self.truncate_to: int | None = None  # set when a rolled-back title must leave the cache
        self.title_bans: set[int] = set()  # first tokens of repeats, banned for the title being decoded ...
        self.ban_after: list[int] = []  # ... right after these tokens of it (a numbered title's number)

    # ---- what to feed ----------------------------------------------------------------------
    def items(self, length: int) -> list[_Item]:
        """Tokens to feed now; ``length`` = this row's committed cache length."""
        if not self._next_mode(length):
            return []
        if not self.parallel:  # serial: the root sees everything before it
            self.fed_items = [_Item(self.root, length, length + 1, [])]
            return self.fed_items
        items = []
        if self.first:  # <|para|> and every branch's first token in one pass
            items.append(_Item(self.sp.para, self.para_slot, self.para_slot + 1, []))
        for i in self._todo():
            slot = length + len(items)
            self.branch_slots[i].append(slot)
            items.append(
                _Item(
                    self.branch_tokens[i][self.fed[i]],
                    self.para_slot + 1 + self.fed[i],
                    self.para_slot + 1,
                    list(self.branch_slots[i]),
                    i,
                )
            )
            self.fed[i] += 1
        self.fed_items = items
        return items

    def _next_mode(self, length: int) -> bool:
        """Before a pass: merge a finished group, open a planned one; False when the row is done."""
        if self.done:
            return False
        if self.parallel and not self._todo():
            self._merge()
        if not self.parallel and len(self.new) >= self.max_new:
            self.done = True
            return False
        if not self.parallel and self.root == self.sp.para:
            self._open_group(length)
        return True

    def _todo(self) -> list[int]:
        return [i for i in range(len(self.titles)) if self.fed[i] < len(self.branch_tokens[i])]

    def _open_group(self, length: int) -> None:
        sp = self.sp
        self.titles = titles_of(self.history, sp)
        self.forced = [sp.branch_prefix(t) for t in self.titles]
        self.para_slot = length  # <|para|> ends `history` but is not in the cache yet
        self.branch_slots: list[list[int]] = [[] for _ in self.titles]
        self.branch_tokens = [[f[0]] for f in self.forced]
        self.fed = [0] * len(self.titles)
        self.first, self.parallel = True, True
        # Each branch's share of the budget, fixed when the group opens (markers included; one
        # token stays for <|/para|>): how far a branch may run does not depend on how fast the
        # others advance, so every schedule of the same group (one token per branch per pass,
        # or several with speculation) gives the same tokens.
        share = (self.max_new - len(self.new) - 1) // len(self.titles)
        self.branch_cap = min(self.max_branch + 1, share)

    def _merge(self) -> None:
        """Branches in order into the flattened sequence; <|/para|> continues serially."""
        for toks in self.branch_tokens:
            self.history.extend(toks)
            self.new.extend(toks)
            self.stats.parallel_tokens += len(toks)
        self.stats.groups += 1
        self.stats.branches += len(self.titles)
        self.history.append(self.sp.end_para)
        self.new.append(self.sp.end_para)
        self.root, self.just_merged, self.parallel = self.sp.end_para, True, False

    def visible(self) -> list[int]:
        """The marked-up new tokens that are final already, in plan order: the serial text up to
        a plan still being decoded (its titles may be rolled back), then in a parallel group the
        finished branches and the first unfinished one once its forced ``<|branch|>TITLE:`` is
        in; a later branch shows when every branch before it is done. Always a prefix of the
        final ``new`` (a group merges its branches in this order)."""
        new, sp = self.new, self.sp
        if not self.parallel:
            start = last_index(new, sp.end_para) + 1 if sp.end_para in new else 0
            plan = next((i for i in range(start, len(new)) if new[i] == sp.title), len(new))
            return new[:plan]
        out = list(new)
        for tokens, forced in zip(self.branch_tokens, self.forced):
            if len(tokens) < len(forced):
                break
            out.extend(tokens)
            if tokens[-1] != sp.end_branch:
                break
        return out

    # ---- what came out ---------------------------------------------------------------------
    def consume(self, logits: torch.Tensor) -> None:
        """logits [len(fed items), vocab] of the pass that fed ``self.fed_items``."""
        sp = self.sp
        self.stats.steps += 1
        if not self.parallel:
            budget_left = self.max_new - len(self.new)  # serial: merged branches are in `new`
            allowed = serial_mask(sp, self.history, self.just_merged, self.vocab, budget_left)
            # bans live only while one title is decoded again (cleared at its end or at <|para|>)
            if self.title_bans and self.history[last_index(self.history, sp.title) + 1 :] == self.ban_after:
                allowed[list(self.title_bans)] = False
            tok = int(logits[-1].float().masked_fill(~allowed.to(logits.device), float("-inf")).argmax())
            self.just_merged = False
            if tok == sp.end_title:
                start = last_index(self.history, sp.title)
                title = self.history[start + 1 :]
                if sp.core(title) in [sp.core(t) for t in titles_of(self.history, sp)]:
                    # Titles are unique, numbers aside ("4. Reviews" repeats "3. Reviews"). A repeat
                    # is rolled back (history and cache); the title is decoded again with the
                    # repeat's first token after its number banned, up to title_retries times;
                    # then the plan is taken as complete and the group opens.
                    retry = len(self.title_bans) < self.title_retries
                    if retry:
                        self.ban_after = sp.number_prefix(title)
                        self.title_bans.add(title[len(self.ban_after)])
                    keep = start + 1 if retry else start  # keep "<|title|>" to decode it again
                    cut = len(self.history) - keep
                    del self.history[keep:]
                    del self.new[len(self.new) - cut :]
                    self.truncate_to = start  # the caller truncates this row's cache
                    if retry:
                        self.root = sp.title  # fed again; its logits pick another first token
                        return
                    tok = sp.para
                else:
                    self.title_bans = set()
            if tok == sp.para:
                self.title_bans = set()
            self.history.append(tok)
            self.new.append(tok)
            self.root = tok
            self.done = tok in self.eos
            return
        self.stats.parallel_steps += 1
        out = logits[1:] if self.first else logits
        self.first = False
        todo = [it.branch for it in self.fed_items if it.branch >= 0]
        for k, i in enumerate(todo):
            if self.branch_tokens[i][-1] != sp.end_branch:  # else its end marker has just entered the cache
                self.branch_tokens[i].append(self.branch_next(i, out[k]))

    def branch_next(self, i: int, logits: torch.Tensor) -> int:
        """Branch ``i``'s next token from ``logits`` [vocab] at its last token: the forced
        prefix, then greedy without markers, ``<|/branch|>`` at EOS or the branch's cap."""
        sp = self.sp
        n_have = len(self.branch_tokens[i])
        if n_have < len(self.forced[i]):
            return self.forced[i][n_have]
        row = logits.float()
        row[[sp.title, sp.end_title, sp.para, sp.end_para, sp.branch]] = float("-inf")
        nxt = int(row.argmax())
        return sp.end_branch if nxt in self.eos or n_have + 1 >= self.branch_cap else nxt

    def kept(self, length: int) -> list[int]:
        """After ``consume``: which of the fed items stay in the cache (indices), given the
        row's committed ``length`` before the pass. Plain ASPD keeps them all."""
        return list(range(len(self.fed_items)))


def _forward(model, cache, items: list[list[_Item]], prefill: bool = False) -> torch.Tensor:
    """One pass: row r's items go to its next len(items[r]) (scratch) slots -> logits [batch, n, vocab]."""
    dev = model.embed.weight.device
    n = max(len(it) for it in items)
    starts = cache.starts()
    x = torch.zeros(len(items), n, dtype=torch.long)
    pos = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros(len(items), 1, n, max(starts) + n, dtype=torch.bool)
    for r, its in enumerate(items):
        for i, it in enumerate(its):
            x[r, i], pos[r, i] = it.token, it.position
            mask[r, 0, i, : it.upto] = True
            mask[r, 0, i, it.extra] = True
        for i in range(len(its), n):  # padding: sees its own slot only, never committed
            mask[r, 0, i, starts[r] + i] = True
    return model(x.to(dev), pos.to(dev), mask.to(dev), cache, prefill)


def aspd_steps(
    model,
    sp: Specials,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: frozenset,
    record: bool = False,
    max_branch_tokens: int = 512,
    title_retries: int = 3,
    row_type: type = _RowDecoder,
    extra_slots: int = 0,
) -> Iterator[list[_RowDecoder]]:
    """Greedy ASPD decoding of a batch, one forward pass per step for all rows, each row in its
    own mode (serial: one token; parallel: one token per active branch), padded to the widest.
    Yields the rows after every pass (``_RowDecoder.visible`` is what a stream may show).
    ``row_type``: the row's decoder (``paradec.parallel.spec`` adds drafts, ``extra_slots``
    per pass, which the cache must hold before the rejected ones leave it)."""
    vocab = model.config.vocab_size
    t0 = time.perf_counter()
    rows = [row_type(sp, p, max_new_tokens, eos, vocab, max_branch_tokens, title_retries) for p in prompts]
    cache = model.new_cache(len(prompts), max(len(p) for p in prompts) + 4 * max_new_tokens + 64 + extra_slots)

    # inference mode per pass, never across a yield: a caller may interleave several of these
    # generators (the server), and a mode left on or off by one would leak into the others
    with torch.inference_mode():
        prefill = [[_Item(t, i, i + 1, []) for i, t in enumerate(p[:-1])] for p in prompts]
        if any(prefill):  # all but the last token, like the main engine
            # a row alone where prompt passes take dense weights (``cpu.prefill``: their bits depend on the rows)
            alone = getattr(model, "prefill_path", None) is not None
            spans = [range(r, r + 1) for r in range(len(prompts))] if alone else [range(len(prompts))]
            for span in (s for s in spans if any(prefill[r] for r in s)):
                with cache.rows(span[0], len(span)) as part:
                    _forward(model, part, [prefill[r] for r in span], prefill=True)
            for r, its in enumerate(prefill):
                cache.advance(r, len(its))
                if record:
                    rows[r].stats.trace += [(it.token, it.position, list(range(it.upto)), -1) for it in its]
    while True:
        with torch.inference_mode():
            items = [row.items(cache.lengths[r]) for r, row in enumerate(rows)]
            if not any(items):
                break
            logits = _forward(model, cache, items)  # [batch, n, vocab]
            for r, (row, its) in enumerate(zip(rows, items)):
                if its:
                    length = cache.lengths[r]
                    row.consume(logits[r, : len(its)])
                    kept = row.kept(length)
                    cache.commit(r, kept)
                    if record:
                        for it in (its[k] for k in kept):
                            vis = list(range(it.upto)) + [e for e in it.extra if e >= it.upto]
                            row.stats.trace.append((it.token, it.position, vis, it.branch))
                if row.truncate_to is not None:
                    cache.truncate(r, row.truncate_to)
                    del row.stats.trace[row.truncate_to :]  # the trace is per cache slot
                    row.truncate_to = None
        for row in rows:
            row.stats.wall_s = time.perf_counter() - t0
        yield rows


def aspd_decode_batch(
    model,
    sp: Specials,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: frozenset,
    record: bool = False,
    max_branch_tokens: int = 512,
    title_retries: int = 3,
    **rows,
) -> list[tuple[list[int], AspdStats]]:
    """``aspd_steps`` to the end (``rows``: its row_type / extra_slots). Returns per prompt the
    marked-up new tokens (titles, markers and branches in branch order: the flattened sequence
    the model was trained on) and stats."""
    rows_out = []
    for rows_out in aspd_steps(  # noqa: B007 (the last yield is the answer)
        model, sp, prompts, max_new_tokens, eos, record, max_branch_tokens, title_retries, **rows
    ):
        pass
    out = []
    for row in rows_out:
        row.stats.new_tokens = len(row.new[:max_new_tokens])
        out.append((row.new[:max_new_tokens], row.stats))
    return out


def aspd_decode(
    model,
    sp: Specials,
    prompt: list[int],
    max_new_tokens: int,
    eos: frozenset,
    record: bool = False,
    max_branch_tokens: int = 512,
    title_retries: int = 3,
    **rows,
) -> tuple[list[int], AspdStats]:
    """``aspd_decode_batch`` for one prompt."""
    return aspd_decode_batch(
        model, sp, [prompt], max_new_tokens, eos, record, max_branch_tokens, title_retries, **rows
    )[0]

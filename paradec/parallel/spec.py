"""``aspd+spec``: speculation inside ASPD's branches (and between them), lossless w.r.t. ``aspd``.

Plain ASPD feeds one token per active branch per pass. Here every row feeds, in the same pass,
a draft after each token it would feed anyway:

- in parallel mode, each active branch's chain: the rest of its forced ``<|branch|>TITLE:``
  prefix (known, always accepted), then up to ``draft_tokens`` tokens found by prompt lookup in
  the row's own text (prompt, serial text, and this branch so far: list items repeat their
  own phrasing). A chain token sees the prefix, its branch's earlier tokens and the chain
  before it, at the branch's next positions: the branch-isolating mask and shared positions
  of plain ASPD, extended along the chain. One pass verifies every branch of every row;
- in serial mode, a prompt-lookup chain after the root (prompt lookup decoding).

Each fed token's logits go through exactly the decision plain ASPD makes at that point (the
serial grammar, title roll-back, a branch's forced prefix, marker suppression, its budget
share), so a draft token is kept only where plain ASPD would have chosen it; the first choice
that differs is the next token, as in greedy speculative decoding. Kept tokens move to
consecutive cache slots (``KVCache.commit``), the rest leave. With fp32 weights the text is
token-identical to ``aspd``'s; in bf16 the exact decode path (shape-invariant kernels) makes
it so too.
"""

from __future__ import annotations

import torch

from paradec.draft.ngram import NgramDrafter
from paradec.parallel.decode import _Item, _RowDecoder
from paradec.parallel.grammar import MAX_BRANCHES, MAX_TITLE_TOKENS

DRAFT_TOKENS = 4  # prompt-lookup tokens per chain (serial root or branch)


def extra_slots(draft_tokens: int) -> int:
    """Scratch slots one pass of a row may fill beyond its committed tokens."""
    return (MAX_BRANCHES + 1) * (draft_tokens + MAX_TITLE_TOKENS + 4)


class SpecRowDecoder(_RowDecoder):
    """A ``_RowDecoder`` whose passes carry draft chains; see the module docstring."""

    def __init__(self, *args, draft_tokens: int = DRAFT_TOKENS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lookup = NgramDrafter(max_ngram=3, num_draft=draft_tokens)
        self._keep: list[int] = []

    def _lookup(self, context: list[int], room: int) -> list[int]:
        """Up to ``room`` tokens that followed the newest earlier match of the context's tail
        (no ASPD markers: plain ASPD never chooses one mid-chain)."""
        if room <= 0:
            return []
        conts = self.lookup.continuations(context)
        out = []
        for tok in conts[0][:room] if conts else []:
            if tok in self.sp.ids and tok != self.sp.end_branch:
                break
            out.append(tok)
        return out

    # ---- what to feed ----------------------------------------------------------------------
    def items(self, length: int) -> list[_Item]:
        if not self._next_mode(length):
            return []
        if not self.parallel:
            draft = self._lookup(self.history, self.max_new - len(self.new) - 1)
            chain = [self.root] + draft
            self.fed_items = [_Item(t, length + j, length + j + 1, []) for j, t in enumerate(chain)]
            return self.fed_items
        items = []
        if self.first:
            items.append(_Item(self.sp.para, self.para_slot, self.para_slot + 1, []))
        for i in self._todo():
            toks = self.branch_tokens[i]
            chain = [toks[self.fed[i]]]
            if toks[-1] != self.sp.end_branch:
                forced = self.forced[i][len(toks) :]
                room = self.branch_cap - 1 - len(toks) - len(forced)  # its last token is <|/branch|>
                chain += forced + self._lookup(self.history + toks + forced, min(room, self.lookup.num_draft))
            slots = list(self.branch_slots[i])
            for j, tok in enumerate(chain):
                slots.append(length + len(items))
                items.append(_Item(tok, self.para_slot + 1 + self.fed[i] + j, self.para_slot + 1, list(slots), i))
        self.fed_items = items
        return items

    # ---- what came out ---------------------------------------------------------------------
    def consume(self, logits: torch.Tensor) -> None:
        """logits [len(fed items), vocab]: every fed token's choice, made as plain ASPD makes it."""
        fed = self.fed_items
        if not self.parallel:
            keep = [0]
            for j in range(len(fed)):
                steps = self.stats.steps
                _RowDecoder.consume(self, logits[j : j + 1])  # one serial decision
                self.stats.steps = steps + (j == 0)
                nxt = fed[j + 1].token if j + 1 < len(fed) else None
                if (
                    nxt is None
                    or self.history[-1] != nxt
                    or self.done
                    or self.parallel
                    or self.truncate_to is not None
                    or nxt in self.sp.ids
                    or len(self.new) >= self.max_new
                ):
                    break
                keep.append(j + 1)
        else:
            self.stats.steps += 1
            self.stats.parallel_steps += 1
            keep = [0] if self.first else []
            self.first = False
            j = len(keep)
            while j < len(fed):
                i, toks = fed[j].branch, self.branch_tokens[fed[j].branch]
                end = j + 1
                while end < len(fed) and fed[end].branch == i:  # this branch's chain
                    end += 1
                keep.append(j)
                if toks[-1] != self.sp.end_branch:  # else its end marker has just entered the cache
                    for k in range(j, end):
                        nxt = self.branch_next(i, logits[k])
                        toks.append(nxt)
                        if k + 1 == end or fed[k + 1].token != nxt:
                            break
                        keep.append(k + 1)
                        if nxt == self.sp.end_branch:
                            break
                j = end
        base = (
            1
            if not self.parallel
            else sum(1 for j, it in enumerate(fed) if it.branch < 0 or j == 0 or fed[j - 1].branch != it.branch)
        )
        self.stats.drafted += len(fed) - base
        self.stats.accepted += len(keep) - base
        self._keep = keep

    def kept(self, length: int) -> list[int]:
        """The kept items move to slots length, length + 1, ...: record where, for the branches
        (their slots) and for the trace (each kept item's visible slots)."""
        keep, fed = self._keep, self.fed_items
        moved = {length + k: length + q for q, k in enumerate(keep)}
        for q, k in enumerate(keep):
            it = fed[k]
            it.extra = [moved.get(e, e) for e in it.extra]  # a serial chain's kept part is its prefix: upto holds
            if it.branch >= 0:
                self.branch_slots[it.branch].append(length + q)
                self.fed[it.branch] += 1
        return keep

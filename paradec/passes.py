"""The target's passes outside the draft-verify step's bookkeeping: a prompt's prefill (a batch of
rows, or the next chunk of one long prompt) and one verification pass over a tree per cache row.
Each runs on this runtime (``models.llama``) or llama.cpp's (``models.llamacpp``), which gives
logits only."""

from __future__ import annotations

import torch

from paradec.state import Row
from paradec.tree import ScratchTree, pass_tensors


def prefill(model, rows: list[Row], cache) -> torch.Tensor | None:
    """Put every token but the root of each row into ``cache`` (right-padded batch). Returns
    their hidden states [rows, width, hidden] (not normed), None when there are none."""
    if model.backend != "torch":  # llama.cpp (models.llamacpp): logits only, no hidden states
        model.prefill([r.tokens for r in rows], cache)
        return None
    lengths = [len(r.tokens) - 1 for r in rows]
    width = max(lengths)
    if width == 0:
        return None
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        tokens[b, : lengths[b]] = torch.tensor(row.tokens[:-1])
    pos = torch.arange(width).expand(len(rows), width)
    # plain causal: a real query never sees padding, a padding query sees only finite rows
    causal = torch.ones(width, width, dtype=torch.bool).tril()[None, None]
    dev = model.embed.weight.device
    h = model.hidden(tokens.to(dev), pos.to(dev), causal.to(dev), cache, prefill=True)
    for b, n in enumerate(lengths):
        cache.advance(b, n)
    return h


def prefill_span(model, tokens: list[int], cache) -> torch.Tensor | None:
    """Put ``tokens`` into a one-row ``cache`` after what it holds (a chunk of a long prompt).
    Returns their hidden states [1, n, hidden] (not normed), None from a runtime without them."""
    if model.backend != "torch":
        model.append(0, tokens, cache)
        return None
    start, n = cache.lengths[0], len(tokens)
    pos = torch.arange(start, start + n)[None]
    mask = torch.cat([torch.ones(n, start, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)
    dev = model.embed.weight.device
    h = model.hidden(torch.tensor([tokens], device=dev), pos.to(dev), mask[None, None].to(dev), cache, prefill=True)
    cache.advance(0, n)
    return h


def verify_forward(model, trees: list, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """One target pass over one tree per cache row: logits [batch, width, vocab], final-normed
    hidden [batch, width, hidden] (None from a runtime that gives logits only)."""
    if model.backend != "torch":
        return model.verify(trees, cache), None
    width = max(len(t) for t in trees)
    rows = [ScratchTree.from_tree(t, width) for t in trees]
    tokens, pos, mask = pass_tensors(rows, 0, width, cache.lengths)
    dev = model.embed.weight.device
    h = model.hidden(tokens.to(dev), pos.to(dev), None if mask is None else mask.to(dev), cache)
    return model.normed_logits(h)

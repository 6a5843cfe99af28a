"""ASPD's hybrid decoding engine: serial decoding under a grammar, parallel branches on one cache.

Serial mode is plain decoding whose logits are masked by the grammar of papers.md §3.5 (titles
first, then ``<|para|>``; branch markers never appear serially). When the model emits
``<|para|>``, the titles it listed become branches: each starts from the forced prefix
``<|branch|> TITLE ": "`` and all active branches advance one token per forward pass, together,
on the same KV cache — the j-th token of every branch at the shared position p + 1 + j, each
seeing the prefix (up to and including ``<|para|>``) and its own earlier tokens only. A branch
ends at ``<|/branch|>`` (EOS counts as one), which is fed once more so it enters the cache. Then
``<|/para|>`` resumes serial decoding on the same cache: its position is the cache length,
which is the flattened index the training layout gives it, and it sees every branch. No
re-prefill, no KV copy. Greedy (branches and serial text alike).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from paradec.errors import ParadecError
from paradec.parallel.markup import BRANCH, END_BRANCH, END_PARA, END_TITLE, PARA, TITLE


@dataclass(frozen=True)
class Specials:
    title: int
    end_title: int
    para: int
    end_para: int
    branch: int
    end_branch: int
    colon_space: tuple[int, ...]  # the tokens of ": "

    @staticmethod
    def from_tokenizer(hf) -> "Specials":
        ids = hf.convert_tokens_to_ids([TITLE, END_TITLE, PARA, END_PARA, BRANCH, END_BRANCH])
        if any(i is None or i == hf.unk_token_id for i in ids):
            raise ParadecError("this model's tokenizer lacks ASPD's special tokens (<|title|> ... <|/branch|>); "
                               "use an ASPD-fine-tuned model (paradec train aspd)")
        return Specials(*ids, tuple(hf(": ", add_special_tokens=False).input_ids))


@dataclass
class AspdStats:
    new_tokens: int = 0
    steps: int = 0  # target forward passes after prefill
    parallel_steps: int = 0
    parallel_tokens: int = 0  # branch tokens decoded in parallel mode
    groups: int = 0
    branches: int = 0
    wall_s: float = 0.0
    trace: list = field(default_factory=list)  # per cache slot: (token, position, visible slots, branch or -1)


def serial_mask(sp: Specials, history: list[int], just_merged: bool, vocab: int) -> torch.Tensor:
    """[vocab] bool: the tokens the grammar allows next in serial mode."""
    allowed = torch.ones(vocab, dtype=torch.bool)
    allowed[[sp.end_para, sp.branch, sp.end_branch]] = False
    last = history[-1] if history else None
    in_titles = sp.title in history and (sp.para not in history[_last_index(history, sp.title):])
    if last == sp.end_title:
        allowed[:] = False
        allowed[[sp.title, sp.para]] = True
        return allowed
    if last == sp.title:
        allowed[[sp.title, sp.end_title, sp.para]] = False
    elif in_titles and _inside_title(history, sp):
        allowed[[sp.title, sp.para]] = False
    else:
        allowed[[sp.end_title, sp.para]] = False
    if just_merged:
        allowed[sp.title] = False
    return allowed


def _last_index(seq: list[int], tok: int) -> int:
    return len(seq) - 1 - seq[::-1].index(tok)


def _inside_title(history: list[int], sp: Specials) -> bool:
    """After a <|title|> with no <|/title|> since."""
    for tok in reversed(history):
        if tok == sp.end_title:
            return False
        if tok == sp.title:
            return True
    return False


def _titles(history: list[int], sp: Specials) -> list[list[int]]:
    """Token lists of the titles of the current plan (after the last <|/para|>), de-duplicated."""
    start = _last_index(history, sp.end_para) + 1 if sp.end_para in history else 0
    out, cur = [], None
    for tok in history[start:]:
        if tok == sp.title:
            cur = []
        elif tok == sp.end_title and cur is not None:
            if cur and cur not in out:
                out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(tok)
    return out


def aspd_decode(model, sp: Specials, prompt: list[int], max_new_tokens: int, eos: frozenset,
                record: bool = False, max_branch_tokens: int = 512) -> tuple[list[int], AspdStats]:
    """Greedy ASPD decoding of one prompt. Returns the marked-up new tokens (titles, markers and
    branches in branch order — the flattened sequence the model was trained on) and stats."""
    dev = model.embed.weight.device
    vocab = model.config.vocab_size
    stats = AspdStats()
    t0 = time.perf_counter()
    cache = model.new_cache(1, len(prompt) + 4 * max_new_tokens + 64)
    history = list(prompt)  # flattened sequence: prompt + everything generated

    def forward(tokens: list[int], positions: list[int], mask_rows: list[list[int]] | None,
                branches: list[int] | None = None):
        """One pass over new tokens appended at the end of the cache; commits them all."""
        length = cache.lengths[0]
        n = len(tokens)
        mask = None
        if mask_rows is not None:
            mask = torch.zeros(1, 1, n, length + n, dtype=torch.bool)
            for i, vis in enumerate(mask_rows):
                mask[0, 0, i, vis] = True
        x = torch.tensor([tokens], device=dev)
        pos = torch.tensor([positions], device=dev)
        logits = model(x, pos, None if mask is None else mask.to(dev), cache)[0]
        if record:
            for i, tok in enumerate(tokens):
                vis = mask_rows[i] if mask_rows is not None else list(range(length + i + 1))
                stats.trace.append((tok, positions[i], vis, branches[i] if branches else -1))
        cache.advance(0, n)
        return logits

    with torch.inference_mode():
        if len(prompt) > 1:  # prefill all but the last token, like the main engine
            forward(prompt[:-1], list(range(len(prompt) - 1)), [list(range(i + 1)) for i in range(len(prompt) - 1)])
        root, just_merged = prompt[-1], False
        new: list[int] = []
        while len(new) < max_new_tokens:
            if root != sp.para:  # ---- serial mode ------------------------------------------------
                length = cache.lengths[0]
                logits = forward([root], [length], None if not record else [list(range(length + 1))])
                stats.steps += 1
                allowed = serial_mask(sp, history, just_merged, vocab)
                tok = int(logits[-1].float().masked_fill(~allowed.to(dev), float("-inf")).argmax())
                just_merged = False
                history.append(tok)
                new.append(tok)
                if tok in eos:
                    break
                root = tok
                continue
            # ---- parallel mode: <|para|> ends `history` but is not in the cache yet -------------
            titles = _titles(history, sp)
            forced = [[sp.branch, *t, *sp.colon_space] for t in titles]
            para_slot = cache.lengths[0]  # <|para|> goes here, at position para_slot
            prefix = list(range(para_slot + 1))
            branch_slots: list[list[int]] = [[] for _ in titles]
            branch_tokens: list[list[int]] = [[f[0]] for f in forced]
            fed = [0] * len(titles)  # tokens of each branch already in the cache
            suppress = [sp.title, sp.end_title, sp.para, sp.end_para, sp.branch]
            first = True
            while True:
                todo = [i for i in range(len(titles)) if fed[i] < len(branch_tokens[i])]
                budget_left = max_new_tokens - len(new) - sum(len(b) for b in branch_tokens)
                if not todo:
                    break
                tokens, positions, rows, tags = [], [], [], []
                if first:  # <|para|> and every branch's first token in one pass
                    tokens, positions, rows, tags = [sp.para], [para_slot], [prefix], [-1]
                for i in todo:
                    slot = cache.lengths[0] + len(tokens)
                    tokens.append(branch_tokens[i][fed[i]])
                    positions.append(para_slot + 1 + fed[i])
                    rows.append(prefix + branch_slots[i] + [slot])
                    tags.append(i)
                    branch_slots[i].append(slot)
                    fed[i] += 1
                logits = forward(tokens, positions, rows, tags)
                stats.steps += 1
                stats.parallel_steps += 1
                out = logits[1:] if first else logits
                first = False
                for k, i in enumerate(todo):
                    if branch_tokens[i][-1] == sp.end_branch:
                        continue  # its end marker has just entered the cache: the branch is done
                    n_have = len(branch_tokens[i])
                    if n_have < len(forced[i]):
                        nxt = forced[i][n_have]
                    else:
                        row = out[k].float()
                        row[suppress] = float("-inf")
                        nxt = int(row.argmax())
                        if nxt in eos or n_have >= max_branch_tokens or budget_left <= len(todo):
                            nxt = sp.end_branch
                    branch_tokens[i].append(nxt)
            # ---- merge: branches in order; <|/para|> continues serially on the same cache -------
            for toks in branch_tokens:
                history.extend(toks)
                new.extend(toks)
                stats.parallel_tokens += len(toks)
            stats.groups += 1
            stats.branches += len(titles)
            history.append(sp.end_para)
            new.append(sp.end_para)
            root, just_merged = sp.end_para, True
    stats.new_tokens = len(new)
    stats.wall_s = time.perf_counter() - t0
    return new[:max_new_tokens], stats


def generate_aspd(engine, prompt: list[int], gen):
    """``Engine.generate(method="aspd")`` for one prompt: greedy hybrid decoding, plain text out."""
    from paradec.parallel.markup import strip_markup
    from paradec.state import Generation, Stats

    if not gen.sampling.greedy:
        raise ParadecError("method aspd decodes greedily; drop --temperature")
    hf = engine.tokenizer.hf
    sp = Specials.from_tokenizer(hf)
    eos = frozenset() if gen.ignore_eos else engine.tokenizer.eos_ids
    budget = min(gen.max_new_tokens, engine.model.config.context_length - len(prompt))
    ids, st = aspd_decode(engine.model, sp, prompt, budget, eos)
    text = strip_markup(hf.decode(ids, skip_special_tokens=False))
    for special in hf.all_special_tokens:  # EOS and any other leftovers
        text = text.replace(special, "")
    stats = Stats("aspd", new_tokens=len(ids), steps=st.steps, wall_s=st.wall_s,
                  extra={"parallel_steps": st.parallel_steps, "parallel_tokens": st.parallel_tokens,
                         "groups": st.groups, "branches": st.branches,
                         "degree_of_parallelism": round(st.parallel_tokens / max(1, len(ids)), 4)})
    return Generation(text, ids, "eos" if ids and ids[-1] in eos else "length", stats)

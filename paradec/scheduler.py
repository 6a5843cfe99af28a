"""The decode loop every method shares, as a scheduler of groups of rows on one KV cache.

    admit(rows, gen, drafter) -> prefill them alone, into free cache rows
    step()                    -> every group proposes (greedy trees cut to the width that pays on
                                 this CPU: ``policy.budget``); ONE target pass verifies every live row's
                                 tree; each group accepts with its own sampling settings; the
                                 accepted K/V are committed; finished groups leave

A group is what was submitted together: its rows share one drafter (whose state, such as SSM
caches, n-gram tables or ProPD's policy, is the group's own) and one ``GenerationConfig``.
``Engine.generate`` admits one group and steps until it is done; the server admits one group
per request and keeps stepping while requests come and go (continuous batching). One loop.

A row's tokens do not depend on what else is in the pass: the runtime's decode/verification
numerics are row- and shape-invariant (``models.llama``), so a greedy request gets the same
text alone or beside others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from paradec.config import GenerationConfig
from paradec.draft import Drafter, Proposal
from paradec.policy.budget import BatchBudget
from paradec.sampling import greedy
from paradec.state import Row, StepEvent, Verification
from paradec.tree import ScratchTree, pass_tensors
from paradec.verify import Verdict, accept_greedy, accept_mss, accept_naive
from paradec.verify.prune import pruned_pass
from paradec.verify.typical import accept_typical


@dataclass(eq=False)
class Group:
    """Rows submitted together: one drafter, one generation config, consecutive cache rows."""

    rows: list[Row]
    gen: GenerationConfig
    drafter: Drafter
    first: int = 0  # its first cache row
    start: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # its owner is gone (a client disconnected): it leaves at the next step

    @property
    def done(self) -> bool:
        return self.cancelled or all(row.done for row in self.rows)


class Scheduler:
    """Groups of rows decoding together on one KV cache of ``capacity`` rows x ``max_len`` slots.

    ``target``: the engine (model, heads, tokenizer). Not thread-safe: one thread steps it."""

    def __init__(self, target, capacity: int, max_len: int, budget: BatchBudget | None = None) -> None:
        self.target = target
        self.cache = target.model.new_cache(capacity, max_len, live=0)
        self.groups: list[Group] = []
        self.budget = budget  # cuts greedy trees to the width that pays (``policy.budget``)

    @property
    def free_rows(self) -> int:
        return self.cache.capacity - self.cache.batch

    def fits(self, rows: list[Row], drafter: Drafter) -> bool:
        """Whether these rows' prompts, budgets and trees fit a cache row."""
        need = max(len(r.tokens) + r.budget for r in rows) + 1 + drafter.max_nodes
        return need <= self.cache.max_len

    def admit(self, rows: list[Row], gen: GenerationConfig, drafter: Drafter) -> Group:
        """Prefill ``rows`` (alone, in free cache rows) and start their drafter; they join the
        next step."""
        if len(rows) > self.free_rows or not self.fits(rows, drafter):
            raise RuntimeError("the rows do not fit the cache (check free_rows and fits first)")
        group = Group(rows, gen, drafter, self.cache.add_rows(len(rows)))
        with torch.inference_mode(), self.cache.rows(group.first, len(rows)) as cache:
            h = prefill(self.target.model, rows, cache)
            features = None if h is None else self.target.model.norm(h)
        max_len = max(len(r.tokens) + r.budget for r in rows) + 1
        drafter.begin([r.tokens for r in rows], max_len, features)
        prefill_s = time.perf_counter() - group.start
        for row in rows:
            row.stats.prefill_s = prefill_s
        self.groups.append(group)
        return group

    def step(self) -> Iterator[tuple[Group, StepEvent]]:
        """One decode step of every live group: propose -> verify (one target pass) -> accept ->
        commit -> observe. Yields (group, event) per row that committed tokens; then groups that
        are done leave (their cache rows are freed)."""
        self._leave()
        if not self.groups:
            return
        t_step = time.perf_counter()
        with torch.inference_mode():
            proposals: list[Proposal] = []
            for g in self.groups:
                t_draft = time.perf_counter()
                proposals += g.drafter.propose([r.tokens for r in g.rows], [r.generator for r in g.rows])
                if self.budget is not None and max(len(p.tree) for p in proposals[g.first:]) > 1:
                    self.budget.observe_draft(g.gen.method, time.perf_counter() - t_draft)
            drafted = [len(p.tree) for p in proposals]
            proposals, trees, width = self._cut(proposals)
            if trees is not None:  # the next proposals need reach no further than this width (+1), or nowhere
                width = self.budget.next_width(trees, width)
            for g in self.groups:
                g.drafter.set_width(width if trees is not None and not g.gen.spec.dynamic else None)
            t_fwd = time.perf_counter()
            ver = self._verify(proposals)
            if ver.logits.device.type == "cuda":
                torch.cuda.synchronize()  # host sync: only to time the pass; acceptance syncs anyway
            t_fwd = time.perf_counter() - t_fwd
            if trees is not None:
                self.budget.observe_pass(len(proposals) * max(len(p.tree) for p in proposals), t_fwd)
            batch = self.cache.batch
            for g in self.groups:
                span = slice(g.first, g.first + len(g.rows))
                verdicts = self._accept(ver.proposals[span], ver.logits[span], g.rows, g.gen)
                for i, (row, verdict) in enumerate(zip(g.rows, verdicts)):
                    if row.done:
                        continue
                    committed = self._commit(g, i, ver, verdict)
                    if trees is not None and not g.gen.spec.dynamic:
                        self.budget.observe(g.gen.method, drafted[g.first + i] - 1,
                                            len(ver.proposals[g.first + i].tree) - 1, verdict.nodes[1:])
                    row.stats.steps += 1
                    row.stats.target_s += t_fwd
                    row.stats.nodes += drafted[g.first + i]
                    row.stats.verified += len(ver.proposals[g.first + i].tree)
                    if row.done:
                        row.stats.wall_s = time.perf_counter() - g.start
                    yield g, StepEvent(i, committed)
                g.drafter.step_done(batch, max(drafted[span]), max(len(p.tree) for p in ver.proposals[span]),
                                    time.perf_counter() - t_step, ver.early_top is not None)
        self._leave()

    def _commit(self, g: Group, i: int, ver: Verification, verdict: Verdict) -> list[int]:
        b, row = g.first + i, g.rows[i]
        prop = ver.proposals[b]
        accepted = [prop.tree.tokens[n] for n in verdict.nodes[1:]]
        committed = self._append(row, accepted + [verdict.bonus], g.gen)
        nodes = verdict.nodes[: len(committed)]  # EOS / budget may cut the path
        self.cache.commit(b, [ver.slot(b, n) for n in nodes])
        g.drafter.commit(i, accepted, verdict.bonus, ver.hidden[b, verdict.nodes])
        if ver.early_top is not None:
            # was the target's next token in the early head's top-k at the last node?
            top = ver.early_top[b].get(ver.slot(b, verdict.nodes[-1]))
            if top is not None:
                g.drafter.observe_recall(verdict.bonus in top)
        row.stats.record(max(prop.tree.depths), len(accepted))
        return committed

    def _leave(self) -> None:
        """Groups that are done free their cache rows; the later groups move down."""
        for g in [g for g in self.groups if g.done]:
            self.cache.remove_rows(g.first, len(g.rows))
            self.groups.remove(g)
            for later in self.groups:
                if later.first > g.first:
                    later.first -= len(g.rows)

    # ---- the pieces of a step ---------------------------------------------------------------
    def _cut(self, proposals: list[Proposal]) -> tuple[list[Proposal], list | None, int]:
        """With a budget and every group greedy: each row's tree cut to the width the budget
        chooses for the pass (groups whose drafter sizes its own trees keep them whole). ->
        (proposals, the rows' (method, proposed nodes) or None when nothing was decided, the width)."""
        widest = max(len(p.tree) for p in proposals)
        if self.budget is None or not all(g.gen.sampling.greedy for g in self.groups):
            return proposals, None, widest
        if widest == 1:  # nothing drafted: the drafters may look one node further again
            return proposals, [], 1
        sized = [b for g in self.groups if g.gen.spec.dynamic for b in range(g.first, g.first + len(g.rows))]
        if len(sized) == len(proposals):
            return proposals, None, widest
        trees = [(g.gen.method, len(p.tree) - 1) for g in self.groups
                 for p in proposals[g.first: g.first + len(g.rows)]]
        cuttable = [t for b, t in enumerate(trees) if b not in sized]
        width = max([self.budget.choose(cuttable)] + [len(proposals[b].tree) for b in sized])
        return [p if len(p.tree) <= width or b in sized else p.cut(width) for b, p in enumerate(proposals)], trees, width

    def _verify(self, proposals: list[Proposal]) -> Verification:
        """One target pass over every row's tree, pruned inside the pass (ProPD) when every group
        prunes with the same top-k and every policy says pruning pays this step; pruning only
        drops candidates, so a pass over a mixed batch may also skip it."""
        heads = self.target.heads
        specs = [g.gen.spec for g in self.groups]
        if (all(s.prune for s in specs) and len({s.prune_topk for s in specs}) == 1
                and all(g.drafter.prune_next for g in self.groups) and heads is not None
                and heads.early is not None and max(len(p.tree) for p in proposals) > 1):
            return Verification(*pruned_pass(self.target.model, heads.early, heads.early_layer, specs[0].prune_topk,
                                             proposals, self.cache))
        return Verification(proposals, *verify_forward(self.target.model, [p.tree for p in proposals], self.cache))

    def _accept(self, proposals: list[Proposal], logits: torch.Tensor, rows: list[Row],
                gen: GenerationConfig) -> list[Verdict]:
        """logits [rows, width, vocab] of these rows' trees -> one verdict per row."""
        if gen.sampling.greedy:
            target_next = greedy(logits).tolist()  # host sync: the loop needs the tokens
            return [accept_greedy(p.tree, nxt) for p, nxt in zip(proposals, target_next)]
        logits = logits.float()
        if gen.spec.acceptor == "typical":
            eps, delta = gen.spec.typical_epsilon, gen.spec.typical_delta
            return [accept_typical(p, logits[b, : len(p.tree)], gen.sampling, eps, delta, row.generator)
                    for b, (p, row) in enumerate(zip(proposals, rows))]
        rule = accept_mss if gen.spec.acceptor == "mss" else accept_naive
        return [rule(p, logits[b, : len(p.tree)], gen.sampling, row.generator)
                for b, (p, row) in enumerate(zip(proposals, rows))]

    def _append(self, row: Row, new: list[int], gen: GenerationConfig) -> list[int]:
        """Add committed tokens to ``row`` and apply EOS, stop strings and the length budget."""
        new = new[: row.budget]
        tokenizer = self.target.tokenizer
        if not gen.ignore_eos:
            for i, tok in enumerate(new):
                if tok in tokenizer.eos_ids:
                    new = new[: i + 1]
                    row.done, row.finish_reason = True, "eos"
                    break
        row.tokens.extend(new)
        row.budget -= len(new)
        row.stats.new_tokens += len(new)
        if gen.stop and not row.done:
            text = tokenizer.decode(row.new_ids)
            if any(s in text for s in gen.stop):
                row.done, row.finish_reason = True, "stop"
        if row.budget <= 0:
            row.done = True
        return new


def prefill(model, rows: list[Row], cache) -> torch.Tensor | None:
    """Put every token but the root of each row into ``cache`` (right-padded batch). Returns
    their hidden states [rows, width, hidden] (not normed), None when there are none."""
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


def verify_forward(model, trees: list, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """One target pass over one tree per cache row: logits [batch, width, vocab], final-normed
    hidden [batch, width, hidden]."""
    width = max(len(t) for t in trees)
    rows = [ScratchTree.from_tree(t, width) for t in trees]
    tokens, pos, mask = pass_tensors(rows, 0, width, cache.lengths)
    dev = model.embed.weight.device
    h = model.hidden(tokens.to(dev), pos.to(dev), None if mask is None else mask.to(dev), cache)
    return model.normed_logits(h)

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
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from paradec.config import GenerationConfig
from paradec.draft import Drafter, Proposal
from paradec.methods import Target
from paradec.passes import prefill, prefill_span, verify_forward
from paradec.policy.budget import BatchBudget, cut_batch
from paradec.sampling import greedy
from paradec.state import Row, StepEvent, StepReport, Verification
from paradec.tree.shadow import Shadow
from paradec.verify import Verdict, accept_greedy, accept_mss, accept_naive
from paradec.verify.prune import pruned_pass
from paradec.verify.typical import accept_typical

# prompt tokens per prefill pass of a long prompt: a prompt is cut into the same chunks whoever
# runs it (so its K/V, and its text, do not depend on what else the server is doing); a server
# prefills one chunk per step, so a long prompt delays the others' steps by one chunk's pass at most
PREFILL_CHUNK = 256


@dataclass(eq=False)
class Group:
    """Rows submitted together: one drafter, one generation config, consecutive cache rows."""

    rows: list[Row]
    gen: GenerationConfig
    drafter: Drafter
    first: int = 0  # its first cache row
    start: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # its owner is gone (a client disconnected): it leaves at the next step
    error: str | None = None  # what failed in this group alone (its sampling, its drafter): it has left
    ready: bool = False  # prefilled: it decodes at every step
    filled: list[int] = field(default_factory=list)  # per row: prompt tokens in the cache so far
    parts: list[list[torch.Tensor]] = field(default_factory=list)  # per row: normed hidden of those, by chunk
    # per row: draft trees the budget cut, scored against the tokens the row commits next (``tree.shadow``)
    shadows: list[list[Shadow]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.cancelled or all(row.done for row in self.rows)


class Scheduler:
    """Groups of rows decoding together on one KV cache of ``capacity`` rows x ``max_len`` slots.

    ``target``: the engine (its model and heads); ``eos_ids``: the tokens that end a row (unless
    its request ignores EOS). It deals in tokens only: its consumer turns a row's committed
    tokens into text (``paradec.text.TextStream``) and ends the row at a stop string
    (``Row.finish``). Not thread-safe: one thread steps it."""

    def __init__(
        self,
        target: Target,
        capacity: int,
        max_len: int,
        eos_ids: frozenset[int] = frozenset(),
        budget: BatchBudget | None = None,
        interleave_prefill: bool = False,
    ) -> None:
        self.target = target
        self.eos_ids = eos_ids
        self.cache = target.model.new_cache(capacity, max_len, live=0)
        self.groups: list[Group] = []  # in cache-row order
        self.budget = budget  # cuts greedy trees to the width that pays (``policy.budget``)
        # a server: a long prompt is prefilled one chunk per step, between the decode steps of the
        # others, instead of stopping them for its whole prefill
        self.interleave_prefill = interleave_prefill
        self.drafting = 0.0  # seconds the last step's groups spent proposing

    @property
    def free_rows(self) -> int:
        return self.cache.capacity - self.cache.batch

    def fits(self, rows: list[Row], drafter: Drafter) -> bool:
        """Whether these rows' prompts, budgets and trees fit a cache row."""
        need = max(len(r.tokens) + r.budget for r in rows) + 1 + drafter.max_nodes
        return need <= self.cache.max_len

    def admit(self, rows: list[Row], gen: GenerationConfig, drafter: Drafter) -> Group:
        """Take ``rows`` into free cache rows, prefill them (alone) and start their drafter; they
        join the next step. With ``interleave_prefill``, a prompt longer than one chunk is
        prefilled by the coming steps instead, one chunk each."""
        if len(rows) > self.free_rows or not self.fits(rows, drafter):
            raise RuntimeError("the rows do not fit the cache (check free_rows and fits first)")
        group = Group(
            rows,
            gen,
            drafter,
            self.cache.add_rows(len(rows)),
            filled=[0] * len(rows),
            parts=[[] for _ in rows],
            shadows=[[] for _ in rows],
        )
        later = self.interleave_prefill and max(len(r.tokens) for r in rows) - 1 > PREFILL_CHUNK
        self.groups.append(group)
        if not later:
            self._prefill(group, whole=True)
        return group

    def _prefill(self, group: Group, whole: bool) -> None:
        """Prefill ``group``: every row in one pass when each prompt fits one chunk, else row by row
        in chunks of PREFILL_CHUNK tokens (the same chunks whoever asks, so a prompt's K/V do not
        depend on the load), all of them (``whole``) or the next one. Ready: its drafter begins."""
        model, rows = self.target.model, group.rows
        # prompt passes through dense weights (``cpu.prefill``) give a row bits that depend on how
        # many rows the pass has: each row then takes passes of its own, as it would alone
        together = len(rows) == 1 or getattr(model, "prefill_path", None) is None
        with torch.inference_mode():
            if max(len(r.tokens) for r in rows) - 1 <= PREFILL_CHUNK and together:
                with self.cache.rows(group.first, len(rows)) as cache:
                    h = prefill(model, rows, cache)
                features = None if h is None else model.norm(h)
            else:
                for i, row in enumerate(rows):
                    while group.filled[i] < len(row.tokens) - 1:
                        start = group.filled[i]
                        end = min(start + PREFILL_CHUNK, len(row.tokens) - 1)
                        with self.cache.rows(group.first + i, 1) as cache:
                            h = prefill_span(model, row.tokens[start:end], cache)
                        if h is not None:
                            group.parts[i].append(model.norm(h)[0])
                        group.filled[i] = end
                        if not whole and any(f < len(r.tokens) - 1 for f, r in zip(group.filled, rows)):
                            return  # more chunks at the next steps; the last one's step makes it ready
                features = None
                if any(group.parts):  # right-padded [rows, longest prompt - 1, hidden], as one pass gives it
                    ref = next(p[0] for p in group.parts if p)
                    feats = [torch.cat(p) if p else ref.new_zeros(0, ref.shape[-1]) for p in group.parts]
                    features = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
                group.parts = []
        max_len = max(len(r.tokens) + r.budget for r in rows) + 1
        group.drafter.begin([r.tokens for r in rows], max_len, features)
        if self.budget is not None and group.gen.sampling.greedy and not group.drafter.sizes_own_trees:
            group.drafter.set_width(self.budget.standing(group.gen.method))  # skipped where the engine skips it
        prefill_s = time.perf_counter() - group.start
        for row in rows:
            row.stats.prefill_s = prefill_s
        group.ready = True

    def step(self) -> Iterator[tuple[Group, StepEvent]]:
        """One decode step of every ready group: propose -> verify (one target pass) -> accept ->
        commit -> observe. Yields (group, event) per row that committed tokens; then groups that
        are done leave (their cache rows are freed). The oldest group still being prefilled gets
        its next chunk first; until it is ready its rows ride along in the pass as a root whose K/V
        is dropped. What fails in one group alone (its sampling, its drafter) ends that group with
        ``error`` set; the others go on."""
        self._leave()
        pending = next((g for g in self.groups if not g.ready), None)
        if pending is not None:
            self._prefill(pending, whole=False)
        ready = [g for g in self.groups if g.ready]
        if not ready:
            return
        batch = self.cache.batch
        for g in ready:
            g.drafter.joins(batch)
        t_step = time.perf_counter()
        with torch.inference_mode():
            proposals = self._propose()
            drafted = list(proposals)  # as proposed, before the budget cut them
            proposals, trees, cut = self._cut(proposals, self.groups)
            width = cut  # the next proposals need reach no further than this width (+1), or nowhere
            if trees is not None:
                width = self.budget.next_width(trees, cut)
            for g in ready:
                own = g.drafter.sizes_own_trees
                if trees is None or (own and proposals[g.first].gains is None):
                    g.drafter.set_width(None)  # trees verified in full, or sized by their drafter
                else:  # a priced tree (auto) learns how much of it was verified; a fixed one, how far to draft
                    g.drafter.set_width(cut if own else width)
            t_fwd = time.perf_counter()
            ver = self._verify(proposals, ready)
            if ver.logits.device.type == "cuda":
                torch.cuda.synchronize()  # host sync: only to time the pass; acceptance syncs anyway
            t_fwd = time.perf_counter() - t_fwd
            pass_width = max(len(p.tree) for p in ver.proposals)
            if trees is not None:
                self.budget.observe_pass(len(proposals) * pass_width, t_fwd)
            reports, committed = [], 0
            for g in self.groups:
                if not g.ready:
                    for i in range(len(g.rows)):
                        self.cache.drop_scratch(g.first + i)
                elif g.error is None:
                    recall: list[bool] = []
                    for event in self._accept_group(g, ver, drafted, trees is not None, t_fwd, recall):
                        committed += len(event[1].token_ids)
                        yield event
                    if g.error is None:  # else its sampling failed: it has left
                        reports.append((g, recall))
            seconds, pruned = time.perf_counter() - t_step, ver.early_top is not None
            whole = dict(width=pass_width, drafting=self.drafting, committed=committed, pass_s=t_fwd)  # every group's
            for g, recall in reports:  # after every commit
                span = slice(g.first, g.first + len(g.rows))
                verified = max(len(p.tree) for p in ver.proposals[span])
                report = StepReport(
                    batch, max(len(p.tree) for p in drafted[span]), verified, seconds, pruned, tuple(recall), **whole
                )
                g.drafter.observe(report)
        self._leave()

    def _propose(self) -> list[Proposal]:
        """Every group's trees, a root alone for a row still being prefilled or whose drafter failed."""
        proposals: list[Proposal] = []
        t_all = time.perf_counter()
        for g in self.groups:
            if not g.ready:  # a placeholder row: its logits are not read, its K/V not kept
                proposals += [Proposal.root_only(r.tokens[-1]) for r in g.rows]
                continue
            t_draft = time.perf_counter()
            try:
                proposals += g.drafter.propose([r.tokens for r in g.rows], [r.generator for r in g.rows])
            except Exception as exc:  # noqa: BLE001 (the group ends with the error; the pass goes on)
                self._fail(g, exc)
                proposals += [Proposal.root_only(r.tokens[-1]) for r in g.rows]
            if self.budget is not None and max(len(p.tree) for p in proposals[g.first :]) > 1:
                self.budget.observe_draft(g.gen.method, time.perf_counter() - t_draft)
        self.drafting = time.perf_counter() - t_all
        return proposals

    def _accept_group(
        self,
        g: Group,
        ver: Verification,
        drafted: list[Proposal],
        budgeted: bool,
        t_fwd: float,
        recall: list[bool],
    ) -> Iterator[tuple[Group, StepEvent]]:
        """Accept ``g``'s rows with its own settings, commit, and yield each row's committed tokens;
        a split pass's early-head recall goes to ``recall``. ``drafted``: every row's tree as
        proposed, before the budget cut it (``budgeted``: it did)."""
        span = slice(g.first, g.first + len(g.rows))
        try:
            verdicts = self._accept(ver.proposals[span], ver.logits[span], g.rows, g.gen)
        except Exception as exc:  # noqa: BLE001 (its own sampling settings failed: it alone ends)
            self._fail(g, exc)
            return
        for i, (row, verdict) in enumerate(zip(g.rows, verdicts)):
            if row.done:
                continue
            committed = self._commit(g, i, ver, verdict, recall)
            b = g.first + i
            tree, verified, method = drafted[b].tree, len(ver.proposals[b].tree), g.gen.method
            if budgeted and not g.drafter.sizes_own_trees:  # the nodes the budget cut too (``tree.shadow``)
                g.shadows[i] = self.budget.score(method, tree, verified, verdict.nodes[1:], committed, g.shadows[i])
            row.stats.steps += 1
            row.stats.target_s += t_fwd
            row.stats.nodes += len(tree)
            row.stats.verified += verified
            source = ver.proposals[b].source
            if source:
                row.stats.drafters[source] = row.stats.drafters.get(source, 0) + 1
            accepted = min(len(verdict.nodes) - 1, len(committed))
            depth = max(ver.proposals[b].tree.depths)
            yield g, StepEvent(i, committed, accepted, len(tree) - 1, depth, source or method, row.stats.steps)
            if row.done:  # by EOS or its budget, or by its consumer (a stop string)
                row.stats.wall_s = time.perf_counter() - g.start

    @staticmethod
    def _fail(g: Group, exc: Exception) -> None:
        g.error, g.cancelled = f"{type(exc).__name__}: {exc}", True

    def _commit(self, g: Group, i: int, ver: Verification, verdict: Verdict, recall: list[bool]) -> list[int]:
        b, row = g.first + i, g.rows[i]
        prop = ver.proposals[b]
        accepted = [prop.tree.tokens[n] for n in verdict.nodes[1:]]
        committed = self._append(row, accepted + [verdict.bonus], g.gen)
        nodes = verdict.nodes[: len(committed)]  # EOS / budget may cut the path
        self.cache.commit(b, [ver.slot(b, n) for n in nodes])
        g.drafter.commit(i, accepted, verdict.bonus, None if ver.hidden is None else ver.hidden[b, verdict.nodes])
        if ver.early_top is not None:
            # was the target's next token in the early head's top-k at the last node?
            top = ver.early_top[b].get(ver.slot(b, verdict.nodes[-1]))
            if top is not None:
                recall.append(verdict.bonus in top)
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
    def _cut(self, proposals: list[Proposal], groups: list[Group]) -> tuple[list[Proposal], list | None, int]:
        """With a budget and every group greedy: the rows' trees cut to the width the budget picks
        for the pass (``policy.budget.cut_batch``). -> (proposals, the rows' (method, proposed
        nodes) but the priced ones, or None when nothing was decided; the width)."""
        if self.budget is None or not all(g.gen.sampling.greedy for g in groups):
            return proposals, None, max(len(p.tree) for p in proposals)
        methods = [g.gen.method for g in groups for _ in g.rows]
        own = {b for g in groups if g.drafter.sizes_own_trees for b in range(g.first, g.first + len(g.rows))}
        return cut_batch(self.budget, proposals, methods, own)

    def _verify(self, proposals: list[Proposal], groups: list[Group]) -> Verification:
        """One target pass over every row's tree, split at an early layer (ProPD's pruning) when
        every group's drafter asks for the same split this step; pruning only drops candidates,
        so a pass over a mixed batch may also skip it."""
        splits = {g.drafter.split() for g in groups}
        split = splits.pop() if len(splits) == 1 else None
        if split is not None and max(len(p.tree) for p in proposals) > 1:
            return Verification(
                *pruned_pass(self.target.model, split.early, split.layer, split.topk, proposals, self.cache)
            )
        return Verification(proposals, *verify_forward(self.target.model, [p.tree for p in proposals], self.cache))

    def _accept(
        self, proposals: list[Proposal], logits: torch.Tensor, rows: list[Row], gen: GenerationConfig
    ) -> list[Verdict]:
        """logits [rows, width, vocab] of these rows' trees -> one verdict per row."""
        if gen.sampling.greedy:
            target_next = greedy(logits).tolist()  # host sync: the loop needs the tokens
            return [accept_greedy(p.tree, nxt) for p, nxt in zip(proposals, target_next)]
        logits = logits.float()
        if gen.accept.acceptor == "typical":
            eps, delta = gen.accept.typical_epsilon, gen.accept.typical_delta
            return [
                accept_typical(p, logits[b, : len(p.tree)], gen.sampling, eps, delta, row.generator)
                for b, (p, row) in enumerate(zip(proposals, rows))
            ]
        rule = accept_mss if gen.accept.acceptor == "mss" else accept_naive
        return [
            rule(p, logits[b, : len(p.tree)], gen.sampling, row.generator)
            for b, (p, row) in enumerate(zip(proposals, rows))
        ]

    def _append(self, row: Row, new: list[int], gen: GenerationConfig) -> list[int]:
        """Add committed tokens to ``row`` and apply EOS and the length budget."""
        new = new[: row.budget]
        if not gen.ignore_eos:
            for i, tok in enumerate(new):
                if tok in self.eos_ids:
                    new = new[: i + 1]
                    row.finish("eos")
                    break
        row.tokens.extend(new)
        row.budget -= len(new)
        row.stats.new_tokens += len(new)
        if row.budget <= 0:
            row.done = True
        return new

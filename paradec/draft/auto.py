"""``auto``: every step, every row drafts with whichever loaded drafter ``policy.auto`` expects to
commit the most tokens per second, or not at all (`ar`).

Prompt lookup costs nothing to ask, so it runs first for every row and its chain (whose size
says how long a suffix matched) is one option; so is retrieval from a datastore where one is
loaded (``rest``: its statistics kept by ``datastore.confidence``); the model drafters (EAGLE's
head, Medusa heads, SSMs) are options at the size they proposed last. The drafters no row chose
are told to skip this step (``set_width(0)``: no head or SSM passes) but still see every commit,
so their state stays in step with the text and they can be chosen at the next step. Each
proposal carries the name of the drafter that made it (``Proposal.source``), which the
scheduler counts per row: the answer says which drafters ran and how often. A drafter the
engine retires (``policy.auto``: it keeps not being chosen) is dropped at once: no more passes,
lookups, commits or offers in this request.

A lookup chain (prompt or datastore) a row did not verify is still scored: the tokens the row
commits next say how much of it would have been accepted (``tree.shadow``), and that counts as an
observation of its context. The chain is a point mass, so "the committed token is the drafted
one" happens with exactly the chance that verification would accept it, when sampling as in
greedy mode; and it is read after the draws it scores, for later steps' choices only. Without
it, a row that chose `ar` for a context never learned that on its text that context's chains
are accepted. The tree a row chose is scored the same way, whole, where greedy decoding or a
lookup's point mass makes that exact: the part that its width or the batch's cut left out counts
too (a chain the batch cut to the root at every step had left the row's statistics, and so its
choice, as they were).
"""

from __future__ import annotations

import time
from itertools import accumulate

import torch

from paradec.config import SamplingConfig
from paradec.draft import Drafter
from paradec.draft.base import DrafterHooks
from paradec.draft.datastore import DatastoreLookup
from paradec.draft.ngram import NgramDrafter
from paradec.policy.auto import AutoStats, Choice, Option, RowStats, choose_group
from paradec.state import StepReport
from paradec.tree.proposal import Proposal
from paradec.tree.shadow import Shadow, settle, walk
from paradec.tree.tree import TokenTree


class AutoDrafter(DrafterHooks):
    """``arms``: name -> a drafter of the shared loop, whose trees have up to ``sizes[name]`` nodes
    past the root (it drafts less when told a smaller width); ``lookup``: prompt lookup (None:
    not offered, as on llama.cpp's runtime, which verifies no trees); ``retrieval``: a datastore's
    chains (None: none loaded)."""

    sizes_own_trees = True  # it prices its rows' trees (``Proposal.gains``); the batch cuts them jointly

    def __init__(
        self,
        arms: dict[str, Drafter],
        sizes: dict[str, int],
        lookup: NgramDrafter | None,
        stats: AutoStats,
        sampling: SamplingConfig,
        lazy: frozenset[str] = frozenset(),
        featured: frozenset[str] = frozenset(),
        retrieval: DatastoreLookup | None = None,
    ) -> None:
        self.arms, self.sizes, self.stats = arms, sizes, stats
        # the lookups each row asks every step, by their name in the statistics (no passes of their own)
        self.lookups: dict[str, NgramDrafter | DatastoreLookup] = {
            name: c for name, c in (("pld", lookup), ("rest", retrieval)) if c is not None
        }
        # arms started only when a row first chooses them (an SSM's set-up runs its LM head over
        # the whole context, EAGLE's its head: a cost every request paid at admission, chosen or
        # not; 7.5 ms a request for EAGLE in bf16, 16 of them at once at a server's 16 clients)
        self.lazy, self.started, self.max_len = lazy, set(), 0
        # lazy arms that start from the target's features of the context so far (EAGLE): the
        # prompt's from the prefill, then each commit's, kept per row until they have started
        self.featured = featured
        self.feats: list[list[torch.Tensor]] | None = None
        self.greedy = sampling.greedy
        self.rows: list[RowStats] = []
        self.shadows: list[list[Shadow]] = []  # per row: trees (declined or cut) not yet scored
        self.choices: list[Choice] = []  # per row: this step's choice
        self.trees: list[Proposal] = []  # per row: what it verified
        self.whole: list[TokenTree] = []  # per row: the chosen drafter's tree before any cut
        self.batch = 1  # rows in the pass it proposes for (the scheduler's, not only this group's: ``joins``)

    @property
    def max_nodes(self) -> int:
        chains = [c.max_nodes + 1 for c in self.lookups.values()]
        return max([0, *chains, *(arm.max_nodes for arm in self.arms.values())])

    def begin(self, prompts: list[list[int]], max_len: int, features: torch.Tensor | None = None) -> None:
        # features [rows, longest prompt - 1, hidden]: the target's, before each prompt token but the first
        lazy = self.lazy if features is not None else self.lazy - self.featured  # none to start them from
        self.max_len, self.started = max_len, {name for name in self.arms if name not in lazy}
        self.feats = None if features is None else [[features[b, : len(p) - 1]] for b, p in enumerate(prompts)]
        for name in self.started:
            self.arms[name].begin(prompts, max_len, features)
        self.rows = [RowStats(self.stats.accept) for _ in prompts]
        self.shadows = [[] for _ in prompts]

    def joins(self, batch: int) -> None:
        # a request joining a server's running batch shares its first pass with the others too:
        # priced as a pass of its own rows alone (what it knew before its first ``observe``), a new
        # request's first step chose EAGLE, and started its head over the whole prompt, where the
        # rows beside it made drafting not pay
        self.batch = batch

    def propose(self, sequences: list[list[int]], generators: list[torch.Generator | None]) -> list[Proposal]:
        for name in [name for name in self.lookups if not self.stats.offers(name)]:
            del self.lookups[name]  # retired for the engine (``policy.auto``): no more lookups
        found: dict[str, list[tuple[list[int], int]]] = {}  # lookup -> per row: (its chain past the root, its context)
        for name, lookup in self.lookups.items():
            t0 = time.perf_counter()
            # the context of its statistics: how long a suffix matched (a datastore's: and how many agreed)
            found[name] = [(_first(lookup.continuations(seq)), lookup.matched) for seq in sequences]
            self.stats.observe_draft(name, (time.perf_counter() - t0) / len(sequences), len(sequences))
        for name in [name for name in self.arms if not self.stats.offers(name)]:
            del self.arms[name]
            self.started.discard(name)
        options = []
        for b in range(len(sequences)):
            options.append([Option(name, self.sizes[name]) for name in self.arms])
            for name, rows in found.items():
                chain, context = rows[b]
                if chain:
                    options[b].append(Option(name, len(chain), context))
        self.choices = choose_group(self.stats, self.rows, options, self.batch)
        for c in self.choices:
            self.stats.tally([*self.arms, *self.lookups], c)
        drafted = {}
        for name, arm in self.arms.items():
            widths = [c.width for c in self.choices if c.drafter == name]
            if name not in self.started:
                if not widths:
                    continue
                # the context so far, as if it were the prompt (with its features, for EAGLE)
                arm.begin(sequences, self.max_len, self._features(sequences) if name in self.featured else None)
                self.started.add(name)
                if self.featured <= self.started:
                    self.feats = None
            arm.set_width(max(widths) if widths else 0)  # 0: no passes of its own this step
            t_arm = time.perf_counter()
            drafted[name] = arm.propose(sequences, generators)
            if widths:  # a row's share: the arm's passes serve every row of the group at once
                self.stats.observe_draft(name, (time.perf_counter() - t_arm) / len(sequences), len(sequences))
        self.trees, self.whole = [], []
        for b, (seq, c) in enumerate(zip(sequences, self.choices)):
            if c.drafter == "ar":
                prop = Proposal.root_only(seq[-1])
                self.whole.append(prop.tree)
            elif c.drafter in found:  # a chain: verified as far as it pays
                chain = found[c.drafter][b][0]
                self.whole.append(TokenTree.chain(seq[-1], chain))
                prop = Proposal.chain(seq[-1], chain[: c.width - 1])
            else:  # a drawn tree is verified whole: which draws are kept must not depend on their values
                prop = drafted[c.drafter][b]
                self.whole.append(prop.tree)
                if self.greedy:
                    prop = prop.cut(c.width)
            prop.source = c.drafter
            for name, rows in found.items():
                chain, context = rows[b]
                if c.drafter != name and chain:
                    self.shadows[b].append(Shadow((name, context), TokenTree.chain(seq[-1], chain)))
            if self.greedy:  # the batch budget may cut it further: what each width is expected to commit
                # as ``choose`` priced them (none for `ar`; a tree here is cut to its chosen width)
                prop.gains = list(accumulate(c.rates[: len(prop.tree) - 1], initial=1.0))
            self.trees.append(prop)
        return self.trees

    def commit(self, row: int, accepted: list[int], bonus: int, hidden: torch.Tensor | None = None) -> None:
        for name in self.started:
            self.arms[name].commit(row, accepted, bonus, hidden)
        if self.feats is not None and any(name in self.arms for name in self.featured - self.started):
            if hidden is None:  # a runtime without features: a lazy EAGLE would start blind
                self.feats = None
            else:  # hidden [len(accepted) + 1, hidden]: the features before the accepted tokens and the bonus
                self.feats[row].append(hidden[: len(accepted) + 1])
        c, tree = self.choices[row], self.trees[row].tree
        self.rows[row].tick()
        if c.drafter != "ar" and (self.greedy or c.drafter in self.lookups):
            # whole, what it and the batch cut off too, by the tokens that follow (greedy, or a
            # lookup's point mass: exactly as verifying it would have): a chain cut to the root
            # every step had kept its statistics, and so its choice, as they were
            self.shadows[row].append(Shadow((c.drafter, c.context), self.whole[row]))
        elif c.drafter != "ar" and len(tree) > 1:  # a drawn tree, verified whole: its verdict
            self.rows[row].observe((c.drafter, c.context), len(tree) - 1, walk(tree, accepted))
        self.shadows[row] = settle(self.shadows[row], [*accepted, bonus], self.rows[row].observe)

    def observe(self, step: StepReport) -> None:
        # the pass as it was (every row padded to its widest tree); accepting and committing
        # (per row, whatever was drafted) apart, so they do not price one width up
        self.stats.observe_pass(step.batch * step.width, max(step.pass_s, 1e-6))
        self.stats.observe_overhead(max(step.seconds - step.drafting - step.pass_s, 0.0) / step.batch)
        if step.batch > len(self.rows):  # other groups' rows shared the pass: its rate prices drafting
            self.stats.observe_rate(step.committed, step.seconds)

    def _features(self, sequences: list[list[int]]) -> torch.Tensor | None:
        """[rows, longest sequence - 1, hidden]: the target's feature before each token but the
        first of every row's context so far (right-padded), or None where they were not all kept."""
        if self.feats is None:
            return None
        rows = [torch.cat(chunks) for chunks in self.feats]
        if any(len(r) != len(seq) - 1 for r, seq in zip(rows, sequences)):
            return None
        out = rows[0].new_zeros(len(rows), max(len(seq) for seq in sequences) - 1, rows[0].shape[-1])
        for b, r in enumerate(rows):
            out[b, : len(r)] = r
        return out


def _first(chains: list[list[int]]) -> list[int]:
    """A lookup's chain (``continuations``: at most one, as `auto` builds them), or [] for none."""
    return chains[0] if chains else []

"""A small speculative model (SSM) that grows an expansion tree <k1..km> on its own KV cache.

Per step and row, the SSM's scratch holds: the pending chain (tokens the target committed that
the SSM has not cached yet, e.g. accepted leaves, which are never run; its last token is the root), padding up to
the batch's longest
pending chain, then the tree level by level. Level i gives each frontier node k_i children:
its top-k_i tokens when decoding greedily, k_i i.i.d. draws from the warped q when sampling
(what multi-step speculative sampling needs to be exact). One SSM forward per level, none
for the leaves. After verification the SSM commits the pending chain plus the longest
accepted prefix it proposed itself; the rest of the accepted tokens and the bonus become the
next pending chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradec.config import MAX_TREE_NODES, SamplingConfig, expansion_nodes
from paradec.errors import ParadecError
from paradec.kv import KVCache
from paradec.models import Transformer
from paradec.options import option
from paradec.sampling import probs
from paradec.tree import ScratchTree, pass_tensors
from paradec.tree.proposal import DraftTree


@dataclass(frozen=True)
class SsmOptions:
    """A draft model's (SSM's) tree."""

    expansion: tuple[int, ...] = option((1, 1, 3, 1, 1, 1, 1, 1), "SSM children per tree level")

    def __post_init__(self) -> None:
        if not self.expansion or any(k < 1 for k in self.expansion):
            raise ParadecError(f"expansion must be a non-empty list of integers >= 1, got {self.expansion}")
        if expansion_nodes(self.expansion) > MAX_TREE_NODES:
            raise ParadecError(
                f"expansion {','.join(map(str, self.expansion))} makes a tree of "
                f"{expansion_nodes(self.expansion)} nodes per SSM; the limit is {MAX_TREE_NODES}: "
                "use fewer or narrower levels"
            )


class ModelDrafter:
    def __init__(self, model: Transformer, expansion: tuple[int, ...], sampling: SamplingConfig) -> None:
        self.model = model
        self.expansion = expansion
        self.sampling = sampling
        self.device = model.embed.weight.device
        self.cache = None
        self.pending: list[list[int]] = []
        self.trees: list[ScratchTree] = []
        self.roots: list[int] = []  # local index of each row's root
        self.written = 0  # local nodes whose K/V are in the scratch (leaves are never run)
        self.width: int | None = None  # the budget's last verified width (``TreeDrafter.set_width``); 0: skip
        self.skipped = False  # the last propose drafted nothing

    @property
    def max_nodes(self) -> int:
        return expansion_nodes(self.expansion)

    def _levels(self) -> tuple[int, ...]:
        """The expansion's levels that reach ``width`` nodes past the root (one more than the budget
        verified last, so it can widen): an SSM pass per level, none past what can be verified."""
        if self.width is None:
            return self.expansion
        count, size = 0, 1
        for level, k in enumerate(self.expansion):
            size *= k
            count += size
            if count >= self.width:
                return self.expansion[: level + 1]
        return self.expansion

    def begin(self, prompts: list[list[int]], max_len: int) -> None:
        """Prefill every prompt but its last token (the first root), like the target."""
        self.cache = self.model.new_cache(len(prompts), max_len + self.max_nodes + len(self.expansion) + 2)
        self.pending = [[p[-1]] for p in prompts]
        self._run_chains(self.cache, [p[:-1] for p in prompts], prefill=True)

    def _forward(self, rows: list[ScratchTree], start: int, width: int, at: list[int] | None = None) -> torch.Tensor:
        """One SSM pass over nodes [start, start + width) of each row -> logits [batch, width, vocab],
        or with ``at`` (a node per row, counted from ``start``) those nodes' alone: [batch, 1, vocab].
        A step's first pass runs the tokens committed since the last (after skipped steps, dozens)
        and reads the root's logits only: its LM head over every one of them (49k x 192 for the
        zoo's SSMs) had cost a look 4-14 ms on 2 AVX2 cores."""
        tokens, pos, mask = pass_tensors(rows, start, width, self.cache.lengths)
        dev = self.device
        h = self.model.hidden(tokens.to(dev), pos.to(dev), None if mask is None else mask.to(dev), self.cache)
        self.cache.keep_scratch(width)
        if at is not None:
            h = h[torch.arange(len(at), device=dev), torch.tensor(at, device=dev)][:, None]  # [batch, 1, hidden]
        return self.model.logits(h)

    def propose(self, generators: list[torch.Generator | None]) -> list[DraftTree]:
        batch = len(self.pending)
        for b in range(batch):
            self.cache.drop_scratch(b)
        self.skipped = self.width == 0
        if self.skipped:  # drafting does not pay here now (``policy.budget``): the SSM catches up later
            return [DraftTree([chain[-1]], [-1], [None]) for chain in self.pending]
        lengths = [len(p) for p in self.pending]
        if max(lengths) - min(lengths) > len(self.expansion):  # padding past the cache's slack
            self._catch_up()
        width = max(len(p) for p in self.pending)
        self.trees, self.roots = [], []
        for chain in self.pending:
            row = ScratchTree()
            for i, tok in enumerate(chain):
                row.add(tok, i - 1)
            self.roots.append(len(chain) - 1)
            for _ in range(width - len(chain)):
                row.add(chain[-1], -1)  # padding
            self.trees.append(row)
        drafts = [DraftTree([chain[-1]], [-1], [None]) for chain in self.pending]
        local_to_draft = [{root: 0} for root in self.roots]
        frontier = [[root] for root in self.roots]  # local indices, per row
        frontier_logits = self._forward(self.trees, 0, width, at=self.roots)  # [batch, 1, vocab]
        start = width
        expansion = self._levels()
        for level, k in enumerate(expansion):
            children = self._expand(frontier_logits, k, generators)  # per row: [(frontier i, token, q)]
            new_frontier = []
            for b, kids in enumerate(children):
                row, mapping, draft = self.trees[b], local_to_draft[b], drafts[b]
                nodes = []
                for i, tok, q in kids:
                    parent_local = frontier[b][i]
                    local = row.add(tok, parent_local)
                    mapping[local] = len(draft.tokens)
                    draft.tokens.append(tok)
                    draft.parents.append(mapping[parent_local])
                    draft.q.append(q)
                    nodes.append(local)
                new_frontier.append(nodes)
            frontier = new_frontier
            if level + 1 == len(expansion):
                break
            n_new = len(frontier[0])
            frontier_logits = self._forward(self.trees, start, n_new)
            start += n_new
        self.written = start
        return drafts

    def _catch_up(self) -> None:
        """Run each row's pending chain but its last token through the SSM on its own, so the next
        pass is not padded to the longest chain: after skipped steps a chain may be as long as the
        steps skipped, and padding a row with many committed tokens to another row's longer chain
        would overflow its cache, whose slack past the answer is the tree's nodes and
        ``len(expansion) + 2``."""
        for b, chain in enumerate(self.pending):
            if len(chain) > 1:
                with self.cache.rows(b, 1) as sub:
                    self._run_chains(sub, [chain[:-1]])
                self.pending[b] = chain[-1:]

    def _run_chains(self, cache: KVCache, chains: list[list[int]], prefill: bool = False) -> None:
        """Write the K/V of each row's ``chains`` tokens after its committed ones and commit them:
        one SSM pass, rows padded to the longest (no logits are read). ``prefill``: a prompt pass."""
        width = max(len(c) for c in chains)
        if not width:
            return
        rows = []
        for chain in chains:
            row = ScratchTree()
            for i, tok in enumerate(chain):
                row.add(tok, i - 1)
            for _ in range(width - len(chain)):
                row.add(0, -1)  # padding
            rows.append(row)
        tokens, pos, mask = pass_tensors(rows, 0, width, cache.lengths)
        dev = self.device
        self.model.hidden(tokens.to(dev), pos.to(dev), None if mask is None else mask.to(dev), cache, prefill=prefill)
        cache.keep_scratch(width)
        for b, chain in enumerate(chains):
            cache.advance(b, len(chain))

    def _expand(self, logits: torch.Tensor, k: int, generators) -> list[list[tuple[int, int, torch.Tensor | None]]]:
        """logits [batch, frontier, vocab] -> per row, k children per frontier node."""
        if self.sampling.greedy:
            top = logits.topk(k, dim=-1).indices.tolist()  # host sync: the tree is built on the host
            return [[(i, tok, None) for i, toks in enumerate(row) for tok in toks] for row in top]
        q = probs(logits, self.sampling)  # [batch, frontier, vocab]
        out = []
        for b, gen in enumerate(generators):
            draws = torch.multinomial(q[b], k, replacement=True, generator=gen).tolist()  # host sync
            out.append([(i, tok, q[b, i]) for i, toks in enumerate(draws) for tok in toks])
        return out

    def commit(self, row: int, accepted: list[int], bonus: int, hidden=None) -> None:
        """The target kept ``accepted`` (draft tokens after the root) and added ``bonus``."""
        if self.skipped:  # nothing was drafted or cached this step: the chain to run grows
            self.pending[row] = self.pending[row] + accepted + [bonus]
            return
        tree = self.trees[row]
        kids: dict[tuple[int, int], int] = {}
        for i in range(self.roots[row] + 1, self.written):  # only nodes with cached K/V
            kids.setdefault((tree.parents[i], tree.tokens[i]), i)
        path, node = list(range(self.roots[row] + 1)), self.roots[row]
        for n_have, tok in enumerate(accepted):  # noqa: B007 (n_have: where the walk stopped)
            node = kids.get((node, tok), -1)
            if node < 0:
                break
            path.append(node)
        else:
            n_have = len(accepted)
        self.cache.commit(row, path)
        self.pending[row] = accepted[n_have:] + [bonus]

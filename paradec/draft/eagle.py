"""EAGLE-2 drafting: a feature-level draft head grows a context-aware dynamic tree.

The head (``models.eagle``) reads pairs (target feature f_t, token x_{t+1}) and predicts
f_{t+1}; the target's LM head turns that into q(x_{t+2}). Per row and step:

1. the pending pairs run on the head's own KV cache: what the target committed since the last
   step, each with the target's true feature (the accepted tokens, then the root = the bonus,
   paired with the last accepted node's feature). Their K/V stay (they are the head's context);
   the rest of the scratch is dropped at commit;
2. depth 1: the root's predicted feature gives q over its children; the top-``topk`` tokens
   (greedy) or ``topk`` i.i.d. draws from q (sampling) become nodes, scored by the path's draft
   confidence (the product of q along it, as a sum of logs);
3. depth d > 1: the ``topk`` best-scored nodes of the last depth run through the head (their
   parent's predicted feature, their token), and each gets ``topk`` children the same way;
4. greedy: all drafted nodes are reranked by score and the top ``m`` verified (a parent scores
   at least its child and wins ties, so the top m is always a tree). ``m`` is fixed (``eagle``)
   or chosen each step by ``EagleCostModel`` (``eagle+propd``); with m fixed, drafting stops
   at the depth where no deeper node could enter the top m (the same tree, fewer head passes).
   Sampling: every drawn node is verified (dropping drawn children by their values would bias
   multi-step speculative sampling); which nodes grow children may depend on anything known
   before the draw.

``eagle+ngram`` (``lookup``): when prompt lookup finds a suffix match of at least its
``min_ngram`` tokens in every row, its chain is the step's tree and the head does not run (the
committed pairs wait in ``pending`` and run as one chain at the head's next step); otherwise a
row's lookup chain, if any, is merged into its EAGLE tree.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import torch

from paradec.config import SamplingConfig
from paradec.cpu import PassCost
from paradec.draft.base import DrafterHooks
from paradec.draft.ngram import NgramDrafter
from paradec.errors import ParadecError
from paradec.models.eagle import EagleHead
from paradec.options import option
from paradec.policy.dynamic import HURDLE, SIZES, CurveLatency, LatencyModel
from paradec.sampling import probs
from paradec.state import StepReport
from paradec.tree import ScratchTree, pass_tensors
from paradec.tree.proposal import DraftTree, Proposal, merge

IDLE_LOOK_EVERY = 16  # eagle+propd: a cost model that verified nothing drafts again this often


class EagleCostModel:
    """ProPD's online cost model for EAGLE's reranked trees: expected tokens per step = 1 + the
    calibrated acceptance of the top-m nodes' path confidences; step time from a latency model
    of verified tokens (batch x (m + 1)); m = argmax expected tokens / time over ``SIZES``."""

    BINS = (0.01, 0.03, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)  # upper edges of path-confidence bins

    def __init__(self, decay: float = 0.999, prior_weight: float = 2.0, curve: PassCost | None = None) -> None:
        centres = [(hi + lo) / 2 for lo, hi in zip((0.0, *self.BINS[:-1]), self.BINS)]
        self.decay = decay
        self.hits = [c * prior_weight for c in centres]  # the prior: a calibrated draft
        self.trials = [prior_weight] * len(self.BINS)
        # the measured pass-cost curve's shape (``paradec.cpu``), or a line fit on probed sizes
        self.latency = CurveLatency(curve) if curve is not None else LatencyModel()
        self.probe = [] if curve is not None else [1, 8, 32, 4, 16, 2]
        self.hurdle = HURDLE  # how much more per second verified drafts must be expected to commit than none

    def _bin(self, p: float) -> int:
        return min(bisect.bisect_left(self.BINS, p), len(self.BINS) - 1)

    def observe(self, confidence: float, hit: bool) -> None:
        b = self._bin(confidence)
        self.hits = [h * self.decay for h in self.hits]
        self.trials = [t * self.decay for t in self.trials]
        self.hits[b] += hit
        self.trials[b] += 1.0

    def rate(self, confidence: float) -> float:
        b = self._bin(confidence)
        return min(1.0, self.hits[b] / self.trials[b])

    def choose(self, batch: int, scores: list[list[float]]) -> int:
        """scores: per row, its candidates' path confidences, best first -> nodes to verify."""
        if self.probe:
            return self.probe.pop(0)
        rates = [[self.rate(s) for s in row] for row in scores]
        best, best_n, bar = -1.0, 0, 0.0  # bar: what verifying drafted nodes must beat (HURDLE over none)
        for n in SIZES:
            tokens = sum(1.0 + sum(r[:n]) for r in rates)
            value = tokens / self.latency.predict(batch * (n + 1))
            if value > max(best, bar):
                best, best_n = value, n
            if n == 0:
                bar = value * (1 + self.hurdle)
        return best_n


# eagle+ngram: a prompt-lookup match of at least this many suffix tokens replaces the EAGLE tree for
# the step (its chain is free to draft; the head catches up on the committed pairs at its next step)
EAGLE_LOOKUP_MIN_NGRAM = 2


@dataclass(frozen=True)
class EagleOptions:
    """EAGLE-2's drafted tree."""

    eagle_topk: int = option(4, "eagle: children per expanded node, and nodes expanded per depth")
    eagle_depth: int = option(5, "eagle: depth of the drafted tree")

    def __post_init__(self) -> None:
        if not (1 <= self.eagle_topk <= 16 and 1 <= self.eagle_depth <= 16):
            raise ParadecError("eagle_topk and eagle_depth must be in [1, 16]")


class EagleDrafter(DrafterHooks):
    def __init__(
        self,
        head: EagleHead,
        embed: torch.nn.Embedding,
        lm_head: torch.nn.Linear,
        sampling: SamplingConfig,
        topk: int = 4,
        depth: int = 5,
        nodes: int = 16,
        cost: EagleCostModel | None = None,
        lookup: NgramDrafter | None = None,
    ) -> None:
        self.head, self.embed, self.lm_head, self.sampling = head, embed, lm_head, sampling
        self.depth, self.nodes, self.cost, self.lookup = depth, nodes, cost, lookup
        self.sizes_own_trees = cost is not None  # eagle+propd: the cost model sizes the tree
        self.head_ran = True  # whether this step's pending pairs went through the head
        # sampling verifies every drawn node: keep the tree within the verifier's limit
        self.topk = topk if sampling.greedy else min(topk, 2)
        self.device = head.device
        self.logits = head.draft_logits(lm_head)  # predicted features [..., hidden] -> draft logits [..., K]
        self.vocab = None if head.vocab is None else head.vocab.to(self.device)  # [K] draft slot -> token id
        self.vocab_ids = None if head.vocab is None else head.vocab.tolist()
        self.cache = None
        self.pending: list[list[tuple[torch.Tensor, int]]] = []  # per row: (feature f_t [hidden], token x_{t+1})
        self.candidates: list[list[tuple[tuple[int, ...], float]]] = []  # per row: (path tokens, log confidence)
        self._m = nodes  # this step's verified nodes per row (greedy)
        self.idle = 0  # steps in a row skipped because the cost model verified nothing (eagle+propd)

    @property
    def max_nodes(self) -> int:
        drawn = self.topk + (self.depth - 1) * self.topk * self.topk
        chain = self.lookup.max_nodes if self.lookup is not None else 0
        return 1 + chain + (min(drawn, max(SIZES) if self.cost else self.nodes) if self.sampling.greedy else drawn)

    # ---- the head's context ------------------------------------------------------------------
    def begin(self, prompts: list[list[int]], max_len: int, features: torch.Tensor | None = None) -> None:
        """Prefill the head with the prompt's pairs (f_t, x_{t+1}) but the last, which pairs the
        root with the feature before it and runs at the first step (zeros: a 1-token prompt)."""
        hidden = self.head.config.hidden_size
        scratch = 2 * self.depth + 4 + self.depth * self.topk
        self.cache = self.head.new_cache(len(prompts), max_len + scratch)
        dtype = self.head.dtype
        zero = torch.zeros(hidden, dtype=dtype, device=self.device)
        self.pending = [
            [(features[b, len(p) - 2].to(dtype) if features is not None and len(p) > 1 else zero, p[-1])]
            for b, p in enumerate(prompts)
        ]
        # the committed context: pairs (f_i, x_{i+1}) for i < len(p) - 2
        pairs = [
            [(features[b, i], p[i + 1]) for i in range(len(p) - 2)] if features is not None else []
            for b, p in enumerate(prompts)
        ]
        if any(pairs):
            self._chains(pairs)
            for b, chain in enumerate(pairs):
                self.cache.advance(b, len(chain))

    def _chains(self, chains: list[list[tuple[torch.Tensor, int]]]) -> tuple[list[ScratchTree], int, torch.Tensor]:
        """One head pass over each row's chain of pairs (feature [hidden], token), right-padded
        (a padding node sees itself only) -> (scratch rows, width, predicted features
        [batch, width, hidden])."""
        width = max(len(c) for c in chains)
        dtype = self.head.dtype
        rows, feats = [], torch.zeros(len(chains), width, self.head.config.hidden_size, dtype=dtype, device=self.device)
        for b, chain in enumerate(chains):
            row = ScratchTree()
            for i, (f, tok) in enumerate(chain):
                row.add(tok, i - 1)
                feats[b, i] = f.to(dtype)
            for _ in range(width - len(chain)):
                row.add(chain[-1][1] if chain else 0, -1)  # padding
            rows.append(row)
        return rows, width, self._run(rows, 0, width, feats)

    def _run(self, rows: list[ScratchTree], start: int, width: int, feats: torch.Tensor) -> torch.Tensor:
        """feats [batch, width, hidden] -> predicted features [batch, width, hidden]."""
        tokens, pos, mask = pass_tensors(rows, start, width, self.cache.lengths)
        dev = self.device
        out = self.head(
            feats, tokens.to(dev), pos.to(dev), self.embed, None if mask is None else mask.to(dev), self.cache
        )
        self.cache.keep_scratch(width)
        return out

    # ---- one step ------------------------------------------------------------------------------
    def propose(self, sequences: list[list[int]], generators: list[torch.Generator | None]) -> list[Proposal]:
        batch = len(sequences)
        for b in range(batch):
            self.cache.drop_scratch(b)
        chains = [self.lookup.propose(seq) for seq in sequences] if self.lookup is not None else None
        skip = self.width == 0  # the draft budget: drafting does not pay here now
        if self.cost is not None and self.sampling.greedy and self._m == 0:  # nor for the cost model
            self.idle = (self.idle + 1) % IDLE_LOOK_EVERY
            skip = self.idle != 0  # ... but look again now and then
        self.head_ran = not skip and (not chains or not all(len(c.tokens) > 1 for c in chains))
        if not self.head_ran:  # every row has a long lookup match, or drafting does not pay: no head passes
            self.candidates = [[] for _ in sequences]
            if chains is None:
                return [Proposal.root_only(seq[-1]) for seq in sequences]
            return [merge(seq[-1], [c]) for seq, c in zip(sequences, chains)]
        with torch.inference_mode():
            rows, width, out = self._chains(self.pending)
            # per row: nodes (parent node, token, log confidence, q); node 0 = the root
            nodes = [[(-1, seq[-1], 0.0, None)] for seq in sequences]
            local = [{0: len(chain) - 1} for chain in self.pending]  # node -> scratch slot of its pair
            front = [[0] for _ in sequences]  # nodes whose predicted features are in front_feats
            front_feats = torch.stack([out[b, len(chain) - 1] for b, chain in enumerate(self.pending)])[:, None]
            start = width
            for d in range(self.depth):
                logits = self.logits(front_feats)  # [batch, front, K]: q of their children
                new = [[] for _ in sequences]
                for b, row_kids in enumerate(self._children(logits, generators)):
                    for i, tok, logq, q in row_kids:
                        parent = front[b][i]
                        nodes[b].append((parent, tok, nodes[b][parent][2] + logq, q))
                        new[b].append(len(nodes[b]) - 1)
                if d + 1 == self.depth:
                    break
                # the best-scored nodes of this depth grow children next: run their pairs
                # (their parent's predicted feature, their token) through the head
                grow = [sorted(mine, key=lambda n, b=b: -nodes[b][n][2])[: self.topk] for b, mine in enumerate(new)]
                # (the cost model's m is bounded by one more than it chose last step)
                bound = self._nodes() if self.cost is None else (self._m + 1 if not self.cost.probe else 10**9)
                if self.sampling.greedy and all(_settled(nodes[b], grow[b], bound) for b in range(batch)):
                    break  # no deeper node can enter a row's top m: the verified trees are complete
                at = [{n: i for i, n in enumerate(row)} for row in front]  # node -> its index in front_feats
                parent_at = torch.tensor(
                    [[at[b][nodes[b][n][0]] for n in grow[b]] for b in range(batch)], device=self.device
                )  # [batch, grow]
                run_feats = front_feats[
                    torch.arange(batch, device=self.device)[:, None], parent_at
                ]  # [batch, grow, hidden]
                for b in range(batch):
                    for n in grow[b]:
                        local[b][n] = rows[b].add(nodes[b][n][1], local[b][nodes[b][n][0]])
                front_feats = self._run(rows, start, len(grow[0]), run_feats)
                start += len(grow[0])
                front = grow
        self.candidates = [[] for _ in sequences]
        if self.sampling.greedy:
            confidences = [sorted((math.exp(n[2]) for n in row[1:]), reverse=True) for row in nodes]
            self._m = self.cost.choose(batch, confidences) if self.cost is not None else self._nodes()
        return [self._tree(b, seq[-1], nodes[b], chains[b] if chains else None) for b, seq in enumerate(sequences)]

    def _nodes(self) -> int:
        """The top m to verify: ``nodes``, or one more than the draft budget verified last (the
        head then stops drafting as soon as no deeper node can enter it)."""
        return self.nodes if not self.width else min(self.nodes, self.width)

    def _children(self, logits: torch.Tensor, generators) -> list[list[tuple[int, int, float, torch.Tensor | None]]]:
        """logits [batch, frontier, K] (K: the draft vocabulary, or the whole one) -> per row,
        ``topk`` children per frontier node: (frontier index, token, log q, q [vocab] | None)."""
        tok = (lambda k: k) if self.vocab_ids is None else self.vocab_ids.__getitem__
        if self.sampling.greedy:
            logp = logits.log_softmax(-1)
            top = logp.topk(self.topk, dim=-1)
            idx, vals = top.indices.tolist(), top.values.tolist()  # host sync: the tree is built on the host
            return [
                [(i, tok(k), v, None) for i, (ks, vs) in enumerate(zip(row_k, row_v)) for k, v in zip(ks, vs)]
                for row_k, row_v in zip(idx, vals)
            ]
        q = probs(logits, self.sampling)  # [batch, frontier, K]
        if self.vocab is not None:  # q over the whole vocabulary, zero outside the draft's: what MSS needs
            full = q.new_zeros(*q.shape[:-1], self.lm_head.out_features)
            q_full = full.scatter_(-1, self.vocab.expand_as(q), q)
        else:
            q_full = q
        out = []
        for b, gen in enumerate(generators):
            draws = torch.multinomial(q[b], self.topk, replacement=True, generator=gen).tolist()  # host sync
            out.append(
                [
                    (i, tok(k), math.log(max(float(q[b, i, k]), 1e-30)), q_full[b, i])
                    for i, ks in enumerate(draws)
                    for k in ks
                ]
            )
        return out

    def _tree(self, b: int, root: int, nodes: list[tuple], chain: DraftTree | None = None) -> Proposal:
        """Row b's verified tree: greedy, the top-m nodes by confidence; sampling, all of them;
        a prompt-lookup ``chain`` merged in."""
        order = sorted(range(1, len(nodes)), key=lambda n: (-nodes[n][2], _depth(nodes, n), n))
        paths = {}
        for n in range(1, len(nodes)):
            parent, tok = nodes[n][0], nodes[n][1]
            paths[n] = (paths[parent] if parent > 0 else ()) + (tok,)
        self.candidates[b] = [(paths[n], nodes[n][2]) for n in order]
        if self.sampling.greedy:
            keep = sorted(order[: self._m], key=lambda n: (_depth(nodes, n), n))
        else:
            keep = list(range(1, len(nodes)))
        draft = DraftTree([root], [-1], [None])
        where = {0: 0}
        for n in keep:
            parent, tok, _, q = nodes[n]
            draft.tokens.append(tok)
            draft.parents.append(where[parent])
            draft.q.append(q)
            where[n] = len(draft.tokens) - 1
        return merge(root, [draft] if chain is None else [draft, chain])

    # ---- after verification -----------------------------------------------------------------
    def commit(self, row: int, accepted: list[int], bonus: int, hidden: torch.Tensor | None = None) -> None:
        """Keep the pending pairs' K/V (true features); the accepted tokens and the bonus, each
        paired with the target's feature before it (``hidden`` [len(accepted) + 1, hidden]),
        are the next step's pending pairs (after this step's, if the head did not run)."""
        tokens = accepted + [bonus]
        pairs = [(hidden[i].to(self.head.dtype), tok) for i, tok in enumerate(tokens)]
        if not self.head_ran:
            self.pending[row] += pairs
            return
        self.cache.commit(row, list(range(len(self.pending[row]))))
        self.pending[row] = pairs
        if self.cost is not None:  # calibrate path confidence -> acceptance on every known outcome
            for path, logc in self.candidates[row]:
                known = len(path) <= len(tokens) or path[: len(tokens)] != tuple(tokens)
                if known:
                    self.cost.observe(math.exp(logc), path == tuple(tokens[: len(path)]))

    def observe(self, step: StepReport) -> None:
        if self.cost is not None:
            self.cost.latency.observe(step.batch * step.width, step.seconds)  # the pass as wide as it was


def _settled(nodes: list[tuple], grow: list[int], m: int) -> bool:
    """Whether no child of the nodes in ``grow`` can enter the top ``m`` of ``nodes`` (a child
    scores at most its parent, and loses a tie to a shallower node)."""
    scores = sorted((n[2] for n in nodes[1:]), reverse=True)
    return len(scores) >= m and max(nodes[n][2] for n in grow) < scores[m - 1]


def _depth(nodes: list[tuple], n: int) -> int:
    d = 0
    while n > 0:
        n, d = nodes[n][0], d + 1
    return d

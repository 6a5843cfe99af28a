"""ProPD early pruning inside the verification pass.

Layers [0, m) run on the whole tree; an early head on layer m's hidden state gives every node's
top-k next tokens; a node survives iff its token is in its parent's early top-k and its parent
survives (the root always does). Layers [m, L) then run on the survivors only: their hidden
states, positions and mask rows are gathered, and their upper-layer K/V go to the same scratch
slots as their lower-layer K/V, so committing by slot works for every layer. Pruning only
removes candidates, so greedy acceptance stays exact, and so does sampling acceptance with
point-mass (deterministic) candidates.
"""

from __future__ import annotations

import torch

from paradec.models import Transformer
from paradec.models.heads import EarlyHead
from paradec.tree import ScratchTree, TokenTree, pass_tensors
from paradec.tree.proposal import Draw, Proposal


def prune_proposal(proposal: Proposal, keep: list[bool]) -> tuple[Proposal, list[int]]:
    """Survivors of ``keep`` (a dropped node drops its subtree), renumbered; plus each survivor's
    original index. Example: parents [-1, 0, 1, 0], keep [1, 0, 1, 1] -> nodes [0, 3]."""
    parents = proposal.tree.parents
    alive = [True] + [False] * (len(parents) - 1)
    for i in range(1, len(parents)):
        alive[i] = keep[i] and alive[parents[i]]
    survivors = [i for i, a in enumerate(alive) if a]
    new_index = {old: new for new, old in enumerate(survivors)}
    tree = TokenTree(
        tuple(proposal.tree.tokens[i] for i in survivors),
        tuple(-1 if i == 0 else new_index[parents[i]] for i in survivors),
    )
    draws = [[Draw(new_index[d.child], d.q) for d in proposal.draws[i] if alive[d.child]] for i in survivors]
    return Proposal(tree, draws), survivors


def pruned_pass(
    model: Transformer, early: EarlyHead, layer: int, topk: int, proposals: list[Proposal], cache
) -> tuple[list[Proposal], torch.Tensor, torch.Tensor, list[list[int]], list[dict]]:
    """-> pruned proposals, logits [batch, width', vocab], normed hidden [batch, width', hidden],
    per row the scratch slot (original node index) of each survivor, and per row the early
    top-k of every node that had children {original index: token ids} (the policy learns the
    early head's recall from it)."""
    dev = model.embed.weight.device
    width = max(len(p.tree) for p in proposals)
    rows = [ScratchTree.from_tree(p.tree, width) for p in proposals]
    tokens, pos, mask = pass_tensors(rows, 0, width, cache.lengths)
    tokens, pos = tokens.to(dev), pos.to(dev)
    mask = (
        mask.to(dev)
        if mask is not None
        else torch.ones(len(rows), 1, width, max(cache.lengths) + width, dtype=torch.bool, device=dev)
    )
    h = model.hidden(tokens, pos, mask, cache, 0, layer)  # [batch, width, hidden]
    # the early head only where a verdict is needed: on nodes that have children (most are leaves)
    parents = [sorted(set(p.tree.parents[1:])) for p in proposals]
    flat = torch.tensor([b * width + i for b, ps in enumerate(parents) for i in ps], device=dev)
    top = early(h.flatten(0, 1).index_select(0, flat), model.head()).topk(topk, dim=-1).indices.tolist()
    early_top, k = [], 0  # host sync: pruning is host logic
    for ps in parents:
        early_top.append(dict(zip(ps, top[k : k + len(ps)])))
        k += len(ps)
    pruned, slot_maps = [], []
    for b, prop in enumerate(proposals):
        tree = prop.tree
        keep = [True] + [tree.tokens[i] in early_top[b][tree.parents[i]] for i in range(1, len(tree))]
        new_prop, survivors = prune_proposal(prop, keep)
        pruned.append(new_prop)
        slot_maps.append(survivors)
    width2 = max(len(s) for s in slot_maps)
    slots = []
    for survivors in slot_maps:
        spare = [j for j in range(width) if j not in set(survivors)]  # dropped slots hold the padding
        slots.append(survivors + spare[: width2 - len(survivors)])
    idx = torch.tensor(slots, device=dev)  # [batch, width']
    h_sub = h.gather(1, idx[..., None].expand(-1, -1, h.shape[-1]))
    pos_sub = pos.gather(1, idx)
    mask_sub = mask.gather(2, idx[:, None, :, None].expand(-1, 1, -1, mask.shape[-1])).clone()
    for b, survivors in enumerate(slot_maps):
        for i in range(len(survivors), width2):  # padding: the prefix and itself only
            length = cache.lengths[b]
            mask_sub[b, 0, i, length:] = False
            mask_sub[b, 0, i, length + slots[b][i]] = True
    span = max(cache.lengths) + max(max(row) for row in slots) + 1  # what the cache returns for these slots
    h_up = model.hidden(h_sub, pos_sub, mask_sub[..., :span], cache, layer, None, slots=idx)
    logits, hn = model.normed_logits(h_up)
    return pruned, logits, hn, slot_maps, early_top

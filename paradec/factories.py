"""The shipped methods' drafter factories: (the loaded engine, a generation config) -> the
drafter of the shared loop (or, for ASPD, its own decode loop). ``methods`` registers them; a new
method's factory may live here or in its own module.

``Target`` is what a factory may read from the loaded engine.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from paradec.config import (
    DEFAULT_TREE_NODES,
    EAGLE_LOOKUP_MIN_NGRAM,
    EAGLE_TREE_NODES,
    PLD_DRAFT,
    GenerationConfig,
)
from paradec.cpu import PassCost
from paradec.draft import Drafter, HeadDrafter, ModelDrafter, NgramDrafter, RootDrafter, TreeDrafter
from paradec.draft.auto import AutoDrafter
from paradec.draft.eagle import EagleCostModel, EagleDrafter
from paradec.models import Transformer
from paradec.models.eagle import EagleHead
from paradec.models.heads import Heads
from paradec.policy import TreePolicy
from paradec.policy.auto import AutoStats
from paradec.policy.dynamic import EARLY_RECALL_PRIOR, rank_prior
from paradec.state import Split
from paradec.tokenizer import Tokenizer


class Target(Protocol):
    """What a factory may read from the loaded engine."""

    model: Transformer
    tokenizer: Tokenizer
    drafts: list[Transformer]
    heads: Heads | None
    eagle: EagleHead | None
    policies: dict[tuple, TreePolicy]  # ProPD's online statistics, kept across calls
    quant: str  # the target's weight format (models.quant)
    cost: PassCost | None  # what a pass of each width costs on this CPU (paradec.cpu), policies' prior


def root(target: Target, gen: GenerationConfig) -> Drafter:
    return RootDrafter()


def ngram(gen: GenerationConfig, quant: str, min_ngram: int = 1) -> NgramDrafter:
    """Prompt lookup: its chain grows with the matched suffix (PLD_DRAFT), or ``num_draft`` tokens."""
    spec = gen.spec
    max_ngram = max(spec.max_ngram, min_ngram)
    if spec.num_draft is not None:  # a fixed chain length
        return NgramDrafter(max_ngram, spec.num_draft, spec.ngram_branches, min_ngram)
    per_match, most = PLD_DRAFT[quant]
    return NgramDrafter(max_ngram, most, spec.ngram_branches, min_ngram, per_match=per_match)


def pld(target: Target, gen: GenerationConfig) -> Drafter:
    return TreeDrafter([], ngram(gen, target.quant))


def specinfer(target: Target, gen: GenerationConfig) -> Drafter:
    models = [ModelDrafter(m, gen.spec.expansion, gen.sampling) for m in target.drafts]
    return TreeDrafter(models, ngram(gen, target.quant) if gen.spec.with_ngram else None)


def heads(target: Target, gen: GenerationConfig) -> Drafter:
    """Medusa heads propose rank paths; ProPD's policy sizes the tree (static for Medusa)."""
    spec, heads = gen.spec, target.heads
    prior = heads.rank_accuracy or rank_prior(len(heads.medusa.blocks))
    static = (
        None
        if spec.dynamic and not spec.deterministic
        else (spec.tree_nodes if spec.tree_nodes is not None else heads.meta.get("tree_nodes", DEFAULT_TREE_NODES))
    )
    lower = heads.early_layer / target.model.config.num_layers if spec.prune else None
    recalls = heads.meta.get("early_topk_recall") or [EARLY_RECALL_PRIOR]
    recall = recalls[min(spec.prune_topk, len(recalls)) - 1]
    # The policy's statistics (rank acceptance, early-head recall, latency) describe this model
    # on this machine, not one request: they carry over from call to call, so only the first
    # request pays for probing tree sizes.
    step_scores = spec.step_scores and static is None
    if spec.deterministic:  # this call's statistics only: the tree depends on the seed's draws alone
        policy = TreePolicy(prior, static, lower_share=lower, recall=recall, curve=target.cost)
    else:
        key = (id(heads), static, lower, spec.prune_topk, step_scores)
        if key not in target.policies:
            target.policies[key] = TreePolicy(prior, static, lower_share=lower, recall=recall, curve=target.cost)
        policy = target.policies[key]
    split = Split(heads.early, heads.early_layer, spec.prune_topk) if spec.prune else None
    return HeadDrafter(
        heads,
        target.model.lm_head,
        policy,
        max_rank=len(prior[0]),
        step_scores=step_scores,
        split=split,
        sizes_own_trees=static is None,
    )


def eagle(target: Target, gen: GenerationConfig) -> Drafter:
    """EAGLE-2: the draft head's dynamic tree; its size fixed, or ProPD's cost model's (per target,
    like ProPD's policy: it describes this model on this machine)."""
    spec = gen.spec
    cost = None
    if spec.dynamic and not spec.deterministic:  # deterministic: the fixed size, so a seed fixes the text
        key = ("eagle", id(target.eagle))
        cost = target.policies.setdefault(key, EagleCostModel(curve=target.cost))
    nodes = spec.tree_nodes if spec.tree_nodes is not None else EAGLE_TREE_NODES
    lookup = ngram(gen, target.quant, EAGLE_LOOKUP_MIN_NGRAM) if spec.with_ngram else None
    return EagleDrafter(
        target.eagle,
        target.model.embed,
        target.model.lm_head,
        gen.sampling,
        spec.eagle_topk,
        spec.eagle_depth,
        nodes,
        cost,
        lookup,
    )


def auto(target: Target, gen: GenerationConfig) -> Drafter:
    """Every loaded lossless drafter as an option of ``policy.auto``'s choice, each at its fixed
    size (auto cuts it); the statistics describe this model on this machine, so they are kept
    across calls (``deterministic``: this call's alone, and no timings)."""
    if target.model.backend != "torch":  # llama.cpp's runtime verifies no trees: `ar`
        return AutoDrafter({}, {}, None, AutoStats(frozen=True), gen.sampling)
    fixed = replace(gen, spec=replace(gen.spec, dynamic=False, prune=False, with_ngram=False))
    arms: dict[str, Drafter] = {}
    sizes: dict[str, int] = {}
    if target.eagle is not None:
        arms["eagle"], sizes["eagle"] = eagle(target, fixed), gen.spec.tree_nodes or EAGLE_TREE_NODES
    if target.heads is not None:
        arms["medusa"] = heads(target, fixed)
        sizes["medusa"] = gen.spec.tree_nodes or target.heads.meta.get("tree_nodes", DEFAULT_TREE_NODES)
    if target.drafts:
        arms["specinfer"] = specinfer(target, fixed)
        sizes["specinfer"] = arms["specinfer"].max_nodes
    per_match, most = PLD_DRAFT["none"]  # the longest chains: auto verifies what pays of them
    lookup = NgramDrafter(gen.spec.max_ngram, most, 1, per_match=per_match)
    if gen.spec.deterministic:
        stats = AutoStats(target.cost, frozen=True)
    else:
        stats = target.policies.setdefault(("auto",), AutoStats(target.cost))
    return AutoDrafter(arms, sizes, lookup, stats, gen.sampling, lazy=frozenset({"specinfer"}))


def aspd(engine, prompts: list[list[int]], gen: GenerationConfig) -> list:
    from paradec.parallel.generate import generate_aspd

    return generate_aspd(engine, prompts, gen)


def aspd_stream(engine, prompt: list[int], gen: GenerationConfig):
    from paradec.parallel.generate import stream_aspd

    return stream_aspd(engine, prompt, gen)

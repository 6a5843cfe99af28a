"""The shipped methods' drafter factories: (the loaded engine, a generation config) -> the
drafter of the shared loop (or, for ASPD, its own decode loop). ``methods`` registers them; a new
method's factory may live here or in its own module.

``Target`` is what a factory may read from the loaded engine.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from paradec.companions import Companion, register
from paradec.config import GenerationConfig
from paradec.cpu import PassCost
from paradec.draft import Drafter, HeadDrafter, ModelDrafter, NgramDrafter, RootDrafter, TreeDrafter
from paradec.draft.auto import AutoDrafter
from paradec.draft.base import DEFAULT_TREE_NODES, EAGLE_TREE_NODES, TreeOptions
from paradec.draft.datastore import REST_DRAFT, Datastore, DatastoreLookup, DatastoreOptions
from paradec.draft.eagle import EAGLE_LOOKUP_MIN_NGRAM, EagleCostModel, EagleDrafter, EagleOptions
from paradec.draft.heads import PruneOptions
from paradec.draft.model import SsmOptions
from paradec.draft.ngram import PLD_DRAFT, LookupOptions
from paradec.errors import ParadecError
from paradec.models import Transformer, load_model
from paradec.models.eagle import load_eagle
from paradec.models.heads import load_heads
from paradec.models.quant import pack_linears, quantize_linears
from paradec.parallel.grammar import Specials
from paradec.policy import TreePolicy
from paradec.policy.auto import AutoStats
from paradec.policy.dynamic import EARLY_RECALL_PRIOR, rank_prior
from paradec.state import Split
from paradec.tokenizer import Tokenizer, load_tokenizer
from paradec.zoo import zoo_datastore, zoo_drafts, zoo_eagle, zoo_heads


class Target(Protocol):
    """What a factory (and a companion's loader) may read from the loaded engine."""

    model: Transformer
    tokenizer: Tokenizer
    device: torch.device
    companions: dict[str, Any]  # what was loaded beside the target, by companion name (``paradec.companions``)
    policies: dict[tuple, TreePolicy]  # ProPD's online statistics, kept across calls
    quant: str  # the target's weight format (models.quant)
    cost: PassCost | None  # what a pass of each width costs on this CPU (paradec.cpu), policies' prior


def root(target: Target, gen: GenerationConfig) -> Drafter:
    return RootDrafter()


def ngram(gen: GenerationConfig, quant: str, min_ngram: int = 1) -> NgramDrafter:
    """Prompt lookup: its chain grows with the matched suffix (PLD_DRAFT), or ``num_draft`` tokens."""
    opts = gen.option(LookupOptions)
    max_ngram = max(opts.max_ngram, min_ngram)
    if opts.num_draft is not None:  # a fixed chain length
        return NgramDrafter(max_ngram, opts.num_draft, opts.ngram_branches, min_ngram)
    per_match, most = PLD_DRAFT[quant]
    return NgramDrafter(max_ngram, most, opts.ngram_branches, min_ngram, per_match=per_match)


def pld(target: Target, gen: GenerationConfig) -> Drafter:
    return TreeDrafter([], ngram(gen, target.quant))


def rest(target: Target, gen: GenerationConfig) -> Drafter:
    """REST: the datastore's most frequent continuation of the context's suffix, a chain."""
    most = gen.option(DatastoreOptions).rest_draft or REST_DRAFT[target.quant]
    return TreeDrafter([], DatastoreLookup(target.companions["datastore"], most))


def specinfer(target: Target, gen: GenerationConfig) -> Drafter:
    models = [ModelDrafter(m, gen.option(SsmOptions).expansion, gen.sampling) for m in target.companions["drafts"]]
    return TreeDrafter(models, ngram(gen, target.quant) if gen.option(LookupOptions).with_ngram else None)


def heads(target: Target, gen: GenerationConfig) -> Drafter:
    """Medusa heads propose rank paths; ProPD's policy sizes the tree (static for Medusa)."""
    tree, prune, heads = gen.option(TreeOptions), gen.option(PruneOptions), target.companions["heads"]
    prior = heads.rank_accuracy or rank_prior(len(heads.medusa.blocks))
    static = (
        None
        if tree.dynamic and not gen.deterministic
        else (tree.tree_nodes if tree.tree_nodes is not None else heads.meta.get("tree_nodes", DEFAULT_TREE_NODES))
    )
    lower = heads.early_layer / target.model.config.num_layers if prune.prune else None
    recalls = heads.meta.get("early_topk_recall") or [EARLY_RECALL_PRIOR]
    recall = recalls[min(prune.prune_topk, len(recalls)) - 1]
    # The policy's statistics (rank acceptance, early-head recall, latency) describe this model
    # on this machine, not one request: they carry over from call to call, so only the first
    # request pays for probing tree sizes.
    step_scores = prune.step_scores and static is None
    if gen.deterministic:  # this call's statistics only: the tree depends on the seed's draws alone
        policy = TreePolicy(prior, static, lower_share=lower, recall=recall, curve=target.cost)
    else:
        key = (id(heads), static, lower, prune.prune_topk, step_scores)
        if key not in target.policies:
            target.policies[key] = TreePolicy(prior, static, lower_share=lower, recall=recall, curve=target.cost)
        policy = target.policies[key]
    split = Split(heads.early, heads.early_layer, prune.prune_topk) if prune.prune else None
    return HeadDrafter(
        heads,
        target.model.head(),
        policy,
        max_rank=len(prior[0]),
        step_scores=step_scores,
        split=split,
        sizes_own_trees=static is None,
    )


def eagle(target: Target, gen: GenerationConfig) -> Drafter:
    """EAGLE-2: the draft head's dynamic tree; its size fixed, or ProPD's cost model's (per target,
    like ProPD's policy: it describes this model on this machine)."""
    tree, head = gen.option(TreeOptions), target.companions["eagle"]
    cost = None
    if tree.dynamic and not gen.deterministic:  # deterministic: the fixed size, so a seed fixes the text
        cost = target.policies.setdefault(("eagle", id(head)), EagleCostModel(curve=target.cost))
    nodes = tree.tree_nodes if tree.tree_nodes is not None else EAGLE_TREE_NODES
    lookup = ngram(gen, target.quant, EAGLE_LOOKUP_MIN_NGRAM) if gen.option(LookupOptions).with_ngram else None
    opts = gen.option(EagleOptions)
    embed, lm_head = target.model.embed, target.model.lm_head
    return EagleDrafter(head, embed, lm_head, gen.sampling, opts.eagle_topk, opts.eagle_depth, nodes, cost, lookup)


def auto(target: Target, gen: GenerationConfig) -> Drafter:
    """Every loaded lossless drafter as an option of ``policy.auto``'s choice, each at its fixed
    size (auto cuts it); the statistics describe this model on this machine, so they are kept
    across calls (``deterministic``: this call's alone, and no timings)."""
    if target.model.backend != "torch":  # llama.cpp's runtime: chains only, and only where they are exact
        return _auto_lookups(target, gen) if target.model.exact_chains else _root_auto(gen)
    fixed = gen.with_option(TreeOptions, dynamic=False).with_option(PruneOptions, prune=False)
    fixed = fixed.with_option(LookupOptions, with_ngram=False)
    fresh = not gen.deterministic and ("auto",) not in target.policies
    stats = _auto_stats(target, gen)
    arms, sizes = _arms(target, fixed, stats)
    if fresh and target.cost is not None and target.cost.measured:  # what each costs, before any row tries it
        # arms of their own, with their own statistics (deterministic): the made-up context's commits
        # must not teach the engine's (Medusa's rank statistics, shared with the `medusa` method)
        stats.seed_draft_costs(draft_costs(target, _arms(target, replace(fixed, deterministic=True), stats)[0]))
    lookup, retrieval = _lookups(target, gen, stats)
    return AutoDrafter(
        arms,
        sizes,
        lookup,
        stats,
        gen.sampling,
        lazy=frozenset({"specinfer", "eagle"}),
        featured=frozenset({"eagle"}),
        retrieval=retrieval,
    )


def _arms(target: Target, fixed: GenerationConfig, stats: AutoStats) -> tuple[dict[str, Drafter], dict[str, int]]:
    """`auto`'s model drafters (those loaded and not retired), each at its fixed size."""
    arms: dict[str, Drafter] = {}
    sizes: dict[str, int] = {}
    loaded, tree_nodes = target.companions, fixed.option(TreeOptions).tree_nodes
    if loaded.get("eagle") is not None and stats.offers("eagle"):  # a retired drafter is not built
        arms["eagle"], sizes["eagle"] = eagle(target, fixed), tree_nodes or EAGLE_TREE_NODES
    if loaded.get("heads") is not None and stats.offers("medusa"):
        arms["medusa"] = heads(target, fixed)
        sizes["medusa"] = tree_nodes or loaded["heads"].meta.get("tree_nodes", DEFAULT_TREE_NODES)
    if loaded.get("drafts") and stats.offers("specinfer"):
        arms["specinfer"] = specinfer(target, fixed)
        sizes["specinfer"] = arms["specinfer"].max_nodes
    return arms, sizes


def draft_costs(target: Target, arms: dict[str, Drafter], context: int = 48, steps: int = 3) -> dict[str, float]:
    """Seconds each drafter's step takes for one row, measured on a made-up context (random tokens,
    zero features): the fastest of its proposals after the first (which builds what it keeps),
    each after a commit of one token. An engine's `auto` starts from these, not from 0: a drafter
    untried was tried on every fresh engine (a CLI call, the demo), EAGLE's, Medusa's and an SSM's
    first trees ~20 ms each on 2 AVX2 cores, 3 target passes, where none of them could pay."""
    cfg = target.model.config
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (context + steps,), generator=g).tolist()
    zeros = torch.zeros(1, context + steps, cfg.hidden_size, dtype=target.model.embed.weight.dtype)
    out = {}
    with torch.inference_mode():
        for name, arm in arms.items():
            seq, times = tokens[:context], []
            try:
                arm.begin([seq], context + steps + arm.max_nodes + 1, zeros[:, : context - 1])
                for step in range(steps):
                    t = time.perf_counter()
                    arm.propose([seq], [None])
                    times.append(time.perf_counter() - t)
                    arm.commit(0, [], tokens[context + step], zeros[0, :1])
                    seq = seq + [tokens[context + step]]
            except Exception:  # noqa: BLE001 (a measurement never fails a request: left unmeasured, tried in use)
                continue
            out[name] = min(times[1:])
    return out


def _root_auto(gen: GenerationConfig) -> AutoDrafter:
    """`auto` with nothing to offer: `ar`."""
    return AutoDrafter({}, {}, None, AutoStats(frozen=True), gen.sampling)


def _auto_lookups(target: Target, gen: GenerationConfig) -> AutoDrafter:
    """`auto` on a runtime that verifies chains only (llama.cpp's): prompt lookup and the datastore."""
    stats = _auto_stats(target, gen)
    lookup, retrieval = _lookups(target, gen, stats)
    return AutoDrafter({}, {}, lookup, stats, gen.sampling, retrieval=retrieval)


def _auto_stats(target: Target, gen: GenerationConfig) -> AutoStats:
    """What `auto` knows of this model on this machine, kept across calls (``deterministic``: this call's alone)."""
    if gen.deterministic:
        return AutoStats(target.cost, frozen=True)
    return target.policies.setdefault(("auto",), AutoStats(target.cost))


def _lookups(target: Target, gen: GenerationConfig, stats: AutoStats) -> tuple[NgramDrafter, DatastoreLookup | None]:
    """`auto`'s chains: prompt lookup's and the datastore's, their longest (auto verifies what pays of them)."""
    per_match, most = PLD_DRAFT["none"]
    lookup = NgramDrafter(gen.option(LookupOptions).max_ngram, most, 1, per_match=per_match)
    store = target.companions.get("datastore")
    retrieval = DatastoreLookup(store, REST_DRAFT["none"]) if store is not None and stats.offers("rest") else None
    return lookup, retrieval


def aspd(engine, prompts: list[list[int]], gen: GenerationConfig) -> list:
    from paradec.parallel.generate import generate_aspd

    return generate_aspd(engine, prompts, gen)


def aspd_stream(engine, prompt: list[int], gen: GenerationConfig):
    from paradec.parallel.generate import stream_aspd

    return stream_aspd(engine, prompt, gen)


# ---- the shipped companions: what the methods above load beside the target ----------------------
def load_drafts(target: Target, paths: list[str | Path]) -> list[Transformer]:
    """SSMs for ``specinfer``, in the target's weight format; each must share the target's tokenizer."""
    vocab, dtype, out = target.tokenizer.hf.get_vocab(), target.model.embed.weight.dtype, []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:  # one path, not its characters
        if not Path(path).is_dir():
            raise ParadecError(
                f"draft directory {str(path)!r} does not exist; pass drafts=PATH to a "
                "Hugging Face-format draft model that shares the target's tokenizer"
            )
        if not (Path(path) / "config.json").is_file():  # not the target's "pass model=PATH"
            raise ParadecError(
                f"draft directory {str(path)!r} has no config.json; pass drafts=PATH to a "
                "Hugging Face-format draft model directory"
            )
        draft = load_model(path, dtype, target.device)
        quantize_linears(draft, target.quant)
        pack_linears(draft)
        # a draft's rounding never reaches the output: off the C path, torch's plain attention is
        # faster than its exact one; on it, a pass is exact for free (an SSM's look on 2 AVX2 cores:
        # 40 % less time in C than on torch's ops, whose int8 LM head alone took 1.8 ms a pass)
        if not draft.runs_native():
            draft.set_exact(False)
        if draft.config.vocab_size != target.model.config.vocab_size:
            raise ParadecError(
                f"draft {path} has a vocabulary of {draft.config.vocab_size}, the target "
                f"{target.model.config.vocab_size}; a draft must share the target's tokenizer"
            )
        if (Path(path) / "tokenizer.json").is_file() and load_tokenizer(Path(path), ()).hf.get_vocab() != vocab:
            raise ParadecError(
                f"draft {path} has a different tokenizer from the target; a draft must share the target's tokenizer"
            )
        out.append(draft)
    return out


def load_medusa(target: Target, path: str | Path):
    """Medusa heads (+ ProPD's early head) trained for this target (``paradec train heads``)."""
    cfg = target.model.config
    return load_heads(path, cfg.hidden_size, cfg.rms_norm_eps, target.model.embed.weight.dtype, target.device)


def load_eagle_head(target: Target, path: str | Path):
    """An EAGLE draft head trained for this target (``paradec train eagle``)."""
    head = load_eagle(path, target.model.config, target.model.embed.weight.dtype, target.device)
    if target.device.type == "cpu":  # a draft reads 1-4 rows a pass: int8 weights ~1.7x faster there; its
        quantize_linears(head, "int8")  # rounding changes what is proposed, never what is verified
    return head


def _has_early_head(target: Target) -> bool:
    heads = target.companions.get("heads")
    return heads is not None and heads.early is not None


def _writes_aspd_markup(target: Target) -> bool:
    try:
        Specials.from_tokenizer(target.tokenizer.hf)
    except ParadecError:
        return False
    return True


for _c in (
    Companion(
        "drafts",
        "draft models",
        "--draft",
        "draft model (SSM) for specinfer; repeat to merge several",
        load_drafts,
        zoo_drafts,
        many=True,
    ),
    Companion("heads", "Medusa heads", "--heads", "Medusa heads for medusa/propd", load_medusa, zoo_heads),
    Companion(
        "eagle",
        "an EAGLE draft head",
        "--eagle",
        "EAGLE draft head for eagle, eagle+propd, eagle+ngram",
        load_eagle_head,
        zoo_eagle,
    ),
    Companion(
        "datastore",
        "a datastore",
        "--datastore",
        "datastore for rest (and auto): a directory `paradec train datastore` wrote",
        lambda target, path: Datastore.load(path),
        zoo_datastore,
        backends=("torch", "llamacpp"),
    ),
    Companion(
        "early_head",
        "an early head",
        present=_has_early_head,
        fix="these heads have none (load heads trained with one, or set prune=False)",
    ),
    Companion(
        "aspd_model",
        "a model fine-tuned for ASPD",
        present=_writes_aspd_markup,
        fix="pass model=PATH to one (its tokenizer has <|title|> ... <|/branch|>)",
    ),
):
    register(_c)

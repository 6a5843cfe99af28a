"""The method registry: every decoding method is declared once, here or in its own module with
one ``register`` call, and the engine, CLI, bench, demo and server all read it.

A ``Method`` names what it needs loaded (draft models, Medusa heads, an early head), which
sampling acceptors it supports, whether its output is the target's (lossless), the ``SpecConfig``
options it sets, and how it decodes: a ``drafter`` factory for the shared propose -> verify ->
accept -> commit loop, or a whole-``decode`` function for a method with its own loop (ASPD's
hybrid decoder). Variants (``specinfer+ngram``, ProPD's ablations) are methods with options.

    register(Method("mine", "my drafter", drafter=lambda target, gen: MyDrafter(...)))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from paradec.config import (
    ACCEPTORS,
    DEFAULT_TREE_NODES,
    EAGLE_LOOKUP_MIN_NGRAM,
    EAGLE_TREE_NODES,
    PLD_DRAFT,
    GenerationConfig,
    SamplingConfig,
    SpecConfig,
)
from paradec.cpu import PassCost
from paradec.draft import Drafter, HeadDrafter, ModelDrafter, NgramDrafter, RootDrafter, TreeDrafter
from paradec.draft.auto import AutoDrafter
from paradec.draft.eagle import EagleCostModel, EagleDrafter
from paradec.errors import ParadecError
from paradec.models import Transformer
from paradec.models.eagle import EagleHead
from paradec.models.heads import Heads
from paradec.parallel.grammar import Specials
from paradec.policy import TreePolicy
from paradec.policy.auto import AutoStats
from paradec.policy.dynamic import EARLY_RECALL_PRIOR, rank_prior
from paradec.tokenizer import Tokenizer

# what a method may need loaded: draft models, Medusa heads, an early head, a model fine-tuned for it
NEEDS = ("drafts", "heads", "early_head", "aspd_model", "eagle")


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


def _writes_aspd_markup(target: Target) -> bool:
    try:
        Specials.from_tokenizer(target.tokenizer.hf)
    except ParadecError:
        return False
    return True


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line, shown by `paradec generate --help` and the README's table
    drafter: Callable[[Target, GenerationConfig], Drafter] | None = None  # the shared loop's proposer
    decode: Callable | None = None  # (engine, prompt ids, gen) -> [Generation]: a method with its own loop
    stream: Callable | None = None  # (engine, one prompt's ids, gen) -> Iterator[str]: its own loop, streamed
    needs: tuple[str, ...] = ()  # a subset of NEEDS
    uses: tuple[str, ...] = ()  # loaded where the model has them (a subset of NEEDS): what it may choose among
    options: Mapping[str, object] = field(default_factory=dict)  # SpecConfig defaults this method sets
    acceptors: tuple[str, ...] = ACCEPTORS  # sampling acceptors it supports (greedy: always exact match)
    lossless: bool = True  # greedy output == `ar`'s; sampled output distributed as the target's
    # the target runtimes it runs on: llama.cpp's runs `ar` only (models.llamacpp: its batches are not exact)
    backends: tuple[str, ...] = ("torch",)
    same_tokens_as: str | None = None  # lossless against this method of the same model (not `ar`)

    def __post_init__(self) -> None:
        if (self.drafter is None) == (self.decode is None):
            raise ValueError(f"method {self.name}: give exactly one of drafter or decode")
        if set(self.needs) - set(NEEDS) or set(self.uses) - set(NEEDS):
            raise ValueError(f"method {self.name}: needs and uses must be among {NEEDS}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def loads(self) -> set[str]:
        """What to load for it: what it needs, and what it uses where the model has it."""
        return set(self.needs) | set(self.uses)

    def missing(self, target: Target) -> list[str]:
        """What this method needs that ``target`` has not loaded (an ASPD model is recognized by
        its tokenizer's branch tokens)."""
        heads = target.heads
        have = {
            "drafts": bool(target.drafts),
            "heads": heads is not None,
            "early_head": heads is not None and heads.early is not None,
            "eagle": target.eagle is not None,
        }
        return [n for n in self.needs if not (_writes_aspd_markup(target) if n == "aspd_model" else have[n])]

    def available(self, target: Target) -> bool:
        """Whether ``target`` can run this method: its runtime, and everything it needs loaded."""
        return target.model.backend in self.backends and not self.missing(target)

    def check(self, target: Target, gen: GenerationConfig) -> None:
        """Raise a ``ParadecError`` naming what is missing for this call."""
        backend = target.model.backend
        if backend not in self.backends:
            raise ParadecError(
                f"method {self.name} runs on the {' or '.join(self.backends)} backend, not {backend} "
                f"(llama.cpp's batched logits are not its single-token ones, so a draft verified "
                f"there could change the text); load the model with backend=torch (--backend torch)"
            )
        missing = self.missing(target)
        if "drafts" in missing:
            raise ParadecError(f"method {self.name} needs draft models; load them (drafts=PATH)")
        if "heads" in missing:
            raise ParadecError(f"method {self.name} needs Medusa heads; load them (heads=PATH)")
        if "eagle" in missing:
            raise ParadecError(f"method {self.name} needs an EAGLE draft head; load it (eagle=PATH)")
        if gen.spec.prune and (target.heads is None or target.heads.early is None):
            raise ParadecError(
                f"method {self.name} prunes with an early head and these heads have none (set prune=False)"
            )
        self.check_options(gen)

    def check_options(self, gen: GenerationConfig) -> None:
        """What can be checked of ``gen`` with no model loaded."""
        if not gen.sampling.greedy and gen.spec.acceptor not in self.acceptors:
            raise ParadecError(
                f"method {self.name} samples with {' or '.join(self.acceptors) or 'no acceptor'}; "
                f"acceptor {gen.spec.acceptor!r} is not one of them"
                + ("" if self.acceptors else " (it decodes greedily: set temperature=0)")
            )


def generation_config(
    method: str = "ar",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | str | None = None,
    ignore_eos: bool = False,
    **spec,
) -> GenerationConfig:
    """The frozen ``GenerationConfig`` of these options, validated as far as no model is needed
    (the CLI calls it before loading one, so a bad flag fails in a second, not after the load)."""
    if isinstance(stop, str):  # one stop string, not its characters
        stop = [stop]
    registered = get(method)
    spec = {**registered.options, **spec}
    if "expansion" in spec:
        spec["expansion"] = tuple(int(k) for k in spec["expansion"])
    try:
        spec_cfg = SpecConfig(**spec)
    except TypeError as exc:
        raise TypeError(f"unexpected option: {exc}") from None
    sampling = SamplingConfig(float(temperature), int(top_k), float(top_p), seed)
    gen = GenerationConfig(int(max_new_tokens), sampling, tuple(stop or ()), ignore_eos, method, spec_cfg)
    registered.check_options(gen)
    return gen


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` (a name already taken is an error: unregister it first)."""
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Method:
    if name not in _REGISTRY:
        raise ParadecError(f"unknown method {name!r}; choose one of: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def methods() -> tuple[Method, ...]:
    return tuple(_REGISTRY.values())


# ---- the shipped methods ------------------------------------------------------------------------
def _root(target: Target, gen: GenerationConfig) -> Drafter:
    return RootDrafter()


def _ngram(gen: GenerationConfig, quant: str, min_ngram: int = 1) -> NgramDrafter:
    """Prompt lookup: its chain grows with the matched suffix (PLD_DRAFT), or ``num_draft`` tokens."""
    spec = gen.spec
    max_ngram = max(spec.max_ngram, min_ngram)
    if spec.num_draft is not None:  # a fixed chain length
        return NgramDrafter(max_ngram, spec.num_draft, spec.ngram_branches, min_ngram)
    per_match, most = PLD_DRAFT[quant]
    return NgramDrafter(max_ngram, most, spec.ngram_branches, min_ngram, per_match=per_match)


def _pld(target: Target, gen: GenerationConfig) -> Drafter:
    return TreeDrafter([], _ngram(gen, target.quant))


def _specinfer(target: Target, gen: GenerationConfig) -> Drafter:
    models = [ModelDrafter(m, gen.spec.expansion, gen.sampling) for m in target.drafts]
    return TreeDrafter(models, _ngram(gen, target.quant) if gen.spec.with_ngram else None)


def _heads(target: Target, gen: GenerationConfig) -> Drafter:
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
    return HeadDrafter(heads, target.model.lm_head, policy, max_rank=len(prior[0]), step_scores=step_scores)


def _eagle(target: Target, gen: GenerationConfig) -> Drafter:
    """EAGLE-2: the draft head's dynamic tree; its size fixed, or ProPD's cost model's (per target,
    like ProPD's policy: it describes this model on this machine)."""
    spec = gen.spec
    cost = None
    if spec.dynamic and not spec.deterministic:  # deterministic: the fixed size, so a seed fixes the text
        key = ("eagle", id(target.eagle))
        cost = target.policies.setdefault(key, EagleCostModel(curve=target.cost))
    nodes = spec.tree_nodes if spec.tree_nodes is not None else EAGLE_TREE_NODES
    lookup = _ngram(gen, target.quant, EAGLE_LOOKUP_MIN_NGRAM) if spec.with_ngram else None
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


def _auto(target: Target, gen: GenerationConfig) -> Drafter:
    """Every loaded lossless drafter as an option of ``policy.auto``'s choice, each at its fixed
    size (auto cuts it); the statistics describe this model on this machine, so they are kept
    across calls (``deterministic``: this call's alone, and no timings)."""
    if target.model.backend != "torch":  # llama.cpp's runtime verifies no trees: `ar`
        return AutoDrafter({}, {}, None, AutoStats(frozen=True), gen.sampling)
    fixed = replace(gen, spec=replace(gen.spec, dynamic=False, prune=False, with_ngram=False))
    arms: dict[str, Drafter] = {}
    sizes: dict[str, int] = {}
    if target.eagle is not None:
        arms["eagle"], sizes["eagle"] = _eagle(target, fixed), gen.spec.tree_nodes or EAGLE_TREE_NODES
    if target.heads is not None:
        arms["medusa"] = _heads(target, fixed)
        sizes["medusa"] = gen.spec.tree_nodes or target.heads.meta.get("tree_nodes", DEFAULT_TREE_NODES)
    if target.drafts:
        arms["specinfer"] = _specinfer(target, fixed)
        sizes["specinfer"] = arms["specinfer"].max_nodes
    per_match, most = PLD_DRAFT["none"]  # the longest chains: auto verifies what pays of them
    lookup = NgramDrafter(gen.spec.max_ngram, most, 1, per_match=per_match)
    if gen.spec.deterministic:
        stats = AutoStats(target.cost, frozen=True)
    else:
        stats = target.policies.setdefault(("auto",), AutoStats(target.cost))
    return AutoDrafter(arms, sizes, lookup, stats, gen.sampling)


def _aspd(engine, prompts: list[list[int]], gen: GenerationConfig) -> list:
    from paradec.parallel.generate import generate_aspd

    return generate_aspd(engine, prompts, gen)


def _aspd_stream(engine, prompt: list[int], gen: GenerationConfig):
    from paradec.parallel.generate import stream_aspd

    return stream_aspd(engine, prompt, gen)


PROPD = {"prune": True, "dynamic": True}
BOTH = ("torch", "llamacpp")
for _m in (
    # it drafts nothing: the exact acceptors sample its bonus token from p; typical's lossy rule has nothing to do
    Method(
        "ar",
        "autoregressive: one target pass per token (the reference)",
        drafter=_root,
        backends=BOTH,
        acceptors=("mss", "naive"),
    ),
    Method(
        "auto",
        "each step and row, the loaded drafter (or none) with the most expected tokens per second on this CPU",
        drafter=_auto,
        uses=("drafts", "heads", "eagle"),
        backends=BOTH,
        acceptors=("mss", "naive"),
        options={"dynamic": True},  # it sizes its own trees: the batch budget does not cut them
    ),
    Method(
        "specinfer",
        "SpecInfer: SSM token trees (expansion), merged, verified in one pass",
        drafter=_specinfer,
        needs=("drafts",),
    ),
    Method(
        "specinfer+ngram",
        "SpecInfer with prompt lookup merged into the SSM tree",
        drafter=_specinfer,
        needs=("drafts",),
        options={"with_ngram": True},
    ),
    Method("pld", "prompt lookup: continuations of the longest suffix match in the context", drafter=_pld),
    Method(
        "medusa",
        "Medusa heads, a static rank-path tree of the size the heads were tuned for",
        drafter=_heads,
        needs=("heads",),
    ),
    # Medusa's reference sparse tree size (mc_sim_7b_63: 63 nodes + root), the baseline ProPD reports
    Method(
        "medusa-63", "Medusa heads, a static 63-node tree", drafter=_heads, needs=("heads",), options={"tree_nodes": 63}
    ),
    Method(
        "propd",
        "ProPD: Medusa heads, early pruning in the pass, tree size from the online cost model",
        drafter=_heads,
        needs=("heads", "early_head"),
        options=PROPD,
    ),
    # ablations of ProPD
    Method(
        "medusa+prune",
        "ProPD ablation: static tree + early pruning",
        drafter=_heads,
        needs=("heads", "early_head"),
        options={**PROPD, "dynamic": False},
    ),
    Method(
        "medusa+dynamic",
        "ProPD ablation: dynamic tree size, no pruning",
        drafter=_heads,
        needs=("heads",),
        options={**PROPD, "prune": False},
    ),
    Method(
        "propd+step",
        "ProPD, nodes scored by this step's calibrated head probabilities",
        drafter=_heads,
        needs=("heads", "early_head"),
        options={**PROPD, "step_scores": True},
    ),
    Method(
        "eagle",
        "EAGLE-2: a feature-level draft head grows a dynamic tree; the top-m by draft confidence are verified",
        drafter=_eagle,
        needs=("eagle",),
    ),
    Method(
        "eagle+propd",
        "EAGLE-2's dynamic tree, its size chosen each step by ProPD's online cost model",
        drafter=_eagle,
        needs=("eagle",),
        options={"dynamic": True},
    ),
    Method(
        "eagle+ngram",
        "EAGLE-2, or prompt lookup's chain on a suffix match of 2+ tokens (no head passes)",
        drafter=_eagle,
        needs=("eagle",),
        options={"with_ngram": True},
    ),
    # an ASPD model's own output (fine-tuned with branch tokens), not the base model's: not lossless
    Method(
        "aspd",
        "ASPD: hybrid serial/parallel decoding of an ASPD model's branches",
        decode=_aspd,
        stream=_aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
    ),
    Method(
        "aspd-r0",
        "ASPD, a title that repeats the plan ends it (no retries)",
        decode=_aspd,
        stream=_aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
        options={"title_retries": 0},
    ),
    # lossless with respect to `aspd` of the same model (tested), not to the base model's `ar`
    Method(
        "aspd+spec",
        "ASPD with prompt-lookup drafts inside every branch, all verified in one pass",
        decode=_aspd,
        stream=_aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
        same_tokens_as="aspd",
        options={"aspd_draft": 4},
    ),
):
    register(_m)

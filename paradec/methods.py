"""The method registry: every decoding method is declared once, here or in its own module with
one ``register`` call, and the engine, CLI, bench, demo and server all read it.

A ``Method`` names what it needs loaded (``paradec.companions``: draft models, Medusa heads, an
early head, an EAGLE head, a model fine-tuned for ASPD), the kinds of options it reads
(``paradec.options``: frozen records whose fields become flags, request fields and keywords) and
its values for them (``presets``), which sampling acceptors it supports, whether its output is the
target's (lossless), and how it decodes: a ``drafter`` factory for the shared propose -> verify
-> accept -> commit loop, or a whole-``decode`` function for a method with its own loop (ASPD's
hybrid decoder). Variants (``specinfer+ngram``, ProPD's ablations) are methods with presets.

    register(Method("mine", "my drafter", drafter=lambda target, gen: MyDrafter(...), options=(MyOptions,)))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from paradec import companions, factories
from paradec.config import ACCEPTORS, AcceptConfig, GenerationConfig, SamplingConfig
from paradec.draft import Drafter
from paradec.draft.base import TreeOptions
from paradec.draft.datastore import DatastoreOptions
from paradec.draft.eagle import EagleOptions
from paradec.draft.heads import PruneOptions
from paradec.draft.model import SsmOptions
from paradec.draft.ngram import LookupOptions
from paradec.errors import ParadecError
from paradec.factories import Target
from paradec.models.runtime import EXACT_BUILD
from paradec.options import Option, build, options_of
from paradec.parallel.generate import AspdOptions
from paradec.zoo import bundled_aspd


@dataclass(frozen=True)
class Method:
    name: str
    summary: str  # one line, shown by `paradec generate --help` and the README's table
    drafter: Callable[[Target, GenerationConfig], Drafter] | None = None  # the shared loop's proposer
    decode: Callable | None = None  # (engine, prompt ids, gen) -> [Generation]: a method with its own loop
    stream: Callable | None = None  # (engine, one prompt's ids, gen) -> Iterator[str]: its own loop, streamed
    needs: tuple[str, ...] = ()  # companions it cannot run without (``paradec.companions``)
    uses: tuple[str, ...] = ()  # companions loaded where the model has them: what it may choose among
    options: tuple[type, ...] = ()  # the kinds of options it reads (``paradec.options`` records)
    presets: Mapping[str, object] = field(default_factory=dict)  # its values for some of them
    acceptors: tuple[str, ...] = ACCEPTORS  # sampling acceptors it supports (greedy: always exact match)
    lossless: bool = True  # greedy output == `ar`'s; sampled output distributed as the target's
    # the target runtimes it runs on: llama.cpp's runs `ar`, `auto` (there: `ar` and the lookups) and
    # the chain drafters, these where its build verifies a chain exactly (models.llamacpp)
    backends: tuple[str, ...] = ("torch",)
    exact_chains_only: bool = False  # on llama.cpp, only where its chains are exact (``runtime.batch_exactness``)
    same_tokens_as: str | None = None  # lossless against this method of the same model (not `ar`)
    model: Callable[[], Path] | None = None  # the zoo's model for it where none is given (ASPD's adapter)
    # shown by `paradec demo`, with these options (None: not shown; the demo shows each system once)
    demo: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if (self.drafter is None) == (self.decode is None):
            raise ValueError(f"method {self.name}: give exactly one of drafter or decode")
        known = {c.name for c in companions.companions()}
        if set(self.needs) - known or set(self.uses) - known:
            raise ValueError(f"method {self.name}: needs and uses must be registered companions: {sorted(known)}")
        names = {o.name for kind in self.options for o in options_of(kind)}
        if set(self.presets) - names:
            raise ValueError(f"method {self.name}: presets {sorted(set(self.presets) - names)} are not its options")
        object.__setattr__(self, "presets", MappingProxyType(dict(self.presets)))
        if self.demo is not None:
            object.__setattr__(self, "demo", MappingProxyType(dict(self.demo)))

    @property
    def loads(self) -> set[str]:
        """What to load for it: what it needs, and what it uses where the model has it."""
        return set(self.needs) | set(self.uses)

    def missing(self, target: Target, gen: GenerationConfig | None = None) -> list[str]:
        """What this method (with ``gen``'s options) needs that ``target`` has not loaded."""
        needs = list(self.needs) + [n for o in (gen.options if gen else ()) if hasattr(o, "needs") for n in o.needs()]
        return [n for n in dict.fromkeys(needs) if not companions.get(n).there(target)]

    def runs_on(self, model) -> bool:
        """Whether this method runs on ``model``'s runtime (llama.cpp's: as its build allows)."""
        exact = model.backend == "torch" or model.exact_chains
        return model.backend in self.backends and (exact or not self.exact_chains_only)

    def inexact_error(self) -> ParadecError:
        return ParadecError(
            f"method {self.name} drafts chains that this llama.cpp build does not verify exactly (its "
            f"batched logits are not its single-token ones, so a draft could change the text); "
            f"{EXACT_BUILD}, or load the model with backend=torch (--backend torch)"
        )

    def available(self, target: Target) -> bool:
        """Whether ``target`` can run this method: its runtime, and everything it needs loaded."""
        return self.runs_on(target.model) and not self.missing(target)

    def check(self, target: Target, gen: GenerationConfig) -> None:
        """Raise a ``ParadecError`` naming what is missing for this call."""
        backend = target.model.backend
        if backend not in self.backends:
            raise ParadecError(
                f"method {self.name} runs on the {' or '.join(self.backends)} backend, not {backend} "
                f"(its drafts are trees or need the target's hidden states, which llama.cpp's runtime "
                f"does not give); load the model with backend=torch (--backend torch)"
            )
        if not self.runs_on(target.model):
            raise self.inexact_error()
        missing = self.missing(target, gen)
        if missing:
            raise companions.get(missing[0]).error(self.name)
        self.check_options(gen)

    def check_options(self, gen: GenerationConfig) -> None:
        """What can be checked of ``gen`` with no model loaded."""
        if not gen.sampling.greedy and gen.accept.acceptor not in self.acceptors:
            raise ParadecError(
                f"method {self.name} samples with {' or '.join(self.acceptors) or 'no acceptor'}; "
                f"acceptor {gen.accept.acceptor!r} is not one of them"
                + ("" if self.acceptors else " (it decodes greedily: set temperature=0)")
            )


def only_uses_drafters(used: tuple[str, ...] | None) -> bool:
    """Whether the drafters asked for are ones ``used`` methods only *use* (auto), not need: they do
    not tie the model to torch, since llama.cpp's `ar` may beat them all (then they are not loaded)."""
    return bool(used) and all(not get(m).needs and get(m).uses for m in used)


def option_table() -> dict[str, Option]:
    """Every option of every registered method (and acceptance's), by name, in registration order."""
    kinds = dict.fromkeys([AcceptConfig, *(k for m in _REGISTRY.values() for k in m.options)])
    return {o.name: o for kind in kinds for o in options_of(kind)}


def generation_config(
    method: str = "ar",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | str | None = None,
    ignore_eos: bool = False,
    deterministic: bool = False,
    **options,
) -> GenerationConfig:
    """The frozen ``GenerationConfig`` of these options, validated as far as no model is needed
    (the CLI calls it before loading one, so a bad flag fails in a second, not after the load).
    ``options``: acceptance's and the method's own (``Method.options``), over its presets."""
    if isinstance(stop, str):  # one stop string, not its characters
        stop = [stop]
    registered = get(method)
    table = option_table()
    unknown = [k for k in options if k not in table]
    if unknown:
        raise TypeError(f"unexpected option {unknown[0]!r}; the options are: {', '.join(table)}")
    kinds = (AcceptConfig, *registered.options)
    foreign = [k for k in options if table[k].kind not in kinds]
    if foreign:
        own = [o.name for kind in kinds for o in options_of(kind)]
        raise ParadecError(f"method {method} has no option {foreign[0]}; drop it (its options: {', '.join(own)})")
    values = {**registered.presets, **options}
    records = {kind: build(kind, values) for kind in kinds}
    sampling = SamplingConfig(float(temperature), int(top_k), float(top_p), seed)
    gen = GenerationConfig(
        int(max_new_tokens),
        sampling,
        tuple(stop or ()),
        bool(ignore_eos),
        method,
        records.pop(AcceptConfig),
        bool(deterministic),
        tuple(records.values()),
    )
    registered.check_options(gen)
    return gen


_REGISTRY: dict[str, Method] = {}
# what the CLI, the chat and the server run when no method is named: the loaded drafter that pays
DEFAULT = "auto"


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


LOOKUP, SSM, HEADS = (LookupOptions,), (SsmOptions, LookupOptions), (TreeOptions, PruneOptions)
EAGLE = (TreeOptions, EagleOptions, LookupOptions)
# ASPD's methods: its own decode loop on a model fine-tuned for it (the zoo's adapter by default), greedy
ASPD = dict(
    decode=factories.aspd,
    stream=factories.aspd_stream,
    needs=("aspd_model",),
    options=(AspdOptions,),
    acceptors=(),
    model=bundled_aspd,
)
PROPD = {"prune": True, "dynamic": True}
BOTH = ("torch", "llamacpp")
for _m in (
    # it drafts nothing: the exact acceptors sample its bonus token from p; typical's lossy rule has nothing to do
    Method(
        "ar",
        "autoregressive: one target pass per token (the reference)",
        drafter=factories.root,
        backends=BOTH,
        acceptors=("mss", "naive"),
        demo={},
    ),
    Method(
        "auto",
        "each step and row, the loaded drafter (or none) with the most expected tokens per second on this CPU",
        drafter=factories.auto,
        uses=("drafts", "heads", "eagle", "datastore"),
        options=(LookupOptions, SsmOptions, TreeOptions, EagleOptions),
        backends=BOTH,
        acceptors=("mss", "naive"),
        demo={},
    ),
    Method(
        "specinfer",
        "SpecInfer: SSM token trees (expansion), merged, verified in one pass",
        drafter=factories.specinfer,
        needs=("drafts",),
        options=SSM,
        demo={"expansion": (1, 1, 1, 1)},  # one SSM, a 4-deep chain: the demo stays short
    ),
    Method(
        "specinfer+ngram",
        "SpecInfer with prompt lookup merged into the SSM tree",
        drafter=factories.specinfer,
        needs=("drafts",),
        options=SSM,
        presets={"with_ngram": True},
    ),
    Method(
        "pld",
        "prompt lookup: continuations of the longest suffix match in the context",
        drafter=factories.pld,
        options=LOOKUP,
        backends=BOTH,
        exact_chains_only=True,
        demo={},
    ),
    Method(
        "rest",
        "REST: the most frequent continuation of the context's suffix in a datastore of text",
        drafter=factories.rest,
        needs=("datastore",),
        options=(DatastoreOptions,),
        backends=BOTH,
        exact_chains_only=True,
    ),
    Method(
        "medusa",
        "Medusa heads, a static rank-path tree of the size the heads were tuned for",
        drafter=factories.heads,
        needs=("heads",),
        options=HEADS,
        demo={},
    ),
    # Medusa's reference sparse tree size (mc_sim_7b_63: 63 nodes + root), the baseline ProPD reports
    Method(
        "medusa-63",
        "Medusa heads, a static 63-node tree",
        drafter=factories.heads,
        needs=("heads",),
        options=HEADS,
        presets={"tree_nodes": 63},
    ),
    Method(
        "propd",
        "ProPD: Medusa heads, early pruning in the pass, tree size from the online cost model",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options=HEADS,
        presets=PROPD,
        demo={},
    ),
    # ablations of ProPD
    Method(
        "medusa+prune",
        "ProPD ablation: static tree + early pruning",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options=HEADS,
        presets={**PROPD, "dynamic": False},
    ),
    Method(
        "medusa+dynamic",
        "ProPD ablation: dynamic tree size, no pruning",
        drafter=factories.heads,
        needs=("heads",),
        options=HEADS,
        presets={**PROPD, "prune": False},
    ),
    Method(
        "propd+step",
        "ProPD, nodes scored by this step's calibrated head probabilities",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options=HEADS,
        presets={**PROPD, "step_scores": True},
    ),
    Method(
        "eagle",
        "EAGLE-2: a feature-level draft head grows a dynamic tree; the top-m by draft confidence are verified",
        drafter=factories.eagle,
        needs=("eagle",),
        options=EAGLE,
        demo={},
    ),
    Method(
        "eagle+propd",
        "EAGLE-2's dynamic tree, its size chosen each step by ProPD's online cost model",
        drafter=factories.eagle,
        needs=("eagle",),
        options=EAGLE,
        presets={"dynamic": True},
    ),
    Method(
        "eagle+ngram",
        "EAGLE-2, or prompt lookup's chain on a suffix match of 2+ tokens (no head passes)",
        drafter=factories.eagle,
        needs=("eagle",),
        options=EAGLE,
        presets={"with_ngram": True},
        demo={},
    ),
    # an ASPD model's own output (fine-tuned with branch tokens), not the base model's: not lossless
    Method(
        "aspd",
        "ASPD: hybrid serial/parallel decoding of an ASPD model's branches",
        lossless=False,
        **ASPD,
    ),
    Method(
        "aspd-r0",
        "ASPD, a title that repeats the plan ends it (no retries)",
        lossless=False,
        presets={"title_retries": 0},
        **ASPD,
    ),
    # lossless with respect to `aspd` of the same model (tested), not to the base model's `ar`
    Method(
        "aspd+spec",
        "ASPD with prompt-lookup drafts inside every branch, all verified in one pass",
        lossless=False,
        same_tokens_as="aspd",
        presets={"aspd_draft": 4},
        **ASPD,
    ),
):
    register(_m)

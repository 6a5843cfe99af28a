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
from dataclasses import dataclass, field
from types import MappingProxyType

from paradec import factories
from paradec.config import ACCEPTORS, GenerationConfig, SamplingConfig, SpecConfig
from paradec.draft import Drafter
from paradec.errors import ParadecError
from paradec.factories import Target
from paradec.parallel.grammar import Specials

# what a method may need loaded: draft models, Medusa heads, an early head, a model fine-tuned for it
NEEDS = ("drafts", "heads", "early_head", "aspd_model", "eagle")


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


def only_uses_drafters(used: tuple[str, ...] | None) -> bool:
    """Whether the drafters asked for are ones ``used`` methods only *use* (auto), not need: they do
    not tie the model to torch, since llama.cpp's `ar` may beat them all (then they are not loaded)."""
    return bool(used) and all(not get(m).needs and get(m).uses for m in used)


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
    ),
    Method(
        "auto",
        "each step and row, the loaded drafter (or none) with the most expected tokens per second on this CPU",
        drafter=factories.auto,
        uses=("drafts", "heads", "eagle"),
        backends=BOTH,
        acceptors=("mss", "naive"),
        options={"dynamic": True},  # it sizes its own trees: the batch budget does not cut them
    ),
    Method(
        "specinfer",
        "SpecInfer: SSM token trees (expansion), merged, verified in one pass",
        drafter=factories.specinfer,
        needs=("drafts",),
    ),
    Method(
        "specinfer+ngram",
        "SpecInfer with prompt lookup merged into the SSM tree",
        drafter=factories.specinfer,
        needs=("drafts",),
        options={"with_ngram": True},
    ),
    Method("pld", "prompt lookup: continuations of the longest suffix match in the context", drafter=factories.pld),
    Method(
        "medusa",
        "Medusa heads, a static rank-path tree of the size the heads were tuned for",
        drafter=factories.heads,
        needs=("heads",),
    ),
    # Medusa's reference sparse tree size (mc_sim_7b_63: 63 nodes + root), the baseline ProPD reports
    Method(
        "medusa-63",
        "Medusa heads, a static 63-node tree",
        drafter=factories.heads,
        needs=("heads",),
        options={"tree_nodes": 63},
    ),
    Method(
        "propd",
        "ProPD: Medusa heads, early pruning in the pass, tree size from the online cost model",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options=PROPD,
    ),
    # ablations of ProPD
    Method(
        "medusa+prune",
        "ProPD ablation: static tree + early pruning",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options={**PROPD, "dynamic": False},
    ),
    Method(
        "medusa+dynamic",
        "ProPD ablation: dynamic tree size, no pruning",
        drafter=factories.heads,
        needs=("heads",),
        options={**PROPD, "prune": False},
    ),
    Method(
        "propd+step",
        "ProPD, nodes scored by this step's calibrated head probabilities",
        drafter=factories.heads,
        needs=("heads", "early_head"),
        options={**PROPD, "step_scores": True},
    ),
    Method(
        "eagle",
        "EAGLE-2: a feature-level draft head grows a dynamic tree; the top-m by draft confidence are verified",
        drafter=factories.eagle,
        needs=("eagle",),
    ),
    Method(
        "eagle+propd",
        "EAGLE-2's dynamic tree, its size chosen each step by ProPD's online cost model",
        drafter=factories.eagle,
        needs=("eagle",),
        options={"dynamic": True},
    ),
    Method(
        "eagle+ngram",
        "EAGLE-2, or prompt lookup's chain on a suffix match of 2+ tokens (no head passes)",
        drafter=factories.eagle,
        needs=("eagle",),
        options={"with_ngram": True},
    ),
    # an ASPD model's own output (fine-tuned with branch tokens), not the base model's: not lossless
    Method(
        "aspd",
        "ASPD: hybrid serial/parallel decoding of an ASPD model's branches",
        decode=factories.aspd,
        stream=factories.aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
    ),
    Method(
        "aspd-r0",
        "ASPD, a title that repeats the plan ends it (no retries)",
        decode=factories.aspd,
        stream=factories.aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
        options={"title_retries": 0},
    ),
    # lossless with respect to `aspd` of the same model (tested), not to the base model's `ar`
    Method(
        "aspd+spec",
        "ASPD with prompt-lookup drafts inside every branch, all verified in one pass",
        decode=factories.aspd,
        stream=factories.aspd_stream,
        needs=("aspd_model",),
        acceptors=(),
        lossless=False,
        same_tokens_as="aspd",
        options={"aspd_draft": 4},
    ),
):
    register(_m)

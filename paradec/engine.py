"""The user-facing ``Engine``: loading, ``generate``, ``stream``, options.

    prompt -> prefill -> loop { propose a token tree -> verify it in one target pass
                                -> accept a path + bonus -> commit the accepted K/V } -> text

The loop is ``paradec.scheduler`` (the server runs the same one with requests coming and
going). ``ar`` is the loop with a root-only tree. Methods differ only in the drafter that
proposes trees and the acceptance rule (``paradec.verify``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from paradec import companions, methods
from paradec.config import GenerationConfig, ModelConfig
from paradec.cpu import DTYPES, FormatChoice, ParadecWarning, PassCost, choose_format  # noqa: F401 (DTYPES: re-exported)
from paradec.cpu.prefill import PREFILLS, prefill_path
from paradec.cpu.whole import cached_curve, whole_curve, whole_key
from paradec.draft import Drafter, NgramDrafter, TreeDrafter
from paradec.draft.ngram import PLD_DRAFT
from paradec.errors import ParadecError
from paradec.models import Transformer, load_model
from paradec.models.gguf import is_gguf, paradec_home, resolve_model
from paradec.models.llamacpp import BACKENDS, LlamaCppModel
from paradec.models.llamacpp import available as llamacpp_available
from paradec.models.quant import QUANTS, pack_linears, quantize_linears
from paradec.models.runtime import AUTO_MARGIN, batch_exactness, check_llamacpp, llamacpp_choice, llamacpp_runs
from paradec.policy import TreePolicy
from paradec.policy.budget import BatchBudget
from paradec.scheduler import Scheduler
from paradec.state import Generation, Row, Stats, StepEvent
from paradec.text import TextStream
from paradec.tokenizer import Tokenizer, load_tokenizer


class Engine:
    """A loaded target model + tokenizer (+ its drafters); ``generate`` and ``stream`` run any
    registered method on it (``paradec.methods``; options: ``config``)."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, model_dir: Path | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.device = torch.device("cpu") if model.backend == "llamacpp" else model.embed.weight.device
        self.companions: dict[str, Any] = {}  # what was loaded beside it, by name (``paradec.companions``)
        self.quant = "none"  # weight format of the target's linears (``load(quant=...)``)
        self.policies: dict[tuple, TreePolicy] = {}  # ProPD's online statistics, per configuration
        self.budget: BatchBudget | None = BatchBudget()  # how much of a batch's greedy trees to verify
        self.cost: PassCost | None = None  # the measured pass-cost curve of the format it runs in (``paradec.cpu``)
        self.format: FormatChoice | None = None  # which format, and why (``load``)

    def own_budget(self) -> BatchBudget | None:
        """A draft budget like this engine's but of its own (None where trees are verified whole):
        for a method decoded in turn with others, so their statistics do not move each other's."""
        return None if self.budget is None else BatchBudget(self.cost)

    def load_companion(self, name: str, value: Any) -> None:
        """Load companion ``name`` (a path, or paths) beside this target (``paradec.companions``)."""
        companion = companions.get(name)
        if companion.load is None:
            raise ParadecError(f"{companion.summary} is not loaded from a file of its own")
        self.companions[name] = companion.load(self, value)

    # ---- public API -------------------------------------------------------------------------
    def generate(
        self, prompts: str | list[int] | list[str] | list[list[int]], *, chat: bool = False, drafter=None, **options
    ) -> Generation | list[Generation]:
        """Decode one prompt (str, token ids, or a conversation: a list of ``{"role", "content"}``
        messages, put through the model's chat template) or a batch (a list of them).

        Returns one ``Generation`` per prompt, in order (a bare one for a single prompt).
        ``drafter`` plugs in any ``paradec.draft.Drafter`` (subclass ``DrafterHooks`` for the
        no-op policy hooks) instead of the method's own.
        Example: ``engine.generate("def add(a, b):", max_new_tokens=32).text``.
        """
        single, batch = _as_batch(prompts)
        gen = self.config(**options)
        decode = methods.get(gen.method).decode
        ids = [self.encode(p, chat) for p in batch]
        if decode is not None:  # a method with its own loop (ASPD's hybrid decoder)
            out = decode(self, ids, gen)
            return out[0] if single else out
        rows = self.new_rows(ids, gen)
        texts = [self.text_stream(gen) for _ in rows]
        for event in self._decode(rows, gen, drafter):
            if texts[event.row].add(event.token_ids):
                rows[event.row].finish("stop")
            texts[event.row].piece()
        out = []
        for row, text in zip(rows, texts):
            text.close()
            out.append(Generation(text.text, row.new_ids, row.finish_reason, row.stats))
        return out[0] if single else out

    def stream(self, prompt: str | list[int] | list[dict], *, chat: bool = False, **options) -> Iterator[str]:
        """Yield the text of one prompt piece by piece as it is committed (same options as
        ``generate``). The pieces concatenate to ``generate(prompt, ...).text``."""
        gen = self.config(**options)
        method = methods.get(gen.method)
        ids = self.encode(prompt, chat)
        if method.stream is not None:  # a method with its own loop (ASPD) streams through it
            for piece in method.stream(self, ids, gen):
                if piece:
                    yield piece
            return
        if method.decode is not None:  # one without a stream of its own: its text in one piece
            text = method.decode(self, [ids], gen)[0].text
            if text:
                yield text
            return
        rows = self.new_rows([ids], gen)
        text = self.text_stream(gen)
        for event in self._decode(rows, gen):
            if text.add(event.token_ids):
                rows[0].finish("stop")
            piece = text.piece()
            if piece:
                yield piece
        rest = text.close()
        if rest:
            yield rest

    def text_stream(self, gen: GenerationConfig) -> TextStream:
        """One answer's output processor: tokens in, final text out (``paradec.text``)."""
        return TextStream(self.tokenizer.decode, gen.stop)

    def config(self, method: str = "ar", **options) -> GenerationConfig:
        """The frozen ``GenerationConfig`` for these options (``methods.generation_config``'s:
        max_new_tokens, temperature, top_k, top_p, seed, stop, ignore_eos and the method's own),
        validated against this engine too."""
        gen = methods.generation_config(method, **options)
        methods.get(method).check(self, gen)
        return gen

    def warmup(self) -> None:
        """Set the kernels up: a few `ar` steps, and tree passes where this runtime verifies trees
        (prompt lookup's chains on a repeated pattern; the batch budget learns their cost)."""
        vocab = self.model.config.vocab_size
        ids = [t % vocab for t in (11, 12, 13) * 4]
        self.generate(ids, max_new_tokens=2, ignore_eos=True)
        if self.model.backend == "torch" or self.model.exact_chains:
            per_match, most = PLD_DRAFT[self.quant]
            lookup = TreeDrafter([], NgramDrafter(4, most, 1, per_match=per_match))
            self.generate(ids, drafter=lookup, max_new_tokens=4, ignore_eos=True)

    # ---- the loop (paradec.scheduler) ------------------------------------------------------
    def _decode(self, rows: list[Row], gen: GenerationConfig, drafter: Drafter | None = None) -> Iterator[StepEvent]:
        """Decode ``rows`` as one group on a scheduler of their own; yields each step's events."""
        drafter = drafter or methods.get(gen.method).drafter(self, gen)
        max_len = max(len(r.tokens) + r.budget for r in rows) + 1  # budgets are capped at the context
        scheduler = Scheduler(self, len(rows), max_len + drafter.max_nodes, self.tokenizer.eos_ids, self.budget)
        group = scheduler.admit(rows, gen, drafter)
        while scheduler.groups:
            for _, event in scheduler.step():
                yield event
        if group.error is not None:
            raise RuntimeError(f"decoding failed: {group.error}")

    # ---- the request boundary: prompt -> ids -> rows ------------------------------------------
    def encode(self, prompt: str | list[int] | list[dict], chat: bool = False) -> list[int]:
        """A prompt (text, token ids, or a conversation of ``{"role", "content"}`` messages) ->
        checked token ids; ``chat``: text goes through the chat template as one user turn."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):  # a conversation
            ids = self.tokenizer.encode_messages(prompt)
        elif isinstance(prompt, list):
            ids = list(prompt)
        elif isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:
                raise ParadecError(
                    "the prompt is not valid UTF-8 text; pass UTF-8 (e.g. fix the terminal's "
                    "encoding or the file the prompt came from)"
                ) from None
            ids = self.tokenizer.encode(prompt, chat)
        else:
            raise ParadecError(
                f"a prompt must be a string, token ids or a list of messages, not {type(prompt).__name__}"
            )
        if not ids:
            raise ParadecError("the prompt is empty after tokenization; pass some text")
        limit = self.model.config.context_length
        if len(ids) >= limit:
            raise ParadecError(
                f"the prompt has {len(ids)} tokens but the model's context is {limit}; shorten the prompt"
            )
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ParadecError(f"prompt token ids must be in [0, {vocab})")
        return ids

    def new_rows(self, ids: list[list[int]], gen: GenerationConfig) -> list[Row]:
        """One decode row per prompt: its budget capped at the context, its seeded generator."""
        rows = []
        limit = self.model.config.context_length
        for prompt in ids:
            g = None
            if not gen.sampling.greedy:
                g = torch.Generator(device=self.device)
                g.manual_seed(
                    gen.sampling.seed if gen.sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
                )
            budget = min(gen.max_new_tokens, limit - len(prompt))
            rows.append(Row(list(prompt), len(prompt), g, Stats(gen.method), budget=budget))
        return rows


def _as_batch(prompts) -> tuple[bool, list]:
    """(single?, list of prompts): a string, a list of token ids or a list of messages is one prompt."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], (int, dict))):
        return True, [prompts]
    if not isinstance(prompts, list) or not prompts:
        raise ParadecError("prompts must be a string, a list of token ids, or a non-empty list of those")
    return False, list(prompts)


def load(
    model_dir: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
    exact: bool = True,
    quant: str = "auto",
    quant_head: str | None = None,
    threads: int | None = None,
    warmup: bool = True,
    pack: bool = True,
    prefill: str = "auto",
    batch: int = 1,
    batch_budget: bool = True,
    cost: PassCost | None = None,
    backend: str | None = None,
    methods_used: tuple[str, ...] | None = None,
    **companions_given: Any,
) -> Engine:
    """Load a Hugging Face-format Llama/Qwen2/Mistral directory or a GGUF file (and what a method
    loads beside it, by companion name: ``drafts=[PATH, ...]``, ``heads=PATH``, ``eagle=PATH``;
    ``paradec.companions``) into an ``Engine``.

    ``dtype`` / ``quant`` "auto": measure this CPU once (``paradec.cpu``, cached under
    ``$PARADEC_HOME/profiles``) and take the format with the cheapest `ar` step; or bf16 / fp32
    and none / int8 / int4 weight-only linears (``models.quant``; the LM head in ``quant_head``).
    A format asked for that this CPU runs far slower is warned about. Every method is lossless
    against the model in the format it runs in. ``exact``: shape-invariant decode numerics, so
    greedy speculation equals `ar` in bf16 too (``Transformer.set_exact``). ``pack``: bf16 linears packed
    for oneDNN where their rows stay invariant (``models.quant.pack_linears``; inference only:
    training, which runs autograd through the frozen target, passes False). ``prefill``: the weights a
    quantized model's prompt passes take: "auto" (dense copies where they measure faster,
    ``cpu.prefill``), "kernel" (the quantized kernels), "bf16" or "fp32". ``batch``: the rows
    the engine is built for; "auto" takes the format with the cheapest `ar` step of that many rows
    (a server passes its --max-batch). ``cost``: the pass-cost curve policies start from (default:
    the loaded model's, measured once, ``cpu.whole``; ``PassCost.flat()``: every width the same, as
    tests do). ``batch_budget``: cut a batch's greedy chains to the width that pays (``policy.budget``).
    ``backend``: "torch", "llamacpp" (llama.cpp's kernels on a GGUF file: `ar`, and the chain
    drafters where the build's batches are exact, ``models.llamacpp``) or "auto" (default, or
    ``$PARADEC_BACKEND``): llama.cpp when it is installed, the model is a GGUF file,
    ``methods_used`` all run there, nothing torch-only is asked for, and it measures faster.
    ``warmup``: a few tiny passes, so the first request does not pay for kernel set-up.

    Example: ``paradec.load("zoo/target").generate("import os", max_new_tokens=16)``.
    """
    _check_load_args(threads, dtype, device, quant, quant_head, prefill)
    if threads is not None:
        torch.set_num_threads(threads)
    given = _companions_given(companions_given)
    if (asked := backend or os.environ.get("PARADEC_BACKEND") or "auto") not in BACKENDS:
        raise ParadecError(f"unknown backend {asked!r}; use {', '.join(BACKENDS)}")
    source = Path(model_dir)
    optional = methods.only_uses_drafters(methods_used)  # auto's: not loaded if llama.cpp runs the model
    torch_only = _torch_only(given, dtype, quant, quant_head, device, exact, methods_used, optional)
    if asked == "llamacpp":
        check_llamacpp(source, torch_only)
    model_dir = resolve_model(model_dir)  # a .gguf file -> its cached HF conversion
    choice = choose_format(model_dir, dtype, quant, device, exact, batch=batch)
    eligible = is_gguf(source) and not torch_only and methods_used is not None and llamacpp_available()
    wanted = asked == "llamacpp" or (asked == "auto" and eligible)
    measured = cost is None and choice.cost is not None and choice.cost.measured
    key = whole_key(choice.name, quant_head, pack, exact)
    engine, whole = None, cached_curve(key, choice.profile_path) if measured else None  # the model's own passes
    lc = None
    if wanted and llamacpp_runs(source, asked, threads):  # llama.cpp where it may run and measures faster
        lc = LlamaCppModel(source, ModelConfig.from_dir(model_dir), threads or torch.get_num_threads())
        batch_exactness(lc, paradec_home())
        refused = [methods.get(m) for m in methods_used or () if not methods.get(m).runs_on(lc)]
        if refused and asked == "llamacpp":
            raise refused[0].inexact_error()
        lc = None if refused else lc  # auto: torch runs them exactly
    if lc is not None:
        if asked == "auto" and measured and whole is None:  # whole passes against whole passes
            engine = _engine_on_torch(model_dir, choice, device, exact, quant_head, given, pack, prefill)
            whole = whole_curve(engine.model, key, choice.profile_path)
        compared = choice if whole is None else replace(choice, cost=whole)
        lc_choice = llamacpp_choice(lc, compared, asked, AUTO_MARGIN if optional else 1.0)
        if lc_choice is not None:
            engine = Engine(lc, load_tokenizer(model_dir, lc.config.eos_token_ids), model_dir)
            for c in companions.loadable():  # the ones that load beside llama.cpp's runtime (a datastore)
                if c.name in given and "llamacpp" in c.backends:
                    engine.load_companion(c.name, given[c.name])
            return _finish_load(engine, lc_choice, cost, batch_budget, warmup)
    engine = engine or _engine_on_torch(model_dir, choice, device, exact, quant_head, given, pack, prefill)
    if measured:
        choice = replace(choice, cost=whole or whole_curve(engine.model, key, choice.profile_path))
    return _finish_load(engine, choice, cost, batch_budget, warmup)


def _companions_given(given: dict[str, Any]) -> dict[str, Any]:
    """``load``'s companion keywords that name something (None and empty lists name nothing)."""
    known = {c.name for c in companions.loadable()}
    unknown = [name for name in given if name not in known]
    if unknown:
        raise TypeError(f"load() got an unexpected keyword argument {unknown[0]!r}; companions: {', '.join(known)}")
    return {name: value for name, value in given.items() if value is not None and value != [] and value != ()}


def _engine_on_torch(
    model_dir: Path, choice: FormatChoice, device, exact, quant_head, given: dict, pack: bool = True, prefill="auto"
) -> Engine:
    """The target in the chosen format on paradec's runtime, with the companions asked for."""
    model = load_model(model_dir, choice.dtype, device)
    model.set_exact(exact)
    model.prefill_path = prefill_path(model, choice.quant, choice.profile_path, prefill) if pack else None
    quantize_linears(model, choice.quant, quant_head, model.prefill_path)
    if pack:
        pack_linears(model)  # the bf16 linears left, where oneDNN packs them row-invariantly
    engine = Engine(model, load_tokenizer(model_dir, model.config.eos_token_ids), model_dir)
    engine.quant = choice.quant  # draft models get the target's weight format
    for c in companions.loadable():  # in registration order
        if c.name in given:
            engine.load_companion(c.name, given[c.name])
    return engine


def _torch_only(
    given: dict, dtype, quant, quant_head, device, exact, methods_used, optional: bool = False
) -> list[str]:
    """What was asked for that only paradec's torch runtime runs (llama.cpp runs `ar` and the chain drafters);
    ``optional``: the companions are ones the methods only use (auto), not needs."""
    asks = {
        **{name: not optional and "llamacpp" not in companions.get(name).backends for name in given},
        "dtype": dtype != "auto",
        "quant": quant != "auto" or quant_head is not None,
        "device": device != "cpu",
        "exact=False": not exact,
    }
    out = [what for what, yes in asks.items() if yes]
    elsewhere = [m for m in methods_used or () if "llamacpp" not in methods.get(m).backends]
    return out + ([f"method {', '.join(elsewhere)}"] if elsewhere else [])


def _check_load_args(threads: int | None, dtype, device: str, quant: str, quant_head: str | None, prefill: str) -> None:
    if threads is not None and threads < 1:
        raise ParadecError(f"threads must be >= 1, got {threads}")
    if prefill not in PREFILLS:
        raise ParadecError(f"unknown prefill {prefill!r}; use {', '.join(PREFILLS)}")
    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPES:
        raise ParadecError(f"unknown dtype {dtype!r}; use auto, bf16 or fp32")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParadecError("device=cuda was asked for but no CUDA device is visible; use device=cpu")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ParadecError(f"unknown device {device!r}; use cpu or cuda")
    if quant not in ("auto", *QUANTS) or quant_head not in (None, *QUANTS):
        raise ParadecError(
            f"unknown quant {quant!r} / quant_head {quant_head!r}; use auto or one of {', '.join(QUANTS)}"
        )
    if quant not in ("none", "auto") and not device.startswith("cpu"):
        raise ParadecError(f"quant={quant} uses torch's packed CPU kernels; use device=cpu or quant=none")


def _finish_load(engine: Engine, choice: FormatChoice, cost: PassCost | None, batch_budget: bool, warmup: bool):
    engine.quant, engine.format = choice.quant, choice
    engine.cost = cost or choice.cost
    engine.budget = BatchBudget(engine.cost) if batch_budget else None  # None: every tree verified in full
    if warmup:
        engine.warmup()
    settle_heap()
    return engine


def settle_heap() -> None:
    """After a full collection, move every object alive now into the collector's permanent
    generation (``gc.freeze``), so its full passes skip the model, the tokenizer and the
    libraries' objects. Each full pass had walked them all: 80-180 ms, 5 times in one demo run on
    an EPYC Zen 4, a stall on whichever decode step met it (a method 0.4-0.6x `ar` on that
    answer). Objects dropped later are still freed by reference counting; those in reference cycles
    (a discarded engine's) wait until the next load, which unfreezes and collects first. A cost:
    ``gc.get_referrers`` no longer sees frozen referrers (Hypothesis's ``register_random`` then
    warns, wrongly, that trio's generator may be collected)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()

"""The user-facing ``Engine``: loading, ``generate``, ``stream``, options.

    prompt -> prefill -> loop { propose a token tree -> verify it in one target pass
                                -> accept a path + bonus -> commit the accepted K/V } -> text

The loop is ``paradec.scheduler`` (the server runs the same one with requests coming and
going). ``ar`` is the loop with a root-only tree. Methods differ only in the drafter that
proposes trees and the acceptance rule (``paradec.verify``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from paradec import methods
from paradec.config import GenerationConfig, ModelConfig
from paradec.cpu import DTYPES, FormatChoice, PassCost, choose_format  # noqa: F401 (DTYPES: re-exported)
from paradec.draft import Drafter
from paradec.errors import ParadecError
from paradec.models import Transformer, load_model
from paradec.models.eagle import EagleHead, load_eagle
from paradec.models.gguf import is_gguf, paradec_home, resolve_model
from paradec.models.heads import Heads, load_heads
from paradec.models.llamacpp import BACKENDS, LlamaCppModel, llamacpp_cost
from paradec.models.llamacpp import available as llamacpp_available
from paradec.models.quant import QUANTS, quantize_linears
from paradec.policy import TreePolicy
from paradec.policy.budget import BatchBudget
from paradec.scheduler import Scheduler
from paradec.state import Generation, Row, Stats, StepEvent
from paradec.tokenizer import Tokenizer, load_tokenizer


class Engine:
    """A loaded target model + tokenizer (+ draft models); ``generate`` and ``stream`` run any
    method on it. Options (keyword arguments of both):

    method: "ar" | "specinfer" (draft models, optionally + prompt lookup) | "pld" (prompt lookup)
    max_new_tokens, temperature (0 = greedy), top_k, top_p, seed, stop, ignore_eos, chat
    expansion (SSM children per level), with_ngram, max_ngram, num_draft, ngram_branches,
    acceptor ("mss" | "naive", sampling only)
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, model_dir: Path | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.device = torch.device("cpu") if model.backend == "llamacpp" else model.embed.weight.device
        self.drafts: list[Transformer] = []
        self.heads: Heads | None = None
        self.eagle: EagleHead | None = None  # EAGLE's draft head (shares this model's embedding and LM head)
        self.quant = "none"  # weight format of the target's linears (``load(quant=...)``)
        self.policies: dict[tuple, TreePolicy] = {}  # ProPD's online statistics, per configuration
        # how much of each greedy draft tree is verified (ProPD's cost model over the batch;
        # None: every tree in full)
        self.budget: BatchBudget | None = BatchBudget()
        self.cost: PassCost | None = None  # the measured pass-cost curve of the format it runs in (``paradec.cpu``)
        self.format: FormatChoice | None = None  # which format, and why (``load``)

    def load_heads(self, path: str | Path) -> None:
        """Load Medusa heads (+ the early-pruning head) trained for this target."""
        cfg = self.model.config
        self.heads = load_heads(path, cfg.hidden_size, cfg.rms_norm_eps, self.model.embed.weight.dtype, self.device)

    def load_eagle(self, path: str | Path) -> None:
        """Load an EAGLE draft head trained for this target (``paradec train eagle``)."""
        self.eagle = load_eagle(path, self.model.config, self.model.embed.weight.dtype, self.device)
        if self.device.type == "cpu":  # a draft reads 1-4 rows a pass: int8 weights ~1.7x faster there; its
            quantize_linears(self.eagle, "int8")  # rounding changes what is proposed, never what is verified

    def load_drafts(self, paths: list[str | Path]) -> None:
        """Load SSMs for ``specinfer``; each must share the target's tokenizer."""
        target_vocab = self.tokenizer.hf.get_vocab()
        dtype = self.model.embed.weight.dtype
        for path in paths:
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
            draft = load_model(path, dtype, self.device)
            draft.set_exact(False)  # a draft's rounding never reaches the output
            quantize_linears(draft, self.quant)
            if draft.config.vocab_size != self.model.config.vocab_size:
                raise ParadecError(
                    f"draft {path} has a vocabulary of {draft.config.vocab_size}, the target "
                    f"{self.model.config.vocab_size}; a draft must share the target's tokenizer"
                )
            if (Path(path) / "tokenizer.json").is_file():
                if load_tokenizer(Path(path), ()).hf.get_vocab() != target_vocab:
                    raise ParadecError(
                        f"draft {path} has a different tokenizer from the target; "
                        "a draft must share the target's tokenizer"
                    )
            self.drafts.append(draft)

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
        if decode is not None:  # a method with its own loop (ASPD's hybrid decoder)
            out = decode(self, [self._encode(p, chat) for p in batch], gen)
            return out[0] if single else out
        rows = self._rows([self._encode(p, chat) for p in batch], gen)
        for _ in self._decode(rows, gen, drafter):
            pass
        out = [self._finish(row, gen) for row in rows]
        return out[0] if single else out

    def stream(self, prompt: str | list[int] | list[dict], *, chat: bool = False, **options) -> Iterator[str]:
        """Yield the text of one prompt piece by piece as it is committed (same options as
        ``generate``). The pieces concatenate to ``generate(prompt, ...).text``."""
        gen = self.config(**options)
        method = methods.get(gen.method)
        if method.stream is not None:  # a method with its own loop (ASPD) streams through it
            for piece in method.stream(self, self._encode(prompt, chat), gen):
                if piece:
                    yield piece
            return
        if method.decode is not None:  # one without a stream of its own: its text in one piece
            text = method.decode(self, [self._encode(prompt, chat)], gen)[0].text
            if text:
                yield text
            return
        rows = self._rows([self._encode(prompt, chat)], gen)
        sent = 0
        for _ in self._decode(rows, gen):
            piece, sent = self.text_delta(rows[0], gen, sent)
            if piece:
                yield piece
        rest = self._visible_text(rows[0], gen)[sent:]
        if rest:
            yield rest

    def text_delta(self, row: Row, gen: GenerationConfig, sent: int) -> tuple[str, int]:
        """The text of ``row`` that is final past the first ``sent`` characters, and the new
        count. Holds back what a stop string or an unfinished UTF-8 sequence may still change,
        until the row is done; the pieces concatenate to ``generate``'s text."""
        text = self._visible_text(row, gen)
        if row.done:
            return text[sent:], max(sent, len(text))
        hold = max((len(s) for s in gen.stop), default=1) - 1  # a stop string may be mid-way
        safe = max(sent, len(text) - hold)
        while safe > sent and text[safe - 1] == "\ufffd":  # an unfinished UTF-8 sequence
            safe -= 1
        return text[sent:safe], safe

    def config(
        self,
        method: str = "ar",
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        **spec,
    ) -> GenerationConfig:
        """The frozen ``GenerationConfig`` for these options (validated, against this engine too)."""
        gen = methods.generation_config(
            method, max_new_tokens, temperature, top_k, top_p, seed, stop, ignore_eos, **spec
        )
        methods.get(method).check(self, gen)
        return gen

    def warmup(self) -> None:
        """Set the kernels up: an `ar` step and a prompt-lookup tree (a repeated pattern), a few
        tokens each."""
        vocab = self.model.config.vocab_size
        ids = [t % vocab for t in (11, 12, 13) * 4]
        self.generate(ids, max_new_tokens=2, ignore_eos=True)
        if self.model.backend in methods.get("pld").backends:
            self.generate(ids, method="pld", max_new_tokens=4, ignore_eos=True)

    # ---- the loop (paradec.scheduler) ------------------------------------------------------
    def _decode(self, rows: list[Row], gen: GenerationConfig, drafter: Drafter | None = None) -> Iterator[StepEvent]:
        """Decode ``rows`` as one group on a scheduler of their own; yields each step's events."""
        drafter = drafter or methods.get(gen.method).drafter(self, gen)
        max_len = max(len(r.tokens) + r.budget for r in rows) + 1  # budgets are capped at the context
        scheduler = Scheduler(self, len(rows), max_len + drafter.max_nodes, self.budget)
        group = scheduler.admit(rows, gen, drafter)
        while scheduler.groups:
            for _, event in scheduler.step():
                yield event
        if group.error is not None:
            raise RuntimeError(f"decoding failed: {group.error}")

    # ---- edges ------------------------------------------------------------------------------
    def _encode(self, prompt: str | list[int] | list[dict], chat: bool) -> list[int]:
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

    def _rows(self, ids: list[list[int]], gen: GenerationConfig) -> list[Row]:
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

    def _visible_text(self, row: Row, gen: GenerationConfig) -> str:
        text = self.tokenizer.decode(row.new_ids)
        if row.finish_reason == "stop":
            cut = min((text.find(s) for s in gen.stop if s in text), default=len(text))
            text = text[:cut]
        return text

    def _finish(self, row: Row, gen: GenerationConfig) -> Generation:
        return Generation(self._visible_text(row, gen), row.new_ids, row.finish_reason, row.stats)


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
    drafts: list[str | Path] = (),
    heads: str | Path | None = None,
    eagle: str | Path | None = None,
    exact: bool = True,
    quant: str = "auto",
    quant_head: str | None = None,
    threads: int | None = None,
    warmup: bool = True,
    batch_budget: bool = True,
    cost: PassCost | None = None,
    backend: str | None = None,
    methods_used: tuple[str, ...] | None = None,
) -> Engine:
    """Load a local Hugging Face-format Llama/Qwen2/Mistral directory (and draft models for
    ``specinfer``) into an ``Engine``. ``exact`` (default): decode and verification passes use
    shape-invariant numerics, so every lossless method's greedy tokens equal `ar`'s in bf16 too
    (``Transformer.set_exact``); ``False`` trades that for speed at long contexts.
    ``dtype`` / ``quant``: "auto" (default) measures this CPU once (``paradec.cpu``: a pass of
    each weight format the file allows, cached under ``$PARADEC_HOME/profiles``) and takes the
    format with the cheapest `ar` step; or "bf16" / "fp32", and "none", "int8" or "int4"
    weight-only linears on the CPU (``models.quant``; a GGUF Q4_1 file's blocks map to int4 as
    they are), the LM head in ``quant_head`` (default: int8 when quantized). Every method is
    lossless against the model in the format it runs in. Draft models get the same quantization.
    A format asked for explicitly that this CPU runs far slower than another is warned about
    (``ParadecWarning``), with both measured costs.
    ``cost``: the pass-cost curve every draft policy starts from (default: the chosen format's
    measured curve; ``PassCost.flat()`` makes every width cost the same, as tests do).

    ``eagle``: an EAGLE draft head for this model (methods ``eagle``, ``eagle+propd``, ``eagle+ngram``).
    ``threads``: torch's CPU threads (default: torch's own choice, the physical cores).
    ``batch_budget``: in a batch, cut greedy draft chains to the width ProPD's cost model finds
    pays (``policy.budget``); False verifies every chain in full.
    ``backend``: the runtime of the target's passes. "torch" (paradec's own), "llamacpp"
    (llama.cpp's kernels on a GGUF file as it is: ``models.llamacpp``; method ar only, as its
    batched logits are not its single-token ones), or "auto" (the default, or
    ``$PARADEC_BACKEND``): llamacpp when llama-cpp-python is installed, the model is a GGUF file,
    ``methods_used`` (the methods the caller will run; None: any) all run there, nothing that
    needs torch is asked for (drafts, heads, eagle, an explicit dtype or quant) and its measured
    `ar` step is cheaper than torch's best format's on this CPU; otherwise torch.
    ``warmup``: run a few tiny passes (an `ar` step and a verified tree) so the first request does
    not pay for kernel set-up.

    Example: ``paradec.load("zoo/target").generate("import os", max_new_tokens=16)``.
    """
    if threads is not None:
        if threads < 1:
            raise ParadecError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
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
    if isinstance(drafts, (str, Path)):  # one draft model, not the characters of its path
        drafts = [drafts]
    backend = asked = backend or os.environ.get("PARADEC_BACKEND") or "auto"
    if backend not in BACKENDS:
        raise ParadecError(f"unknown backend {backend!r}; use {', '.join(BACKENDS)}")
    source = Path(model_dir)
    torch_only = [
        what
        for what, asked in (
            ("drafts", bool(drafts)),
            ("heads", heads is not None),
            ("eagle", eagle is not None),
            ("dtype", dtype != "auto"),
            ("quant", quant != "auto" or quant_head is not None),
            ("device", device != "cpu"),
            ("exact=False", not exact),
        )
        if asked
    ]
    elsewhere = [m for m in methods_used or () if "llamacpp" not in methods.get(m).backends]
    if elsewhere:
        torch_only.append(f"method {', '.join(elsewhere)}")
    if backend == "llamacpp":
        if not is_gguf(source):
            raise ParadecError("the llamacpp backend runs a GGUF file; pass model=FILE.gguf, or backend=torch")
        if torch_only:
            raise ParadecError(
                f"the llamacpp backend cannot take {', '.join(torch_only)} (llama.cpp runs the GGUF's "
                f"own format on the CPU, `ar` only, with no drafts or heads); drop them or use "
                f"backend=torch"
            )
    model_dir = resolve_model(model_dir)  # a .gguf file -> its cached HF conversion
    choice = choose_format(model_dir, dtype, quant, device, exact)
    if backend == "auto":  # llama.cpp where it may run and measures faster
        eligible = is_gguf(source) and not torch_only and methods_used is not None and llamacpp_available()
        backend = "llamacpp" if eligible else "torch"
    if backend == "llamacpp":
        lc = LlamaCppModel(source, ModelConfig.from_dir(model_dir), threads or torch.get_num_threads())
        lc_cost, lc_path, _ = llamacpp_cost(lc, paradec_home())
        faster = lc_cost.predict(1) < choice.cost.predict(1)
        if asked == "auto" and not faster:
            backend = "torch"
        else:
            reason = (
                "asked for (backend=llamacpp)"
                if asked == "llamacpp"
                else (
                    f"auto: llama.cpp's `ar` step {lc_cost.predict(1) * 1e3:.0f} ms < torch {choice.name}'s "
                    f"{choice.cost.predict(1) * 1e3:.0f} ms on this CPU"
                )
            )
            choice = replace(choice, name="gguf", quant="gguf", cost=lc_cost, reason=reason, profile_path=lc_path)
    if backend == "llamacpp":
        engine = Engine(lc, load_tokenizer(model_dir, lc.config.eos_token_ids), model_dir)
        engine.quant, engine.format = "gguf", choice
        engine.cost = cost or choice.cost
        engine.budget = BatchBudget(engine.cost) if batch_budget else None
        if warmup:
            engine.warmup()
        return engine
    model = load_model(model_dir, choice.dtype, device)
    model.set_exact(exact)
    quantize_linears(model, choice.quant, quant_head)
    engine = Engine(model, load_tokenizer(model_dir, model.config.eos_token_ids), model_dir)
    engine.quant, engine.format = choice.quant, choice
    engine.cost = cost or choice.cost
    engine.budget = BatchBudget(engine.cost) if batch_budget else None  # None: every tree verified in full
    engine.load_drafts(list(drafts))
    if heads is not None:
        engine.load_heads(heads)
    if eagle is not None:
        engine.load_eagle(eagle)
    if warmup:
        engine.warmup()
    return engine

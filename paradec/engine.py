"""The decode loop every method shares, and the user-facing ``Engine``.

    prompt -> prefill -> loop { propose a token tree -> verify it in one target pass
                                -> accept a path + bonus -> commit the accepted K/V } -> text

``ar`` is the same loop with a root-only tree. Methods differ only in the drafter that
proposes trees and the acceptance rule (``paradec.verify``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import torch

from paradec.config import GenerationConfig, SamplingConfig, SpecConfig
from paradec import methods
from paradec.draft import Drafter, Proposal
from paradec.errors import ParadecError
from paradec.models import Transformer, load_model
from paradec.models.gguf import resolve_model
from paradec.models.heads import Heads, load_heads
from paradec.models.quant import QUANTS, quantize_linears
from paradec.policy import TreePolicy
from paradec.sampling import greedy
from paradec.state import Generation, Row, Stats, StepEvent, Verification
from paradec.tokenizer import Tokenizer, load_tokenizer
from paradec.tree import ScratchTree, pass_tensors
from paradec.verify import Verdict, accept_greedy, accept_mss, accept_naive
from paradec.verify.prune import pruned_pass
from paradec.verify.typical import accept_typical

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
          "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}


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
        self.device = model.embed.weight.device
        self.drafts: list[Transformer] = []
        self.heads: Heads | None = None
        self.quant = "none"  # weight format of the target's linears (``load(quant=...)``)
        self.policies: dict[tuple, TreePolicy] = {}  # ProPD's online statistics, per configuration

    def load_heads(self, path: str | Path) -> None:
        """Load Medusa heads (+ the early-pruning head) trained for this target."""
        cfg = self.model.config
        self.heads = load_heads(path, cfg.hidden_size, cfg.rms_norm_eps, self.model.embed.weight.dtype, self.device)

    def load_drafts(self, paths: list[str | Path]) -> None:
        """Load SSMs for ``specinfer``; each must share the target's tokenizer."""
        target_vocab = self.tokenizer.hf.get_vocab()
        dtype = self.model.embed.weight.dtype
        for path in paths:
            if not Path(path).is_dir():
                raise ParadecError(f"draft directory {str(path)!r} does not exist; pass drafts=PATH to a "
                                   "Hugging Face-format draft model that shares the target's tokenizer")
            draft = load_model(path, dtype, self.device)
            draft.set_exact(False)  # a draft's rounding never reaches the output
            quantize_linears(draft, self.quant)
            if draft.config.vocab_size != self.model.config.vocab_size:
                raise ParadecError(f"draft {path} has a vocabulary of {draft.config.vocab_size}, the target "
                                   f"{self.model.config.vocab_size}; a draft must share the target's tokenizer")
            if (Path(path) / "tokenizer.json").is_file():
                if load_tokenizer(Path(path), ()).hf.get_vocab() != target_vocab:
                    raise ParadecError(f"draft {path} has a different tokenizer from the target; "
                                       "a draft must share the target's tokenizer")
            self.drafts.append(draft)

    # ---- public API -------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]], *, chat: bool = False,
                 drafter=None, **options) -> Generation | list[Generation]:
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
            yield from method.stream(self, self._encode(prompt, chat), gen)
            return
        if method.decode is not None:  # one without a stream of its own: its text in one piece
            text = method.decode(self, [self._encode(prompt, chat)], gen)[0].text
            if text:
                yield text
            return
        rows = self._rows([self._encode(prompt, chat)], gen)
        hold = max((len(s) for s in gen.stop), default=1) - 1  # a stop string may be mid-way
        sent = 0
        for _ in self._decode(rows, gen):
            text = self._visible_text(rows[0], gen)
            safe = len(text) if rows[0].done else max(sent, len(text) - hold)
            while safe > sent and text[safe - 1] == "\ufffd":  # an unfinished UTF-8 sequence
                safe -= 1
            if safe > sent:
                yield text[sent:safe]
                sent = safe
        text = self._visible_text(rows[0], gen)
        if len(text) > sent:
            yield text[sent:]

    def config(self, method: str = "ar", max_new_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: list[str] | None = None,
               ignore_eos: bool = False, **spec) -> GenerationConfig:
        """The frozen ``GenerationConfig`` for these options (validated)."""
        if isinstance(stop, str):  # one stop string, not its characters
            stop = [stop]
        registered = methods.get(method)
        spec = {**registered.options, **spec}
        if "expansion" in spec:
            spec["expansion"] = tuple(int(k) for k in spec["expansion"])
        try:
            spec_cfg = SpecConfig(**spec)
        except TypeError as exc:
            raise TypeError(f"unexpected option: {exc}") from None
        sampling = SamplingConfig(float(temperature), int(top_k), float(top_p), seed)
        gen = GenerationConfig(int(max_new_tokens), sampling, tuple(stop or ()), ignore_eos, method, spec_cfg)
        registered.check(self, gen)
        return gen

    def warmup(self) -> None:
        """Set the kernels up: an `ar` step and a prompt-lookup tree (a repeated pattern), a few
        tokens each."""
        vocab = self.model.config.vocab_size
        ids = [t % vocab for t in (11, 12, 13) * 4]
        self.generate(ids, max_new_tokens=2, ignore_eos=True)
        self.generate(ids, method="pld", max_new_tokens=4, ignore_eos=True)

    # ---- the loop ---------------------------------------------------------------------------
    def _decode(self, rows: list[Row], gen: GenerationConfig, drafter: Drafter | None = None) -> Iterator[StepEvent]:
        start = time.perf_counter()
        drafter = drafter or methods.get(gen.method).drafter(self, gen)
        max_len = max(len(r.tokens) + r.budget for r in rows) + 1  # budgets are capped at the context
        cache = self.model.new_cache(len(rows), max_len + drafter.max_nodes)
        with torch.inference_mode():
            self._prefill(rows, cache)
            drafter.begin([r.tokens for r in rows], max_len)
            prefill_s = time.perf_counter() - start
            for row in rows:
                row.stats.prefill_s = prefill_s
            while not all(row.done for row in rows):
                t_step = time.perf_counter()
                # propose -> verify (one target pass) -> accept -> commit -> observe
                proposals = drafter.propose([r.tokens for r in rows], [r.generator for r in rows])
                drafted = [len(p.tree) for p in proposals]
                t_fwd = time.perf_counter()
                ver = self._verify(proposals, cache, gen, drafter.prune_next)
                if ver.logits.device.type == "cuda":
                    torch.cuda.synchronize()  # host sync: only to time the pass; acceptance syncs anyway
                t_fwd = time.perf_counter() - t_fwd
                verdicts = self._accept(ver.proposals, ver.logits, rows, gen)
                for b, (row, prop, verdict) in enumerate(zip(rows, ver.proposals, verdicts)):
                    if row.done:
                        continue
                    accepted = [prop.tree.tokens[n] for n in verdict.nodes[1:]]
                    committed = self._append(row, accepted + [verdict.bonus], gen)
                    nodes = verdict.nodes[: len(committed)]  # EOS / budget may cut the path
                    cache.commit(b, [ver.slot(b, n) for n in nodes])
                    drafter.commit(b, accepted, verdict.bonus, ver.hidden[b, verdict.nodes[-1]])
                    if ver.early_top is not None:
                        # was the target's next token in the early head's top-k at the last node?
                        top = ver.early_top[b].get(ver.slot(b, verdict.nodes[-1]))
                        if top is not None:
                            drafter.observe_recall(verdict.bonus in top)
                    row.stats.steps += 1
                    row.stats.target_s += t_fwd
                    row.stats.nodes += drafted[b]
                    row.stats.verified += len(prop.tree)
                    row.stats.record(max(prop.tree.depths), len(accepted))
                    if row.done:
                        row.stats.wall_s = time.perf_counter() - start
                    yield StepEvent(b, committed)
                drafter.step_done(len(rows), max(drafted), max(len(p.tree) for p in ver.proposals),
                                  time.perf_counter() - t_step, ver.early_top is not None)

    def _prefill(self, rows: list[Row], cache) -> None:
        """Put every token but the root of each row into the cache (right-padded batch)."""
        lengths = [len(r.tokens) - 1 for r in rows]
        width = max(lengths)
        if width == 0:
            return
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for b, row in enumerate(rows):
            tokens[b, : lengths[b]] = torch.tensor(row.tokens[:-1])
        pos = torch.arange(width).expand(len(rows), width)
        # plain causal: a real query never sees padding, a padding query sees only finite rows
        causal = torch.ones(width, width, dtype=torch.bool).tril()[None, None]
        self.model.hidden(tokens.to(self.device), pos.to(self.device), causal.to(self.device), cache, prefill=True)
        for b, n in enumerate(lengths):
            cache.advance(b, n)

    def _verify(self, proposals: list[Proposal], cache, gen: GenerationConfig, prune: bool = True) -> Verification:
        """One target pass over every row's tree (pruned inside the pass for ProPD, when the
        method prunes and its policy says pruning pays this step)."""
        heads = self.heads
        if (prune and gen.spec.prune and heads is not None and heads.early is not None
                and max(len(p.tree) for p in proposals) > 1):
            return Verification(*pruned_pass(self.model, heads.early, heads.early_layer, gen.spec.prune_topk,
                                             proposals, cache))
        logits, hidden = self._verify_forward([p.tree for p in proposals], cache)
        return Verification(proposals, logits, hidden)

    def _verify_forward(self, trees, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One target pass: logits [batch, width, vocab], normed hidden [batch, width, hidden]."""
        width = max(len(t) for t in trees)
        rows = [ScratchTree.from_tree(t, width) for t in trees]
        tokens, pos, mask = pass_tensors(rows, 0, width, cache.lengths)
        dev = self.device
        h = self.model.hidden(tokens.to(dev), pos.to(dev), None if mask is None else mask.to(dev), cache)
        return self.model.normed_logits(h)

    def _accept(self, proposals: list[Proposal], logits: torch.Tensor, rows: list[Row],
                gen: GenerationConfig) -> list[Verdict]:
        if gen.sampling.greedy:
            target_next = greedy(logits).tolist()  # host sync: the loop needs the tokens
            return [accept_greedy(p.tree, nxt) for p, nxt in zip(proposals, target_next)]
        logits = logits.float()
        if gen.spec.acceptor == "typical":
            eps, delta = gen.spec.typical_epsilon, gen.spec.typical_delta
            return [accept_typical(p, logits[b, : len(p.tree)], gen.sampling, eps, delta, row.generator)
                    for b, (p, row) in enumerate(zip(proposals, rows))]
        rule = accept_mss if gen.spec.acceptor == "mss" else accept_naive
        return [rule(p, logits[b, : len(p.tree)], gen.sampling, row.generator)
                for b, (p, row) in enumerate(zip(proposals, rows))]

    def _append(self, row: Row, new: list[int], gen: GenerationConfig) -> list[int]:
        """Add committed tokens to ``row`` and apply EOS, stop strings and the length budget."""
        new = new[: row.budget]
        if not gen.ignore_eos:
            for i, tok in enumerate(new):
                if tok in self.tokenizer.eos_ids:
                    new = new[: i + 1]
                    row.done, row.finish_reason = True, "eos"
                    break
        row.tokens.extend(new)
        row.budget -= len(new)
        row.stats.new_tokens += len(new)
        if gen.stop and not row.done:
            text = self.tokenizer.decode(row.new_ids)
            if any(s in text for s in gen.stop):
                row.done, row.finish_reason = True, "stop"
        if row.budget <= 0:
            row.done = True
        return new

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
                raise ParadecError("the prompt is not valid UTF-8 text; pass UTF-8 (e.g. fix the terminal's "
                                   "encoding or the file the prompt came from)") from None
            ids = self.tokenizer.encode(prompt, chat)
        else:
            raise ParadecError(f"a prompt must be a string, token ids or a list of messages, not "
                               f"{type(prompt).__name__}")
        if not ids:
            raise ParadecError("the prompt is empty after tokenization; pass some text")
        limit = self.model.config.context_length
        if len(ids) >= limit:
            raise ParadecError(f"the prompt has {len(ids)} tokens but the model's context is {limit}; "
                               "shorten the prompt")
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
                g.manual_seed(gen.sampling.seed if gen.sampling.seed is not None else
                              int(torch.randint(0, 2**62, ()).item()))
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


def load(model_dir: str | Path, dtype: str | torch.dtype = "bf16", device: str = "cpu",
         drafts: list[str | Path] = (), heads: str | Path | None = None, exact: bool = True,
         quant: str = "none", quant_head: str | None = None, threads: int | None = None,
         warmup: bool = True) -> Engine:
    """Load a local Hugging Face-format Llama/Qwen2/Mistral directory (and draft models for
    ``specinfer``) into an ``Engine``. ``exact`` (default): decode and verification passes use
    shape-invariant numerics, so every lossless method's greedy tokens equal `ar`'s in bf16 too
    (``Transformer.set_exact``); ``False`` trades that for speed at long contexts.
    ``quant``: "none", "int8" or "int4" weight-only linears on the CPU (``models.quant``; a GGUF
    Q4_1 file's blocks map to int4 as they are), the LM head in ``quant_head`` (default: int8
    when quantized). Every method is then lossless against that quantized model. Draft models
    get the same quantization.

    ``threads``: torch's CPU threads (default: torch's own choice, the physical cores).
    ``warmup``: run a few tiny passes (an `ar` step and a verified tree) so the first request does
    not pay for kernel set-up.

    Example: ``paradec.load("zoo/target").generate("import os", max_new_tokens=16)``.
    """
    if threads is not None:
        if threads < 1:
            raise ParadecError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ParadecError(f"unknown dtype {dtype!r}; use bf16 or fp32")
        dtype = DTYPES[dtype]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ParadecError("device=cuda was asked for but no CUDA device is visible; use device=cpu")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ParadecError(f"unknown device {device!r}; use cpu or cuda")
    if quant not in QUANTS or quant_head not in (None, *QUANTS):
        raise ParadecError(f"unknown quant {quant!r} / quant_head {quant_head!r}; use one of {', '.join(QUANTS)}")
    if quant != "none" and not device.startswith("cpu"):
        raise ParadecError(f"quant={quant} uses torch's packed CPU kernels; use device=cpu or quant=none")
    if isinstance(drafts, (str, Path)):  # one draft model, not the characters of its path
        drafts = [drafts]
    model_dir = resolve_model(model_dir)  # a .gguf file -> its cached HF conversion
    model = load_model(model_dir, dtype, device)
    model.set_exact(exact)
    quantize_linears(model, quant, quant_head)
    engine = Engine(model, load_tokenizer(model_dir, model.config.eos_token_ids), model_dir)
    engine.quant = quant
    engine.load_drafts(list(drafts))
    if heads is not None:
        engine.load_heads(heads)
    if warmup:
        engine.warmup()
    return engine

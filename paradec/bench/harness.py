"""``paradec bench``: every method side by side on the same prompts, weights and dtype.

Timing rules: a warm-up run per method is excluded; methods are interleaved per prompt (the
order rotates from prompt to prompt), not run in blocks; with ``lockstep`` (batch 1), the
methods of the default engine are interleaved per step as `paradec demo` runs them
(``bench.lockstep``: one step of each in turn, a method's time its own prefill and steps), the
peers and other formats per prompt around them; each (prompt, method) is timed
``repeats`` times and the median kept; every method generates the same number of new tokens
(EOS ignored unless asked). Speedups follow Spec-Bench: the mean over prompts of the per-prompt
throughput ratio.

A long run resumes: after each prompt group the records so far go to ``OUT/partial.json``; the
same command picks up after the last finished group (ratios are per prompt, so a group timed in
another sitting compares like with like), and results.json replaces the partial file at the end.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from paradec import companions, methods
from paradec.bench.peers import PEERS, RUNTIMES, bench_methods, lossless, method_needs, same_tokens_as, split_method
from paradec.bench.prompts import Prompt, load_prompts
from paradec.bench.records import PARTIAL, portable, record, resume_records, summarize, write_outputs
from paradec.bench.report import machine, write_json
from paradec.bench.runners import Runners, method_options
from paradec.errors import ParadecError
from paradec.parallel.quality import nll, parses

__all__ = ["BenchConfig", "PARTIAL", "bench_methods", "encode_prompts", "method_needs", "run_bench", "write_outputs"]


@dataclass(frozen=True)
class BenchConfig:
    model: str
    methods: tuple[str, ...]
    prompts: str
    out: str
    # what the methods load beside the target, by companion name (``paradec.companions``): a path, or paths
    companions: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    # method options (``methods.option_table``): each goes to the methods that have it
    options: dict[str, object] = field(default_factory=dict)
    twin: str | None = None  # the Seq twin of an ASPD model (seq-twin; NLL reference)
    limit: int | None = None
    per_category: int | None = None
    max_new_tokens: int = 128
    batch_size: int = 1
    temperature: float = 0.0
    repeats: int = 1
    dtype: str = "auto"  # paradec.load's: auto = the format this CPU runs fastest (paradec.cpu)
    device: str = "cpu"
    seed: int = 0
    stop_at_eos: bool = False
    chat: bool = True  # question.jsonl turns through the model's chat template (when it has one)
    first_turn: bool = False  # a conversation's first turn only (MT-bench: no second-turn prompts)
    full_trees: bool = False  # every tree verified in full, never cut by the draft budget (compare drafters)
    oracle_depth: int = 8
    exact: bool = True  # shape-invariant decode numerics (paradec.load's exact)
    quant: str = "auto"  # weight-only quantization of paradec's linears (paradec.load's quant)
    quant_head: str | None = None
    threads: int | None = None  # torch CPU threads (None: torch's default)
    # batch 1: the methods of the default engine decoded one step of each in turn (``bench.lockstep``)
    lockstep: bool = False

    def __post_init__(self) -> None:
        known = bench_methods()
        unknown = [
            m
            for m in self.methods
            if split_method(m)[0] not in known
            or (_peer(m) is not None and "@" in m and _peer(m).runner != "oracle")  # only the oracle takes a format
            or split_method(m)[1] not in RUNTIMES
        ]
        if unknown:
            raise ParadecError(
                f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)} "
                f"(a registered method may end in @{'|@'.join(RUNTIMES[1:])})"
            )
        if any(split_method(m)[1] == "llamacpp" for m in self.methods) and not self.model.endswith(".gguf"):
            raise ParadecError("@llamacpp runs a GGUF file with llama.cpp; pass model=FILE.gguf")
        for m in self.methods:
            base, runtime = split_method(m)
            on_llamacpp = base == "oracle" if base in PEERS else "llamacpp" in methods.get(base).backends
            if runtime == "llamacpp" and not on_llamacpp:  # the oracle's chains verify there too
                raise ParadecError(f"{base} runs on the torch backend only; drop @llamacpp from {m}")
        if any("gguf" in method_needs(m) for m in self.methods) and not self.model.endswith(".gguf"):
            raise ParadecError("llamacpp runs a GGUF file; pass model=FILE.gguf")
        if self.lockstep and self.batch_size != 1:
            raise ParadecError("--lockstep steps one prompt's methods in turn; use it with --batch-size 1")
        if min(self.batch_size, self.repeats, self.max_new_tokens, self.oracle_depth) < 1:
            raise ParadecError("batch_size=, repeats=, max_new_tokens= and oracle_depth= must be >= 1")
        table = methods.option_table()
        unknown = [k for k in self.options if k not in table]
        if unknown:
            raise ParadecError(f"unknown option {unknown[0]}=; the options are: {', '.join(table)}")
        for base in {split_method(m)[0] for m in self.methods} - set(PEERS):  # checked before any model loads
            methods.generation_config(base, **method_options(base, self.options))
        for m in self.methods:
            needs = method_needs(m)
            files = [c for c in companions.loadable() if c.name in needs and not self.companions.get(c.name)]
            if files:
                raise ParadecError(f"{m} needs {files[0].summary}; pass {files[0].name}=PATH")
            if "twin" in needs and not self.twin:
                raise ParadecError(f"{m} needs the Seq twin of the ASPD model; pass twin=PATH")
            base = split_method(m)[0]
            if base not in PEERS and self.temperature > 0 and not methods.get(base).acceptors:
                raise ParadecError(f"{m} decodes greedily; set temperature=0")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    prompts = load_prompts(cfg.prompts, cfg.limit, cfg.per_category)
    config = {k: portable(v) for k, v in cfg.__dict__.items()}
    partial = Path(cfg.out) / PARTIAL
    records, done = resume_records(partial, config)
    runners = Runners(cfg)
    methods = list(cfg.methods)
    if cfg.batch_size > 1:  # transformers' assisted decoding and prompt lookup: batch 1 only
        methods = [m for m in methods if not (_peer(m) and _peer(m).batch1_only)]
    if cfg.temperature > 0:  # the oracle knows greedy text only
        methods = [m for m in methods if not (_peer(m) and _peer(m).greedy_only)]
    limit = runners.engine.model.config.context_length - cfg.max_new_tokens - 72  # room for a tree
    fits = [(p, ids) for p, ids in encode_prompts(runners.engine, prompts, cfg) if len(ids) <= limit]
    skipped = [p.id for p in prompts if p.id not in {q.id for q, _ in fits}]
    if not fits:
        raise ParadecError(f"no prompt fits the model's context with {cfg.max_new_tokens} new tokens")
    prompts = [p for p, _ in fits]
    groups = [prompts[i : i + cfg.batch_size] for i in range(0, len(prompts), cfg.batch_size)]
    flat = [ids for _, ids in fits]
    encoded = [flat[i : i + cfg.batch_size] for i in range(0, len(flat), cfg.batch_size)]
    for m in methods:  # warm-up, excluded
        runners.run(m, [encoded[0][0]], [[0] * cfg.max_new_tokens])
    bar = tqdm(
        total=len(groups) * len(methods) * cfg.repeats,
        initial=done * len(methods) * cfg.repeats,
        desc="bench",
        disable=not progress,
    )
    for gi, (group, batch) in enumerate(zip(groups, encoded)):
        if gi < done:
            continue
        order = methods[gi % len(methods) :] + methods[: gi % len(methods)]  # rotates prompt by prompt
        timings, references = _time_group(runners, cfg, batch, order, bar)
        records += _group_records(runners, cfg, methods, group, batch, timings, references)
        write_json({"config": config, "groups_done": gi + 1, "records": records}, partial)
    bar.close()
    summary = summarize(records, methods)
    formats = {q: e.format.name for q, e in runners.engines.items()}  # what "auto" resolved to on this CPU
    return {
        "config": config,
        "machine": machine(),
        "formats": formats,
        "peak_rss_mb": round(_peak_mb(), 1),
        "skipped_too_long": skipped,
        "records": records,
        "summary": summary,
    }


def _peer(method: str):
    """The bench-only peer ``method`` names (``oracle@bf16``: the oracle), else None."""
    return PEERS.get(split_method(method)[0])


def _time_group(runners: Runners, cfg: BenchConfig, batch: list[list[int]], order: list[str], bar) -> tuple:
    """Every method on one prompt group, ``cfg.repeats`` times in ``order``; first `ar`'s tokens
    per weight format (the identity check's reference, the oracle's knowledge). -> ({method:
    [(seconds, tokens, stats)]}, {format: `ar`'s tokens})."""
    references = {}
    if cfg.temperature == 0 and any(lossless(m) for m in order):  # ASPD's models decode their own text
        for q in runners.engines:
            references[q], _ = runners.run(f"ar@{q}", batch, None)
    timings: dict[str, list] = {m: [] for m in order}
    stepped = [m for m in order if runners.steppable(m)] if cfg.lockstep else []
    for _ in range(cfg.repeats):
        if len(stepped) > 1:
            for m, (seconds, tokens, stats) in runners.lockstep(stepped, batch).items():
                timings[m].append((seconds, tokens, stats))
                bar.update(1)
        for m in order:
            if len(stepped) > 1 and m in stepped:
                continue
            t = time.perf_counter()
            ref = references.get(split_method(m, cfg.quant)[1], references.get(cfg.quant))
            tokens, stats = runners.run(m, batch, ref)
            timings[m].append((time.perf_counter() - t, tokens, stats))
            bar.update(1)
    return timings, references


def _group_records(runners: Runners, cfg: BenchConfig, methods, group, batch, timings, references) -> list[dict]:
    """One record per (prompt, method) of a group: its median run, identity, and text quality
    against the Seq twin and the base where an ASPD model runs."""
    out = []
    for m in methods:
        wall, tokens, stats = sorted(timings[m], key=lambda x: x[0])[len(timings[m]) // 2]
        refs = references.get(split_method(m, cfg.quant)[1]) or [None] * len(group)
        other = same_tokens_as(m)
        same = other and other in timings and sorted(timings[other], key=lambda x: x[0])[0][1]
        for k, (p, ids, toks, st, ref) in enumerate(zip(group, batch, tokens, stats, refs)):
            rec = record(p, m, wall, len(batch), toks, st, ref)
            if same:
                rec[f"identical_to_{other}"] = toks == same[k]
            if runners.twin is not None and (m == "ar" or not lossless(m)):  # quality vs the Seq twin
                rec["nll_twin"] = nll(runners.twin.model, ids, toks)
                rec["parses"] = parses(runners.engine.tokenizer.decode(toks))
            if runners.base is not None and (m == "ar" or not lossless(m)):  # ... and vs the base model
                rec["nll_base"] = nll(runners.base.model, ids, toks)
            out.append(rec)
    return out


def encode_prompts(engine, prompts: list[Prompt], cfg: BenchConfig) -> list[tuple[Prompt, list[int]]]:
    """Token ids per prompt. Conversations (question.jsonl) go through the chat template when
    ``cfg.chat`` and the model has one; a later turn follows the model's own earlier answers
    (greedy ``ar``, up to ``max_new_tokens``, ended by EOS), as Spec-Bench runs MT-bench, and is
    a prompt of its own (id ``QID/turn2``)."""
    tok = engine.tokenizer
    out = []
    for p in prompts:
        if not (cfg.chat and p.turns and tok.has_chat_template):
            out.append((p, tok.encode(p.text)))
            continue
        messages: list[dict] = []
        turns = p.turns[:1] if cfg.first_turn else p.turns
        for t, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            ids = tok.encode_messages(messages)
            out.append((p if t == 0 else Prompt(f"{p.id}/turn{t + 1}", p.category, turn, p.turns), ids))
            if t + 1 < len(turns):  # a later turn follows this answer (--first-turn: none)
                answer = engine.generate(ids, max_new_tokens=cfg.max_new_tokens).text
                messages.append({"role": "assistant", "content": answer})
    return out

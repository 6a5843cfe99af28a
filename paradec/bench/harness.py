"""``paradec bench``: every method side by side on the same prompts, weights and dtype.

Timing rules: a warm-up run per method is excluded; methods are interleaved per prompt (the
order rotates from prompt to prompt), not run in blocks; each (prompt, method) is timed
``repeats`` times and the median kept; every method generates the same number of new tokens
(EOS ignored unless asked). Speedups follow Spec-Bench: the mean over prompts of the per-prompt
throughput ratio.

A long run resumes: after each prompt group the records so far go to ``OUT/partial.json``; the
same command picks up after the last finished group (ratios are per prompt, so a group timed in
another sitting compares like with like), and results.json replaces the partial file at the end.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from paradec import methods
from paradec.bench.peers import HFPeer, LlamaCppPeer
from paradec.bench.prompts import Prompt, load_prompts
from paradec.bench.report import bench_plots, machine, markdown_table, write_json
from paradec.config import MAX_TREE_NODES
from paradec.draft.oracle import OracleDrafter
from paradec.engine import load
from paradec.errors import ParadecError
from paradec.models.adapter import is_adapter, read_adapter
from paradec.models.gguf import resolve_model
from paradec.models.quant import QUANTS
from paradec.parallel.quality import nll, parses

# Peers measured next to paradec's registered methods (paradec.methods), with what each needs
# loaded: transformers' own decoding and llama.cpp on the same GGUF file (bench/peers.py), an
# oracle drafter (the reference continuation: the acceptance ceiling of a depth-`oracle_depth`
# chain), the ASPD model's Seq twin (`ar`) and its base model (`ar`, `base-ar`).
PEERS = {
    "oracle": (),
    "hf": (),
    "hf-assisted": ("drafts",),
    "hf-pld": (),
    "seq-twin": ("aspd_model", "twin"),
    "base-ar": ("aspd_model",),
    "llamacpp": ("gguf",),
    "llamacpp-pld": ("gguf",),
}
HF = ("hf", "hf-assisted", "hf-pld")
# methods lossless with respect to another method rather than to `ar` (checked when both run)
SAME_TOKENS_AS = {"aspd+spec": "aspd"}
LLAMACPP = ("llamacpp", "llamacpp-pld")
# what may follow a method's "@": a weight format of paradec's torch runtime, or llama.cpp as the
# runtime of the target's passes (models.llamacpp: ar@llamacpp)
RUNTIMES = ("auto", *QUANTS, "llamacpp")


def bench_methods() -> tuple[str, ...]:
    """Every name ``--methods`` takes: the registered methods, then the peers. A registered
    method may carry a weight format, ``ar@int4``: it then runs on the model loaded with that
    ``quant`` (compared with ``ar@int4``), next to the others in one interleaved run."""
    return (*methods.names(), *PEERS)


def split_method(name: str, default_quant: str = "none") -> tuple[str, str]:
    """ "ar@int4" -> ("ar", "int4"); "ar" -> ("ar", default_quant)."""
    base, _, quant = name.partition("@")
    return base, quant or default_quant


def _lossless(name: str) -> bool:
    """Its tokens should equal the target's `ar` (an ASPD model and its twin decode another model)."""
    name = split_method(name)[0]
    return name in PEERS and "aspd_model" not in PEERS[name] or name not in PEERS and methods.get(name).lossless


def _own_loop(name: str) -> bool:
    name = split_method(name)[0]
    return name not in PEERS and methods.get(name).decode is not None


def _fixed_tree(name: str) -> bool:
    """Whether method ``name`` verifies a tree of ``tree_nodes`` (Medusa's, EAGLE's; not the cost model's)."""
    m = methods.get(name)
    return bool({"heads", "eagle"} & set(m.needs)) and m.decode is None and not m.options.get("dynamic")


def method_needs(name: str) -> set[str]:
    name = split_method(name)[0]
    if name in PEERS:
        return set(PEERS[name])
    return set(methods.get(name).needs)


@dataclass(frozen=True)
class BenchConfig:
    model: str
    methods: tuple[str, ...]
    prompts: str
    out: str
    drafts: tuple[str, ...] = ()
    heads: str | None = None
    eagle: str | None = None  # EAGLE draft head (eagle, eagle+propd, eagle+ngram)
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
    expansion: tuple[int, ...] | None = None  # specinfer's tree (None: SpecConfig's default)
    tree_nodes: int | None = None  # fixed-size trees (medusa, eagle) verify this many nodes (None: each method's own)
    oracle_depth: int = 8
    exact: bool = True  # shape-invariant decode numerics (paradec.load's exact)
    quant: str = "auto"  # weight-only quantization of paradec's linears (paradec.load's quant)
    quant_head: str | None = None
    threads: int | None = None  # torch CPU threads (None: torch's default)

    def __post_init__(self) -> None:
        known = bench_methods()
        unknown = [
            m
            for m in self.methods
            if split_method(m)[0] not in known
            or (split_method(m)[0] in PEERS and "@" in m)
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
            if runtime == "llamacpp" and base not in PEERS and "llamacpp" not in methods.get(base).backends:
                raise ParadecError(f"{base} runs on the torch backend only; drop @llamacpp from {m}")
        if any(m in LLAMACPP for m in self.methods) and not self.model.endswith(".gguf"):
            raise ParadecError("llamacpp runs a GGUF file; pass model=FILE.gguf")
        if self.batch_size < 1 or self.repeats < 1 or self.max_new_tokens < 1:
            raise ParadecError("batch_size=, repeats= and max_new_tokens= must be >= 1")
        if self.tree_nodes is not None and not 1 <= self.tree_nodes <= MAX_TREE_NODES:
            raise ParadecError(f"tree_nodes= must be in [1, {MAX_TREE_NODES}], got {self.tree_nodes}")
        for m in self.methods:
            needs = method_needs(m)
            if "drafts" in needs and not self.drafts:
                raise ParadecError(f"{m} needs a draft model; pass drafts=PATH")
            if "heads" in needs and not self.heads:
                raise ParadecError(f"{m} needs Medusa heads; pass heads=PATH")
            if "eagle" in needs and not self.eagle:
                raise ParadecError(f"{m} needs an EAGLE draft head; pass eagle=PATH")
            if "twin" in needs and not self.twin:
                raise ParadecError(f"{m} needs the Seq twin of the ASPD model; pass twin=PATH")
            base = split_method(m)[0]
            if base not in PEERS and self.temperature > 0 and not methods.get(base).acceptors:
                raise ParadecError(f"{m} decodes greedily; set temperature=0")


class Runners:
    """One callable per method: token-id prompts -> (token ids per prompt, stats per prompt)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        model_dir = resolve_model(cfg.model)  # a .gguf file: its cached HF conversion (transformers loads that)
        quants = dict.fromkeys([cfg.quant, *(split_method(m, cfg.quant)[1] for m in cfg.methods)])
        # --tree-nodes N compares drafters at one fixed tree size: the draft budget must not cut them
        self.engines = {
            q: load(
                model_dir,
                dtype=cfg.dtype,
                device=cfg.device,
                drafts=list(cfg.drafts),
                heads=cfg.heads,
                eagle=cfg.eagle,
                exact=cfg.exact,
                quant=q,
                quant_head=cfg.quant_head,
                threads=cfg.threads,
                batch_budget=cfg.tree_nodes is None,
                backend="torch",
            )
            for q in quants
            if q != "llamacpp"
        }
        if "llamacpp" in quants:  # llama.cpp's kernels on the GGUF file as it is
            self.engines["llamacpp"] = load(
                cfg.model, threads=cfg.threads, batch_budget=cfg.tree_nodes is None, backend="llamacpp"
            )
        self.engine = self.engines[cfg.quant]
        self.twin = load(cfg.twin, dtype=cfg.dtype, device=cfg.device) if cfg.twin else None
        self.base = None  # an ASPD adapter's base model: `base-ar`, and the NLL reference nll_base
        if is_adapter(model_dir) and any("aspd_model" in method_needs(m) for m in cfg.methods):
            self.base = load(read_adapter(model_dir)[1], dtype=cfg.dtype, device=cfg.device)
        limits = dict(max_new_tokens=cfg.max_new_tokens, stop_at_eos=cfg.stop_at_eos)
        self.llamacpp = None
        if any(m in LLAMACPP for m in cfg.methods):
            self.llamacpp = LlamaCppPeer(
                cfg.model,
                [m for m in cfg.methods if m in LLAMACPP],
                cfg.threads or torch.get_num_threads(),
                cfg.seed,
                eos=self.engine.tokenizer.eos_ids,
                **limits,
            )
        self.hf = None
        if any(m in HF for m in cfg.methods):
            self.hf = HFPeer(
                model_dir,
                cfg.drafts[0] if "hf-assisted" in cfg.methods else None,
                self.engine.format.dtype,
                cfg.device,
                temperature=cfg.temperature,
                **limits,
            )

    def options(self) -> dict:
        c = self.cfg
        return dict(
            max_new_tokens=c.max_new_tokens, temperature=c.temperature, seed=c.seed, ignore_eos=not c.stop_at_eos
        )

    def run(self, method: str, batch: list[list[int]], reference: list[list[int]] | None):
        if method == "oracle":
            vocab = self.engine.model.config.vocab_size
            drafter = OracleDrafter([p + r for p, r in zip(batch, reference)], (1,) * self.cfg.oracle_depth, 1.0, vocab)
            out = self.engine.generate(batch, drafter=drafter, **self.options())
            return [g.token_ids for g in out], [g.stats for g in out]
        if method in LLAMACPP:
            return self.llamacpp.run(method, batch), [None] * len(batch)
        if method not in PEERS:
            base, quant = split_method(method, self.cfg.quant)
            engine = self.engines[quant]
            opts = {}
            if self.cfg.expansion is not None and "drafts" in method_needs(method):
                opts["expansion"] = self.cfg.expansion
            if self.cfg.tree_nodes is not None and _fixed_tree(base):
                opts["tree_nodes"] = self.cfg.tree_nodes
            out = engine.generate(batch, method=base, **opts, **self.options())
            if _own_loop(method):  # its own text (ASPD: markup is overhead, not output)
                return [engine.tokenizer.encode(g.text) for g in out], [g.stats for g in out]
            return [g.token_ids for g in out], [g.stats for g in out]
        if method in ("seq-twin", "base-ar"):
            if method == "base-ar" and self.base is None:
                raise ParadecError("base-ar runs an ASPD adapter's base model; pass model=ADAPTER_DIR")
            out = (self.twin if method == "seq-twin" else self.base).generate(batch, **self.options())
            return [g.token_ids for g in out], [g.stats for g in out]
        return self.hf.run(method, batch), [None] * len(batch)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    prompts = load_prompts(cfg.prompts, cfg.limit, cfg.per_category)
    config = {k: _portable(v) for k, v in cfg.__dict__.items()}
    partial = Path(cfg.out) / PARTIAL
    records, done = resume_records(partial, config)
    runners = Runners(cfg)
    methods = list(cfg.methods)
    if cfg.batch_size > 1 and any(m in ("hf-assisted", "hf-pld") for m in methods):
        methods = [m for m in methods if m not in ("hf-assisted", "hf-pld")]  # transformers: batch 1 only
    if cfg.temperature > 0:
        methods = [m for m in methods if m != "oracle"]  # the oracle knows greedy text only
    tok = runners.engine.tokenizer
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
        references = {}
        needed = any(_lossless(m) for m in methods)  # ASPD's models decode their own text: no `ar` to match
        if (
            cfg.temperature == 0 and needed
        ):  # `ar`'s tokens per weight format: the oracle's knowledge and the identity check
            for q in runners.engines:
                references[q], _ = runners.run(f"ar@{q}", batch, None)
        reference = references.get(cfg.quant)
        order = methods[gi % len(methods) :] + methods[: gi % len(methods)]
        timings: dict[str, list] = {m: [] for m in methods}
        for _ in range(cfg.repeats):
            for m in order:
                t = time.perf_counter()
                tokens, stats = runners.run(m, batch, references.get(split_method(m, cfg.quant)[1], reference))
                timings[m].append((time.perf_counter() - t, tokens, stats))
                bar.update(1)
        for m in methods:
            wall, tokens, stats = sorted(timings[m], key=lambda x: x[0])[len(timings[m]) // 2]
            refs = references.get(split_method(m, cfg.quant)[1]) or [None] * len(group)
            same = SAME_TOKENS_AS.get(split_method(m)[0])
            same = same and same in timings and sorted(timings[same], key=lambda x: x[0])[0][1]
            for k, (p, ids, toks, st, ref) in enumerate(zip(group, batch, tokens, stats, refs)):
                records.append(_record(p, m, wall, len(batch), toks, st, ref))
                if same:
                    records[-1][f"identical_to_{SAME_TOKENS_AS[split_method(m)[0]]}"] = toks == same[k]
                if runners.twin is not None and (m == "ar" or not _lossless(m)):  # quality vs the Seq twin
                    records[-1]["nll_twin"] = nll(runners.twin.model, ids, toks)
                    records[-1]["parses"] = parses(tok.decode(toks))
                if runners.base is not None and (m == "ar" or not _lossless(m)):  # ... and vs the base model
                    records[-1]["nll_base"] = nll(runners.base.model, ids, toks)
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


PARTIAL = "partial.json"  # an unfinished run's records, in its out dir


def resume_records(path: Path, config: dict) -> tuple[list[dict], int]:
    """(records, prompt groups done) of the unfinished run at ``path``; ([], 0) if there is none.
    An unfinished run of another configuration is refused rather than mixed in or overwritten."""
    if not path.exists():
        return [], 0
    try:
        state = json.loads(path.read_text())
        same = json.dumps(state["config"], sort_keys=True) == json.dumps(config, sort_keys=True)
        records, done = state["records"], int(state["groups_done"])
    except (ValueError, KeyError, TypeError):
        raise ParadecError(f"{path} is not a paradec bench checkpoint; delete it or pass another --out") from None
    if not same:
        raise ParadecError(
            f"{path} holds an unfinished bench of another configuration; rerun that command to "
            f"finish it, or delete the file or pass another --out"
        )
    return records, done


def _portable(value):
    """A config value as results.json records it: paths under the working directory relative to
    it, installed files by name, so results carry no machine's paths."""
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    if not isinstance(value, str) or not Path(value).is_absolute():
        return value
    path = Path(value)
    if path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd()))
    return path.name


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


def _record(p: Prompt, method: str, wall: float, batch: int, tokens: list[int], stats, reference) -> dict:
    rec = {
        "prompt_id": p.id,
        "category": p.category,
        "method": method,
        "batch": batch,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "tokens_per_s": len(tokens) / wall,
        "identical_to_ar": None if reference is None or not _lossless(method) else tokens == reference,
    }
    for key in ("degree_of_parallelism", "well_formed", "acceptance"):
        if stats is not None and stats.extra.get(key) is not None:
            rec[key] = float(stats.extra[key])
    if stats is not None and "groups" in stats.extra:  # ASPD: PPD = share of answers with a parallel group
        rec["ppd"] = float(stats.extra["groups"] > 0)
    if stats is not None and stats.extra.get("groups"):
        rec["branches_per_group"] = stats.extra["branches"] / stats.extra["groups"]
    if stats is not None and _own_loop(method):  # no tree (ASPD): tau = marked tokens per pass
        rec.update(tau=stats.tau, steps=stats.steps, ms_per_step=1000 * wall / max(1, stats.steps))
    elif stats is not None:
        rec.update(
            tau=stats.tau,
            steps=stats.steps,
            accept_per_depth=stats.accept_per_depth,
            nodes_per_step=stats.nodes / max(1, stats.steps),
            verified_per_step=stats.verified / max(1, stats.steps),
            target_share=min(1.0, stats.target_s / wall),
            ms_per_step=1000 * wall / max(1, stats.steps),
        )
    return rec


def summarize(records: list[dict], methods: list[str]) -> list[dict]:
    """Per method and per category (plus 'all'): means and Spec-Bench speedups."""
    by = {(r["prompt_id"], r["method"]): r for r in records}
    cats = sorted({r["category"] for r in records})
    out = []
    for cat in ["all", *cats]:
        for m in methods:
            mine = [r for r in records if r["method"] == m and cat in ("all", r["category"])]
            if not mine:
                continue
            row = {
                "category": cat,
                "method": m,
                "prompts": len(mine),
                "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in mine),
            }
            for base in ("ar", "hf", *(["seq-twin"] if "seq-twin" in methods else [])):
                ratios = [
                    r["tokens_per_s"] / by[(r["prompt_id"], base)]["tokens_per_s"]
                    for r in mine
                    if (r["prompt_id"], base) in by
                ]
                row[f"speedup_vs_{base}"] = statistics.mean(ratios) if ratios else None
            for key in (
                "tau",
                "nodes_per_step",
                "verified_per_step",
                "target_share",
                "ms_per_step",
                "nll_twin",
                "nll_base",
                "parses",
                "ppd",
                "degree_of_parallelism",
                "branches_per_group",
                "well_formed",
                "acceptance",
                "identical_to_aspd",
            ):
                vals = [r[key] for r in mine if r.get(key) is not None]
                row[key] = statistics.mean(vals) if vals else None
            depth = [r["accept_per_depth"] for r in mine if r.get("accept_per_depth")]
            row["accept_per_depth"] = [
                statistics.mean(d[i] for d in depth if len(d) > i)
                for i in range(max((len(d) for d in depth), default=0))
            ]
            ident = [r["identical_to_ar"] for r in mine if r["identical_to_ar"] is not None]
            row["identical_to_ar"] = sum(ident) / len(ident) if ident else None
            out.append(row)
    return out


COLUMNS = [
    "category",
    "method",
    "prompts",
    "tokens_per_s",
    "speedup_vs_ar",
    "speedup_vs_hf",
    "tau",
    "nodes_per_step",
    "verified_per_step",
    "ms_per_step",
    "target_share",
    "identical_to_ar",
]


def write_outputs(result: dict, out_dir: str | Path) -> str:
    out_dir = Path(out_dir)
    rows = [r for r in result["summary"] if r["category"] == "all"]
    cats = [r for r in result["summary"] if r["category"] != "all"]
    columns = COLUMNS + [
        c
        for c in (
            "speedup_vs_seq-twin",
            "ppd",
            "degree_of_parallelism",
            "branches_per_group",
            "nll_base",
            "nll_twin",
            "well_formed",
            "acceptance",
            "identical_to_aspd",
            "parses",
        )
        if any(r.get(c) is not None for r in rows)
    ]
    table = markdown_table(rows, columns)
    if len({r["category"] for r in cats}) > 1:
        table += "\n\nPer category:\n\n" + markdown_table(cats, columns)
    write_json(result, out_dir / "results.json")
    (out_dir / "results.md").write_text(table + "\n")
    bench_plots(result, out_dir)
    (out_dir / PARTIAL).unlink(missing_ok=True)
    return table

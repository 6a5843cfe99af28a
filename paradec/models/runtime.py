"""Which runtime runs the target: the checks and the measured choice behind ``load(backend=...)``.

llama.cpp's kernels (``models.llamacpp``) run a GGUF file as it is: `ar`, and the chain drafters
where its batches are exact; paradec's torch runtime runs every method. ``load`` asks
``llamacpp_runs`` (does llama.cpp's build run on this CPU without killing the process),
``check_llamacpp`` (was backend=llamacpp asked for something only torch runs), ``batch_exactness``
(which of this build's batches give each token its single-token logits, bit for bit) and ``llamacpp_choice``
(do llama.cpp's measured passes beat torch's).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from paradec.cpu import FormatChoice, ParadecWarning, cpu_info
from paradec.cpu.timing import _write_json
from paradec.errors import ParadecError
from paradec.models.gguf import file_digest, is_gguf, paradec_home
from paradec.models.llamacpp import LlamaCppModel, build_id, crashes, llamacpp_cost

# `auto` runs on llama.cpp's kernels (as `ar`) when their `ar` step is this many times cheaper than
# torch's: the most auto's drafters gained over `ar` in benchmarks/README.md is below it
AUTO_MARGIN = 2.0
# chain lengths (root included) the exactness probe verifies: every one a drafter proposes by
# default (up to 17), then the longest a tree may be (MAX_TREE_NODES + the root)
PROBE_WIDTHS = (*range(2, 18), 33, 65)
# contexts it verifies them at: one KV page, and past it (the default build's chains were off at
# 300; llama.cpp's prompt pass is slow here, ~150 tokens/s on 2 cores, so the probe stays short)
PROBE_CONTEXTS = (40, 300)
PROBE_ROWS = (2, 3, 4, 8, 16)  # one-token rows in one batch (a server's `ar` pass)
# how to get a build whose chains are exact: llamafile's GEMM (``GGML_LLAMAFILE``) takes other
# accumulation orders for several queries of one sequence than ggml's one-query dot products
EXACT_BUILD = (
    "reinstall llama-cpp-python without llamafile's GEMM: CMAKE_ARGS='-DGGML_LLAMAFILE=OFF' "
    "pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python"
)


def llamacpp_runs(source: Path, asked: str, threads: int | None) -> bool:
    """Whether llama.cpp's kernels run on this CPU without killing the process (``llamacpp.crashes``);
    if not: backend=llamacpp is an error with the fix, auto a warning and torch."""
    crash = crashes(source, threads or torch.get_num_threads(), paradec_home())
    if crash is not None and asked == "llamacpp":
        raise ParadecError(crash)
    if crash is not None:
        warnings.warn(ParadecWarning(f"{crash}; running on torch"), stacklevel=3)
    return crash is None


def check_llamacpp(source: Path, torch_only: list[str]) -> None:
    """backend=llamacpp asked for: a GGUF file, and nothing only torch runs."""
    if not is_gguf(source):
        raise ParadecError("the llamacpp backend runs a GGUF file; pass model=FILE.gguf, or backend=torch")
    if torch_only:
        raise ParadecError(
            f"the llamacpp backend cannot take {', '.join(torch_only)} (llama.cpp runs the GGUF's own "
            "format on the CPU: `ar` and the lookups, with no draft models or heads); drop them or use backend=torch"
        )


def llamacpp_choice(lc: LlamaCppModel, choice: FormatChoice, asked: str, margin: float = 1.0) -> FormatChoice | None:
    """llama.cpp's format record, its measured curve and why it runs; None: auto, and torch's
    best format is faster on this CPU (``margin``: by more than this factor, its drafters' room)."""
    lc_cost, lc_path, _ = llamacpp_cost(lc, paradec_home())
    if asked == "auto" and not lc_cost.predict(1) * margin < choice.cost.predict(1):
        return None
    reason = "asked for (backend=llamacpp)"
    if asked == "auto":
        ms = lc_cost.predict(1) * 1e3, choice.cost.predict(1) * 1e3
        than = f"{margin:g}x less than" if margin != 1.0 else "<"
        reason = f"auto: llama.cpp's `ar` step {ms[0]:.0f} ms {than} torch {choice.name}'s {ms[1]:.0f} ms on this CPU"
    against = choice.cost if asked == "auto" else None
    return replace(
        choice, name="gguf", quant="gguf", cost=lc_cost, reason=reason, profile_path=lc_path, against=against
    )


def batch_exactness(model: LlamaCppModel, home: Path) -> tuple[bool, int]:
    """What this llama.cpp build computes exactly, bit for bit, on this GGUF file -> (chains, rows):
    - chains: W tokens of one sequence in one batch give the logits of W single-token passes
      (`ar`), for every W in PROBE_WIDTHS at every context in PROBE_CONTEXTS, and two rows'
      chains in one batch each row's alone. Then a chain drafter's greedy output is `ar`'s there;
    - rows: the most one-token rows (of PROBE_ROWS) a batch may hold with each row's logits its
      own alone (the server's `ar` batch; larger passes are decoded in several batches).
    Measured once per CPU signature, build and file (~10 s on the AMX Xeon), cached under ``home/profiles``; sets
    ``model.exact_chains`` and ``model.exact_rows``."""
    path = home / "profiles" / f"{cpu_info().key()}-llamacpp-exact-{build_id()}-{file_digest(model.path)}.json"
    try:
        raw = json.loads(path.read_text())
        model.exact_chains, model.exact_rows = bool(raw["chains"]), int(raw["rows"])
        return model.exact_chains, model.exact_rows
    except (OSError, ValueError, KeyError, TypeError):
        pass
    model.exact_rows = _rows_exact(model)
    model.exact_chains = model.exact_rows >= 2 and all(
        _chains_equal(model, context, two_rows=i == 0) for i, context in enumerate(PROBE_CONTEXTS)
    )
    record = {"gguf": model.path.name, "chains": model.exact_chains, "rows": model.exact_rows}
    _write_json(path, {"cpu": asdict(cpu_info()), **record})
    return model.exact_chains, model.exact_rows


def _rows_exact(model: LlamaCppModel) -> int:
    """The most one-token rows of PROBE_ROWS whose batch gives each row its logits alone (1: none)."""
    n = max(PROBE_ROWS)
    cache = model.new_cache(n, 64)
    prompts = [_probe_prompt(model, 8, salt=r) for r in range(n)]
    model.prefill(prompts, cache)
    ctx = cache.ctx
    alone = torch.cat([ctx.decode([(p[-1], 7, cache.seqs[r], True)]) for r, p in enumerate(prompts)])
    exact = 1
    for rows in PROBE_ROWS:
        for r in range(n):
            model.lib.llama_memory_seq_rm(ctx.memory, cache.seqs[r], 7, -1)
        batched = ctx.decode([(p[-1], 7, cache.seqs[r], True) for r, p in enumerate(prompts[:rows])])
        if not torch.equal(batched, alone[:rows]):
            break
        exact = rows
    return exact


def _chains_equal(model: LlamaCppModel, context: int, two_rows: bool) -> bool:
    """Chains of PROBE_WIDTHS after ``context`` tokens against single-token passes (``two_rows``:
    and two rows' chains in one batch)."""
    longest = max(PROBE_WIDTHS)
    cache = model.new_cache(2, context + longest + 1)
    prompt = _probe_prompt(model, context)
    model.prefill([prompt, prompt] if two_rows else [prompt, prompt[-1:]], cache)
    ctx, seqs, at = cache.ctx, cache.seqs, context - 1  # at: the root's position
    chain, single = [prompt[-1]], []  # `ar`: one token a pass, each the last one's argmax
    for k in range(longest):
        single.append(ctx.decode([(chain[-1], at + k, seqs[0], True)])[0])
        chain.append(int(single[-1].argmax()))
    reference = torch.stack(single)  # [longest, vocab]

    def batched(widths: tuple[int, ...]) -> torch.Tensor:
        for seq in seqs:
            model.lib.llama_memory_seq_rm(ctx.memory, seq, at, -1)
        return ctx.decode([(chain[j], at + j, seqs[r], True) for r, w in enumerate(widths) for j in range(w)])

    if not all(torch.equal(batched((w,)), reference[:w]) for w in PROBE_WIDTHS):
        return False
    return not two_rows or torch.equal(batched((5, 3)), torch.cat([reference[:5], reference[:3]]))


def _probe_prompt(model: LlamaCppModel, n: int, salt: int = 0) -> list[int]:
    """``n`` spread-out token ids (no special tokens: ids from 100), a different text per ``salt``."""
    return [(i * 7919 + salt * 104729) % (model.config.vocab_size - 200) + 100 for i in range(n)]

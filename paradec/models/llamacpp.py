"""llama.cpp as the target's runtime: the same GGUF file run by llama.cpp's own CPU kernels
(tuned for AVX2, AVX-512, AMX and NEON; every GGUF quantization as it is), through
llama-cpp-python's low-level API (an optional extra: ``pip install -e '.[llamacpp]'``).

It is a second implementation of what the scheduler asks of a target (``backend = "llamacpp"``):

    new_cache(capacity, max_len)  -> LlamaCppCache: a cache row is a llama.cpp sequence
    prefill(prompts, cache)       -> every token but the root of each row into its sequence
    verify(trees, cache)          -> logits [batch, width, vocab] of one llama.cpp batch

It runs `ar`, and the methods whose drafts are chains (``methods.Method.exact_chains_only``) where
this build verifies a chain exactly (``runtime.batch_exactness``, measured at load). What was measured
on the bundled SmolLM2 Q4_1 GGUF (llama-cpp-python 0.3.36; ``benchmarks/llamacpp_invariance.py``):

- with llamafile's GEMM in the build (``GGML_LLAMAFILE``, on by default), a chain of 2-16 tokens of
  one sequence in one batch does NOT give the logits of 2-16 single-token passes (off by 0.3-0.9
  without flash attention at every context; with it, from 300 tokens): the attention's f16
  products take llamafile's GEMM for several queries and ggml's dot products for one. Built
  without it (``-DGGML_LLAMAFILE=OFF``; AVX-512 Xeon), every chain of 2-16 at contexts 100-700 is
  bit-equal to its single-token passes, and so drafts verified there leave `ar`'s text unchanged;
- one token in each of 4 sequences (the server's `ar` batch) gives each row its single-token
  logits bit for bit **without** flash attention (contexts of 100-700), and not with it (off by
  0.6-0.8 from 300 tokens: one query's attention splits the cache across threads past 512
  cells). So flash attention is off, and ggml's tiled K-quant GEMM (taken from 8 rows a batch)
  too (``GGML_CPU_TILED_MM=0``). On a Q4_K_M file (repacked weights), 2-3 rows were exact and 4
  were not (a GEMM from 4 rows): a pass is decoded in batches of at most ``exact_rows`` rows,
  so a row's tokens never depend on the batch.

Each row has its own KV stream (``kv_unified`` off). A pass writes each row's root; the commit
keeps it (``seq_rm`` of anything past the committed length).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from paradec.config import ModelConfig
from paradec.cpu import PROFILE_VERSION, WIDTHS, PassCost, cpu_info
from paradec.cpu.timing import BUSY_CORES, CONTEXT, OthersWatch, _curve, _write_json
from paradec.errors import ParadecError
from paradec.models.gguf import file_digest
from paradec.tree import TokenTree

BACKENDS = ("auto", "torch", "llamacpp")  # what ``paradec.load(backend=...)`` takes
BATCH = 512  # tokens per llama_decode call (a longer prefill is cut into pieces of this)
INSTALL = (  # without llamafile's GEMM, this build verifies drafted chains exactly (module docstring)
    "CMAKE_ARGS='-DGGML_LLAMAFILE=OFF' pip install -e '.[llamacpp]' "
    "(it builds llama.cpp from source, ~7-40 minutes on 2 cores)"
)


def available() -> bool:
    """Whether llama-cpp-python can be imported here."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


# a 16-token and a 1-token pass in a child process: the multi-row and one-row kernels
PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=64, verbose=False)
llm.eval(list(range(1, 17)))
llm.eval([17])
"""
# the build that ran on that Xeon: AVX-512 on, AMX off (drop the AVX-512 flags on an AVX2 CPU)
REBUILD = (
    "rebuild it without them, e.g. CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
    "-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF' "
    "pip install --force-reinstall --no-cache-dir llama-cpp-python"
)


def crashes(gguf: str | Path, threads: int, home: Path) -> str | None:
    """Whether llama.cpp's kernels kill the process on this CPU, tried once in a child process and
    cached per CPU signature and llama.cpp build. A build for instructions the machine refuses dies
    with SIGILL and would take paradec with it: seen with a native build on an AMX Xeon VM, whose
    AMX tiles are refused in llama.cpp's worker threads on any batch of 2+ tokens.
    -> None, or one line: what happened and the fix."""
    path = home / "profiles" / f"{cpu_info().key()}-llamacpp-probe-{build_id()}.json"
    try:
        return json.loads(path.read_text())["crash"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        run = subprocess.run(
            [sys.executable, "-c", PROBE, str(gguf), str(threads)], capture_output=True, text=True, timeout=300
        )
        code = run.returncode
    except subprocess.TimeoutExpired:
        code = None
    if code is not None and code >= 0:  # it ran (or failed as Python does: load() reports that itself)
        crash = None
    else:
        what = "hung for 5 minutes" if code is None else f"was killed by {signal.Signals(-code).name}"
        crash = (
            f"llama.cpp {what} in a test pass on this CPU (its build uses instructions this machine refuses, "
            f"e.g. AMX in a VM); {REBUILD}, or use backend=torch"
        )
    _write_json(path, {"cpu": asdict(cpu_info()), "crash": crash})
    return crash


def build_id() -> str:
    """llama-cpp-python's version and its shared libraries' sizes and times: a rebuild is a new build."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent
    files = sorted((f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in lib.rglob("*.so*"))
    return hashlib.sha256(f"{llama_cpp.__version__} {files}".encode()).hexdigest()[:12]


def _lib():
    # before llama.cpp's first matmul reads it: the tiled K-quant GEMM (from 8 rows a batch) sums
    # in another order than the dot products of fewer rows, so a row's logits would depend on the batch
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")
    try:
        import llama_cpp
    except ImportError:
        raise ParadecError(f"the llamacpp backend needs llama-cpp-python; {INSTALL}, or use backend=torch") from None
    return llama_cpp


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, data):  # llama.cpp's log lines: dropped (paradec reports what matters)
    pass


class LlamaCppModel:
    """A GGUF file loaded by llama.cpp. ``config``: the file's shapes (from its HF conversion)."""

    backend = "llamacpp"
    # what this build computes exactly (``runtime.batch_exactness`` measures both at load): a chain
    # (W tokens of one sequence in one batch = W single-token passes), and how many one-token rows a
    # batch may hold (more are decoded in several batches: with repacked K-quants, 4+ rows take a GEMM)
    exact_chains = False
    exact_rows = 1

    def __init__(self, gguf: str | Path, config: ModelConfig, threads: int) -> None:
        lib = _lib()
        lib.llama_log_set(_quiet, None)
        lib.llama_backend_init()
        self.lib, self.config, self.threads, self.path = lib, config, threads, Path(gguf)
        self.handle = lib.llama_model_load_from_file(str(gguf).encode(), lib.llama_model_default_params())
        if not self.handle:
            raise ParadecError(
                f"llama.cpp could not load {gguf}; check that it is a GGUF file this "
                "llama-cpp-python supports, or use backend=torch"
            )
        vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.handle))
        if vocab != config.vocab_size:
            raise ParadecError(
                f"llama.cpp reads a vocabulary of {vocab} in {gguf}, paradec {config.vocab_size}; use backend=torch"
            )
        self._idle: list[_Context] = []  # contexts of finished caches, reused (creating one costs 15-400 ms)
        weakref.finalize(self, lib.llama_model_free, self.handle)

    def new_cache(self, capacity: int, max_len: int, live: int | None = None) -> LlamaCppCache:
        per_row = -(-max_len // 256) * 256  # whole pages of llama.cpp's KV cells
        ctx = next((c for c in self._idle if c.capacity == capacity and c.per_row >= max_len), None)
        if ctx is not None:
            self._idle.remove(ctx)
            self.lib.llama_memory_clear(ctx.memory, True)
        else:
            ctx = _Context(self, capacity, per_row)
        cache = LlamaCppCache(ctx, max_len, capacity if live is None else live)
        weakref.finalize(cache, self._idle.append, ctx)
        return cache

    def prefill(self, prompts: list[list[int]], cache: LlamaCppCache) -> None:
        """Every token of each row's prompt but the last (the first root) into its sequence."""
        for b, p in enumerate(prompts):
            self.append(b, p[:-1], cache)

    def append(self, row: int, tokens: list[int], cache: LlamaCppCache) -> None:
        """``tokens`` into ``row``'s sequence after what it holds, committed."""
        at, seq = cache.lengths[row], cache.seqs[row]
        items = [(t, at + i, seq, False) for i, t in enumerate(tokens)]
        for start in range(0, len(items), BATCH):
            cache.ctx.decode(items[start : start + BATCH])
        cache.lengths[row] += len(tokens)

    def verify(self, trees: list, cache: LlamaCppCache) -> torch.Tensor:
        """One pass over each row's chain (root first) -> logits [batch, width, vocab] float32
        (a shorter chain's rows past its end are zeros). Whether a chain's logits are its
        single-token ones depends on the build (module docstring; ``exact_chains``)."""
        if any(any(p != i - 1 for i, p in enumerate(t.parents)) for t in trees):
            raise ParadecError("the llamacpp backend verifies chains only; this method's trees need backend=torch")
        width = max(len(t) for t in trees)
        for b, s in enumerate(cache.scratch):
            if s:  # a row that is done stays in its group's passes uncommitted: write over its last pass
                cache.drop_scratch(b)
        items = [
            [(tok, cache.lengths[b] + d, cache.seqs[b], True) for d, tok in enumerate(t.tokens)]
            for b, t in enumerate(trees)
        ]
        if (n := sum(map(len, items))) > BATCH:
            raise ParadecError(f"a pass of {n} tokens is over the llamacpp backend's batch of {BATCH}")
        step = self.exact_rows  # rows a llama_decode computes as each alone (``runtime.batch_exactness``)
        flat = torch.cat(
            [cache.ctx.decode([i for row in items[at : at + step] for i in row]) for at in range(0, len(items), step)]
        )  # [tokens, vocab]
        out = (
            torch.zeros(len(trees), width, self.config.vocab_size)
            if any(len(t) < width for t in trees)
            else torch.empty(len(trees), width, self.config.vocab_size)
        )
        at = 0
        for b, t in enumerate(trees):
            out[b, : len(t)] = flat[at : at + len(t)]
            at += len(t)
        for b, t in enumerate(trees):
            cache.scratch[b] = len(t)
        return out


class _Context:
    """One llama.cpp context: ``capacity`` sequences of ``per_row`` cells each, and a batch."""

    def __init__(self, model: LlamaCppModel, capacity: int, per_row: int) -> None:
        lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = capacity * per_row, capacity, False
        params.n_batch = params.n_ubatch = BATCH
        params.n_threads = params.n_threads_batch = model.threads
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # row-invariant batches (module docstring)
        self.lib, self.capacity, self.per_row, self.vocab = lib, capacity, per_row, model.config.vocab_size
        self.handle = lib.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise ParadecError(
                f"llama.cpp could not make a context of {capacity} x {per_row} tokens "
                "(out of memory?); serve fewer rows or a shorter context"
            )
        self.memory = lib.llama_get_memory(self.handle)
        self.batch = lib.llama_batch_init(BATCH, 0, 1)
        weakref.finalize(self, _free, lib, self.handle, self.batch)

    def decode(self, items: list[tuple[int, int, int, bool]]) -> torch.Tensor:
        """(token, position, sequence, wants logits) per token -> logits [wanted, vocab] float32."""
        batch = self.batch
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, out) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, out
            batch.seq_id[i][0] = seq
        rc = self.lib.llama_decode(self.handle, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(items)} tokens")
        wanted = sum(1 for *_, out in items if out)
        if not wanted:
            return torch.empty(0, self.vocab)
        ptr = self.lib.llama_get_logits(self.handle)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(wanted, self.vocab)).copy())


def _free(lib, handle, batch) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(handle)


class LlamaCppCache:
    """The scheduler's KV cache on llama.cpp: live row b is sequence ``seqs[b]``; ``lengths``
    and ``scratch`` mean what they mean in ``kv.KVCache`` (committed tokens; cells a pass
    wrote past them). Rows come and go: a removed row's sequence is cleared and reused."""

    def __init__(self, ctx: _Context, max_len: int, live: int) -> None:
        self.ctx, self.max_len = ctx, max_len
        self.seqs: list[int] = list(range(live))
        self.lengths: list[int] = [0] * live
        self.scratch: list[int] = [0] * live

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.ctx.capacity

    def add_rows(self, n: int) -> int:
        first = self.batch
        if first + n > self.capacity:
            raise RuntimeError(f"KV cache has room for {self.capacity} rows, {first} are in use, {n} more asked")
        free = sorted(set(range(self.capacity)) - set(self.seqs))[:n]
        for seq in free:
            self.ctx.lib.llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
        self.seqs += free
        self.lengths += [0] * n
        self.scratch += [0] * n
        return first

    def remove_rows(self, start: int, n: int) -> None:
        for seq in self.seqs[start : start + n]:
            self.ctx.lib.llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
        del self.seqs[start : start + n], self.lengths[start : start + n], self.scratch[start : start + n]

    @contextmanager
    def rows(self, start: int, n: int) -> Iterator[LlamaCppCache]:
        """Rows [start, start + n) alone (a prefill); their lengths are written back on exit."""
        sub = LlamaCppCache.__new__(LlamaCppCache)
        sub.ctx, sub.max_len = self.ctx, self.max_len
        sub.seqs = self.seqs[start : start + n]
        sub.lengths, sub.scratch = self.lengths[start : start + n], self.scratch[start : start + n]
        yield sub
        self.lengths[start : start + n], self.scratch[start : start + n] = sub.lengths, sub.scratch

    def commit(self, row: int, nodes: list[int]) -> None:
        """Keep the first ``len(nodes)`` cells the last pass wrote for ``row`` (a chain's
        accepted prefix: nodes 0, 1, ..)."""
        if nodes != list(range(len(nodes))):
            raise RuntimeError(f"the llamacpp backend commits a chain's prefix, not nodes {nodes}")
        self.lengths[row] += len(nodes)
        self.drop_scratch(row)

    def advance(self, row: int, n: int) -> None:
        self.commit(row, list(range(n)))

    def drop_scratch(self, row: int) -> None:
        self.ctx.lib.llama_memory_seq_rm(self.ctx.memory, self.seqs[row], self.lengths[row], -1)
        self.scratch[row] = 0

    def truncate(self, row: int, length: int) -> None:
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate row {row} of length {self.lengths[row]} to {length}")
        self.lengths[row] = length
        self.drop_scratch(row)


def llamacpp_cost(
    model: LlamaCppModel, home: Path, remeasure: bool = False, widths: tuple[int, ...] = WIDTHS, reps: int = 3
) -> tuple[PassCost, Path, bool]:
    """The pass-cost curve of ``model`` on this CPU (the whole model:
    a chain of each width over a prefix of CONTEXT tokens), cached per CPU signature and GGUF
    file like ``cpu.profile``. -> (curve, cache file, measured under load: then not cached)."""
    cpu = cpu_info()
    path = home / "profiles" / f"{cpu.key()}-llamacpp-{file_digest(model.path)}-v{PROFILE_VERSION}.json"
    if path.is_file() and not remeasure:
        try:
            raw = json.loads(path.read_text())
            return PassCost("llamacpp", tuple(raw["widths"]), tuple(raw["seconds"]), True), path, False
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache file is measured again
    cache = model.new_cache(1, CONTEXT + max(widths) + 1)
    model.prefill([[i % model.config.vocab_size for i in range(CONTEXT + 1)]], cache)
    runs: dict[int, list[float]] = {w: [] for w in widths}
    watch = OthersWatch()
    for r in range(reps + 1):  # the first round warms the kernels up
        for w in widths:
            t = time.perf_counter()
            model.verify([TokenTree.chain(11, list(range(12, 11 + w)))], cache)
            if r:
                runs[w].append(time.perf_counter() - t)
            cache.drop_scratch(0)
    others = watch.share()
    cost = PassCost("llamacpp", tuple(widths), _curve([runs[w] for w in widths], min(runs[widths[0]])), True)
    if others <= BUSY_CORES:
        _write_json(
            path, {"cpu": asdict(cpu), "gguf": model.path.name, "widths": list(widths), "seconds": list(cost.seconds)}
        )
    return cost, path, others > BUSY_CORES

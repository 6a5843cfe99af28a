"""Are llama.cpp's batched logits its single-token logits? (whether a draft verified in one llama.cpp
batch can be lossless, and whether a row's `ar` tokens depend on the batch)

    python benchmarks/llamacpp_invariance.py [--gguf FILE] [--out benchmarks/results/llamacpp_invariance]

The answer depends on the build: the default one (llamafile's GEMM in it) is not exact for chains,
one built with CMAKE_ARGS='-DGGML_LLAMAFILE=OFF' is (``paradec.models.runtime.batch_exactness`` checks
the installed build at load).

For flash attention on and off and contexts of 100-700 tokens it compares, bit for bit:
- chain: W tokens of ONE sequence in one batch (a verified draft chain) against W single-token
  passes (`ar`);
- rows: one token in each of 4 sequences in one batch (the server's `ar` batch) against each alone.
Prints a Markdown table (equal?, max |logit difference|) and writes results.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import numpy as np


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, data):
    pass


class Ctx:
    def __init__(self, lib, model, vocab: int, flash: bool, seqs: int) -> None:
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = 1024 * seqs, 512, 512, seqs, False
        p.n_threads = p.n_threads_batch = 2
        p.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.lib, self.vocab = lib, vocab
        self.ctx = lib.llama_init_from_model(model, p)
        self.mem = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(512, 0, 1)

    def decode(self, items) -> np.ndarray:
        """(token, position, sequence, logits?) -> logits [wanted, vocab]."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (t, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, out
            b.seq_id[i][0] = seq
        assert self.lib.llama_decode(self.ctx, b) == 0
        n = sum(1 for *_, out in items if out)
        if not n:
            return np.empty((0, self.vocab), np.float32)
        return np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(n, self.vocab)).copy()

    def prefill(self, prompts: list[list[int]]) -> None:
        self.lib.llama_memory_clear(self.mem, True)
        for seq, p in enumerate(prompts):
            for s in range(0, len(p) - 1, 512):
                self.decode([(t, s + i, seq, False) for i, t in enumerate(p[s : min(s + 512, len(p) - 1)])])

    def free(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(i * 7919 + salt * 13) % 40000 + 100 for i in range(n)]


def chain(ctx: Ctx, context: int, width: int) -> tuple[bool, float]:
    p = _prompt(context)
    ctx.prefill([p])
    toks, single = [p[-1]], []
    for k in range(width):
        lg = ctx.decode([(toks[-1], context - 1 + k, 0, True)])[0]
        single.append(lg)
        toks.append(int(lg.argmax()))
    ctx.prefill([p])
    batched = ctx.decode([(toks[j], context - 1 + j, 0, True) for j in range(width)])
    diff = max(float(np.abs(batched[j] - single[j]).max()) for j in range(width))
    return all(np.array_equal(batched[j], single[j]) for j in range(width)), diff


def rows(ctx: Ctx, context: int, n: int) -> tuple[bool, float]:
    prompts = [_prompt(context, r) for r in range(n)]
    ctx.prefill(prompts)
    alone = [ctx.decode([(p[-1], context - 1, r, True)])[0] for r, p in enumerate(prompts)]
    ctx.prefill(prompts)
    batched = ctx.decode([(p[-1], context - 1, r, True) for r, p in enumerate(prompts)])
    diff = max(float(np.abs(batched[r] - alone[r]).max()) for r in range(n))
    return all(np.array_equal(batched[r], alone[r]) for r in range(n)), diff


def main() -> None:
    import llama_cpp as lib

    from paradec.zoo import default_gguf

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="default: the bundled SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--out", default="benchmarks/results/llamacpp_invariance")
    args = ap.parse_args()
    gguf = args.gguf or str(default_gguf())
    lib.llama_log_set(_quiet, None)
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(gguf.encode(), lib.llama_model_default_params())
    vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    out = []
    for flash in (True, False):
        one, four = Ctx(lib, model, vocab, flash, 1), Ctx(lib, model, vocab, flash, 4)
        for context in (100, 200, 300, 500, 700):
            for width in (2, 4, 8):
                same, diff = chain(one, context, width)
                out.append(
                    {
                        "flash_attn": flash,
                        "context": context,
                        "case": f"chain of {width}",
                        "equal": same,
                        "max_abs_diff": round(diff, 4),
                    }
                )
            same, diff = rows(four, context, 4)
            out.append(
                {
                    "flash_attn": flash,
                    "context": context,
                    "case": "4 rows x 1 token",
                    "equal": same,
                    "max_abs_diff": round(diff, 4),
                }
            )
        one.free()
        four.free()
    print("| flash attention | context | batch | bit-equal to single-token passes | max abs logit diff |")
    print("|---|---|---|---|---|")
    for r in out:
        print(
            f"| {'on' if r['flash_attn'] else 'off'} | {r['context']} | {r['case']} | {r['equal']} "
            f"| {r['max_abs_diff']} |"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(
        json.dumps(
            {
                "gguf": Path(gguf).name,
                "llama_cpp_python": lib.__version__,
                "build": lib.llama_print_system_info().decode().strip(),  # LLAMAFILE = 1: llamafile's GEMM in it
                "rows": out,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()

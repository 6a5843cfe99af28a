"""What one target pass costs, by verified width and weight format, on the default model.

    python benchmarks/pass_cost.py --out benchmarks/results/pass_cost

A pass of width w verifies a w-token chain after a 200-token context (the shape of a speculative
step; w = 1 is an `ar` step): layers, final norm and LM head, with the default exact numerics.
Formats are interleaved round by round; the table gives the median ms per pass and its ratio to
the same format's w = 1 pass. Writes OUT/results.json. ``--contexts`` times the passes after
other context lengths too, interleaved (what the attention costs as a conversation grows):

    python benchmarks/pass_cost.py --quants int4 --widths 1,4,8 --contexts 128,1024,2048 \\
        --out benchmarks/results/pass_context

``--parts`` adds, per format, the same passes with the layers' linears made free (each returns an
empty tensor of its output shape: what attention, norms, RoPE, the KV writes and the Python
around them cost) and with the LM head left out as well. That is the floor no faster linear
kernel goes below (``PARADEC_NATIVE=0``: with torch's small ops, not the C ones).
``--torch-ops`` adds each format on torch's small ops beside the C ones, interleaved;
``--call-a-step`` adds it with the C path called a step at a time from Python (four linears and
three small ops a layer) where it runs a whole pass in one call (``pd_layers``), interleaved too:

    python benchmarks/pass_cost.py --quants int4 --widths 1,2,4,8,16 --parts --out benchmarks/results/pass_parts
    python benchmarks/pass_cost.py --quants int4 --widths 1,2,4,8,16 --torch-ops --out benchmarks/results/pass_ops
    python benchmarks/pass_cost.py --quants int4 --widths 1,2,4,8,16 --call-a-step --out benchmarks/results/calls
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

import paradec
from paradec.bench.report import machine, markdown_table
from paradec.models.decode import LayerKernels
from paradec.zoo import default_gguf

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
CONTEXT = 200
PARTS = ("", "-no-linears", "-no-linears-no-head")  # --parts: the whole pass, then without its parts
A_STEP = "-call-a-step"  # --call-a-step's variants


def free(n_out: int):
    """A linear that costs nothing: [..., in] -> an empty [..., n_out]."""
    return lambda x: torch.empty(*x.shape[:-1], n_out, dtype=x.dtype)


def free_linears(k: LayerKernels, hidden: int) -> LayerKernels:
    """The layer ``k`` with every linear free (its norms, RoPE and attention as they are)."""
    qkv = (k.heads + 2 * k.kv_heads) * k.head_dim
    return dataclasses.replace(k, qkv=free(qkv), wo=free(hidden), gate_up=free(2 * k.inter), down=free(hidden))


def parts(m: torch.nn.Module, with_parts: bool) -> dict[str, list[LayerKernels]]:
    """The decode plan of each variant of ``m``: its own, and (``with_parts``) one with free linears."""
    own = list(m.plan())
    if not with_parts:
        return {"": own}
    hidden = m.norm.weight.shape[0]
    free_plan = [free_linears(k, hidden) for k in own]
    return {"": own, PARTS[1]: free_plan, PARTS[2]: free_plan}


def one_pass(m, tokens: torch.Tensor, pos: torch.Tensor, mask, cache, head: bool) -> None:
    """One cached pass: tokens, pos [1, w]; mask [1, 1, w, span] bool or None (w = 1)."""
    h = m.hidden(tokens, pos, mask, cache)
    m.normed_logits(h) if head else m.norm(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quants", default="none,int8,int4")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=5, help="passes per (format, width) per round")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--parts", action="store_true", help="also time each pass without its linears (and head)")
    ap.add_argument("--torch-ops", action="store_true", help="also each format on torch's small ops, interleaved")
    ap.add_argument("--call-a-step", action="store_true", help="also with the C path called a step at a time")
    ap.add_argument("--contexts", default=str(CONTEXT), help="context lengths the passes follow (comma-separated)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    widths = [int(w) for w in args.widths.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    models = {q: paradec.load(default_gguf(), quant=q, backend="torch").model for q in args.quants.split(",")}
    if args.torch_ops:  # the same formats on torch's small ops, beside the C ones (``models.native``)
        for q in list(models):
            models[q + "-torch-ops"] = paradec.load(default_gguf(), quant=q, backend="torch").model
            models[q + "-torch-ops"].set_native(False)
    if args.call_a_step:
        for q in [q for q in models if not q.endswith("-torch-ops")]:
            models[q + A_STEP] = paradec.load(default_gguf(), quant=q, backend="torch").model
    plans = {q + part: plan for q, m in models.items() for part, plan in parts(m, args.parts).items()}
    own = {q: m._plan for q, m in models.items()}  # built after every load: no registration after this
    variants = [(q, part) for q in models for part in (PARTS if args.parts else PARTS[:1])]
    cells = [(c, w) for c in contexts for w in widths]
    times: dict[tuple[str, int, int], list[float]] = {(q + part, c, w): [] for q, part in variants for c, w in cells}
    with torch.inference_mode():
        caches = {}
        for c in contexts:
            prompt = torch.randint(0, 1000, (1, c))
            for q, m in models.items():
                caches[(q, c)] = m.new_cache(1, c + max(widths) + 1)
                for s in range(0, c, 256):  # in chunks, as a long prompt is prefilled
                    n = min(256, c - s)
                    mask = torch.ones(n, s + n, dtype=torch.bool)
                    mask[:, s:] = torch.ones(n, n, dtype=torch.bool).tril()
                    m.hidden(prompt[:, s : s + n], torch.arange(s, s + n)[None], mask[None, None], caches[(q, c)])
                    caches[(q, c)].advance(0, n)
        for _ in range(args.rounds):
            for c, w in cells:
                tokens = torch.randint(0, 1000, (1, w))
                pos = torch.arange(c, c + w)[None]
                mask = torch.ones(w, c + w, dtype=torch.bool)
                mask[:, c:] = torch.ones(w, w, dtype=torch.bool).tril()
                mask = None if w == 1 else mask[None, None]
                for q, part in variants:
                    m = models[q]
                    # the decode plan this variant runs: free linears and a step at a time are Python's calls
                    table = None if part or q.endswith(A_STEP) else own[q].table
                    m._plan = dataclasses.replace(own[q], layers=plans[q + part], table=table)
                    head = part != PARTS[2]
                    one_pass(m, tokens, pos, mask, caches[(q, c)], head)  # warm
                    t = time.perf_counter()
                    for _ in range(args.passes):
                        one_pass(m, tokens, pos, mask, caches[(q, c)], head)
                    times[(q + part, c, w)].append((time.perf_counter() - t) / args.passes * 1000)
                    m._plan = own[q]
    rows = []
    for q, part in variants:
        for c in contexts:
            base = statistics.median(times[(q, c, widths[0])])
            for w in widths:
                ms = statistics.median(times[(q + part, c, w)])
                row = {"quant": q + part, "context": c, "width": w, "ms_per_pass": round(ms, 2)}
                rows.append({**row, "vs_width_1": round(ms / base, 2)})
    (out_dir / "results.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "contexts": contexts,
                "rows": rows,
                "raw_ms": {f"{q}/{c}/{w}": v for (q, c, w), v in times.items()},
            },
            indent=1,
        )
    )
    print(markdown_table(rows, ["quant", "context", "width", "ms_per_pass", "vs_width_1"]))


if __name__ == "__main__":
    main()

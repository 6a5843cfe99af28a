"""``paradec demo``: the default model (SmolLM2-135M-Instruct) answering chat prompts, decoded
by every lossless method, side by side.

For each shipped prompt: stream the `ar` answer, then run every method (`ar` too) on the same
conversation in lockstep (``lockstep``: one step of each in turn, so the machine's drift is
shared) and show tau, tokens/s, speedup vs `ar` and whether the tokens are identical; end with a
table of means. Greedy, so every method must reproduce `ar` token for token.
``--aspd`` adds the bundled ASPD code model (hybrid serial/parallel decoding).
"""

from __future__ import annotations

import statistics
import sys
from importlib.resources import files
from pathlib import Path

import paradec
from paradec import methods as registry
from paradec.bench.lockstep import lockstep
from paradec.bench.prompts import load_prompts
from paradec.bench.report import markdown_table
from paradec.companions import loadable
from paradec.zoo import bundled, default_gguf


def run_demo(
    max_new_tokens: int = 64,
    dtype: str = "auto",
    model: str | Path | None = None,
    aspd: bool = False,
    out=None,
    quant: str = "auto",
) -> list[dict]:
    out = out or sys.stdout  # looked up at the call: a stream bound at import may be gone since
    model = model if model is not None else default_gguf()
    shown = [m for m in registry.methods() if m.demo is not None and m.lossless and m.decode is None]
    wanted = set().union(*(m.loads for m in shown))
    shipped = {c: c.zoo(model) if c.zoo else None for c in loadable() if c.name in wanted}  # the zoo's, for it
    given = {c.name: (v[:1] if c.many else v) for c, v in shipped.items() if v}  # of a pool, the fastest
    print(f"paradec demo: loading {Path(str(model)).name} (a GGUF file is converted once and cached)", file=out)
    engine = paradec.load(model, dtype=dtype, quant=quant, **given)
    prompts = load_prompts(files("paradec") / "data" / "demo_chat.jsonl")
    chat = engine.tokenizer.has_chat_template
    convs = [[{"role": "user", "content": p.text}] if chat else p.text for p in prompts]
    methods = {m.name: {"method": m.name, **m.demo} for m in shown if not m.missing(engine)}
    engine.generate(convs[0], max_new_tokens=4)  # warm-up
    # a draft budget per method, kept from prompt to prompt, as each has when a user runs it alone
    # (chat's turns, a server's requests: ``Engine.budget``). Sharing one, interleaved methods
    # moved each other's exploration and acceptance statistics (over 6 runs: `auto` 0.98x `ar`
    # shared, 1.06x own; `medusa` 0.89x, 0.93x; `eagle+ngram` 0.93x, 0.99x)
    budgets = {name: engine.own_budget() for name in methods}
    # each method's one-time set-up (its drafter's first calls: weights packed for the C kernels,
    # torch's first dispatch of each shape) falls outside the timed answers, as it does for every
    # reply of a chat after its first: 4 tokens of another prompt, each method with its own budget.
    # On the first prompt it had cost `medusa` and `propd` up to 0.35x of their speed in a fresh
    # process (EPYC Zen 4)
    lockstep(engine, engine.encode([{"role": "user", "content": "Hello!"}] if chat else "Hello!"), methods, 4, budgets)
    rows = []
    loaded = ", ".join(c.summary for c in loadable() if engine.companions.get(c.name)) or "no drafters"
    print(
        f"{loaded}; greedy, up to {max_new_tokens} new tokens per answer\n"
        f"format {engine.format.name} ({engine.format.reason})\n",
        file=out,
    )
    for p, conv in zip(prompts, convs):
        print("=" * 72 + f"\nuser: {p.text}\nassistant: ", end="", file=out)
        for piece in engine.stream(conv, max_new_tokens=max_new_tokens):
            out.write(piece)
            out.flush()
        print("\n" + "-" * 72, file=out)
        outs = lockstep(engine, engine.encode(conv), methods, max_new_tokens, budgets)
        ref = outs["ar"]
        for name in methods:
            rows.append(_row(p.id, name, outs[name], ref, ref.stats.wall_s, out))
    summary = [_summary(name, [r for r in rows if r["method"] == name]) for name in methods]
    print("\n" + markdown_table(summary, ["method", "tau", "tokens_per_s", "speedup_vs_ar", "identical"]), file=out)
    if aspd:
        aspd_demo(max_new_tokens * 2, dtype, out)
    return summary


def _row(prompt: str, name: str, g, ref, ar_s: float, out) -> dict:
    """One method's answer to one prompt against `ar`'s (``ref``; ``ar_s``: `ar`'s mean seconds),
    printed as a line."""
    wall = ar_s if name == "ar" else g.stats.wall_s
    row = {
        "prompt": prompt,
        "method": name,
        "tau": g.stats.tau,
        "tokens_per_s": g.stats.tokens_per_s * g.stats.wall_s / wall,
        "speedup": ar_s / wall * len(g.token_ids) / max(1, len(ref.token_ids)),
        "identical": g.token_ids == ref.token_ids,
    }
    print(
        f"  {name:<16} tau {row['tau']:5.2f}   {row['tokens_per_s']:6.1f} tok/s   "
        f"x{row['speedup']:.2f} vs ar   identical: {row['identical']}"
        + (f"   drafters: {_shares(g.stats.drafters)}" if g.stats.drafters else ""),
        file=out,
    )
    return row


def _summary(name: str, mine: list[dict]) -> dict:
    return {
        "method": name,
        "tau": statistics.mean(r["tau"] for r in mine),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in mine),
        "speedup_vs_ar": statistics.mean(r["speedup"] for r in mine),
        "identical": f"{sum(r['identical'] for r in mine)}/{len(mine)}",
    }


def _shares(drafters: dict[str, int]) -> str:
    """auto's steps by drafter, e.g. "pld 60%, ar 40%"."""
    total = sum(drafters.values())
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(drafters.items(), key=lambda kv: -kv[1]))


def aspd_demo(max_new_tokens: int, dtype: str, out=None, n_prompts: int = 2) -> list[dict]:
    """The bundled ASPD model on code followed by independent functions (held-out stdlib files):
    hybrid decoding vs its own `ar`. Not a lossless method: the fine-tuned model's text is the
    product, so the comparison is speed and how much ran in parallel."""
    out = out or sys.stdout
    engine = paradec.load(bundled("aspd", "adapter.json"), dtype=dtype)
    prompts = load_prompts("stdlib:heldout", n_prompts)
    print(
        "\n" + "=" * 72 + f"\nASPD: the bundled ASPD adapter on code followed by independent functions "
        f"(held-out stdlib), {max_new_tokens} new tokens\n",
        file=out,
    )
    engine.generate(prompts[0].text, method="aspd", max_new_tokens=4)  # warm-up
    rows = []
    for p in prompts:
        ar = engine.generate(p.text, max_new_tokens=max_new_tokens, ignore_eos=True)
        g = engine.generate(p.text, method="aspd", max_new_tokens=max_new_tokens, ignore_eos=True)
        print("-" * 72 + f"\n[{p.id}] ...{p.text[-160:]}", end="", file=out)
        print(g.text, file=out)
        x = g.stats.extra
        plain = len(engine.tokenizer.encode(g.text))
        row = {
            "prompt": p.id,
            "branches": x["branches"],
            "parallel_steps": x["parallel_steps"],
            "steps": g.stats.steps,
            "plain_tokens": plain,
            "speedup_vs_ar": (plain / g.stats.wall_s) / (ar.stats.new_tokens / ar.stats.wall_s),
        }
        rows.append(row)
        print(
            f"  aspd: {x['groups']} group(s), {x['branches']} branches, {x['parallel_steps']} of "
            f"{g.stats.steps} passes parallel, {plain} plain tokens, x{row['speedup_vs_ar']:.2f} tokens/s vs ar",
            file=out,
        )
    print("\n" + markdown_table(rows, list(rows[0])), file=out)
    return rows

"""``paradec bench-serve``: a load generator for any OpenAI-compatible server (paradec's own,
vLLM, SGLang, llama.cpp's), through the official ``openai`` client.

For each method (paradec's ``method`` request field; other servers ignore it) and each
concurrency level it runs ``requests`` streamed chat requests from ``concurrency`` client
threads and reports throughput (completion tokens/s, requests/s), time to first token and
inter-token latency at p50/p99 (a streamed chunk is a token or several: a speculative step
commits several at once, so ITL is per chunk divided by its tokens), and errors. At each level
the methods take turns in rounds (``run_interleaved``), so the machine's drift hits them alike.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from paradec.bench.prompts import Prompt
from paradec.bench.report import markdown_table, write_json

COLUMNS = [
    "method",
    "concurrency",
    "requests",
    "errors",
    "left",
    "tokens_per_s",
    "requests_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_ms",
    "tokens_per_request",
]


@dataclass
class _Sample:
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)  # per gap between chunks: seconds per token it brought
    tpot: float | None = None  # time per output token after the first: (last - first chunk) / (tokens - 1)
    tokens: int = 0
    error: str | None = None
    left: bool = False  # the client went away mid-stream on purpose (``disconnect``)


def _one(client, model: str, prompt: Prompt, method: str, max_tokens: int, leave: bool = False) -> _Sample:
    """One streamed chat request; ``leave``: close the stream after its first piece of text, as a
    client that goes away does."""
    sample = _Sample()
    messages = [{"role": "user", "content": prompt.turns[0] if prompt.turns else prompt.text}]
    t0 = last = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"method": method},
        )
        chunks = 0
        for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                sample.tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                if sample.ttft is None:
                    sample.ttft = now - t0
                else:
                    sample.itl.append(now - last)
                chunks += 1
                last = now
                if leave:
                    stream.close()
                    sample.left = True
                    return sample
        # a chunk may carry several tokens (a speculative step commits several): a gap counts per
        # token, with the request's mean tokens per chunk
        if chunks > 1 and sample.tokens > 1:
            per_chunk = max(1.0, (sample.tokens - 1) / (chunks - 1))
            sample.tpot = sum(sample.itl) / (sample.tokens - 1)
            sample.itl = [gap / per_chunk for gap in sample.itl]
    except Exception as exc:  # counted, not raised: a load test reports errors
        sample.error = f"{type(exc).__name__}: {exc}"
    return sample


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _requests(
    client,
    model: str,
    prompts: list[Prompt],
    method: str,
    concurrency: int,
    span: range,
    max_tokens: int,
    every: int = 0,
) -> tuple[list[_Sample], float]:
    """Requests ``span`` (indices into the prompts, cycled) from ``concurrency`` threads; every
    ``every``-th leaves after its first piece of text. -> (samples, wall seconds)."""
    lock, todo, samples = threading.Lock(), list(span), []

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            leave = bool(every) and i % every == every - 1
            s = _one(client, model, prompts[i % len(prompts)], method, max_tokens, leave=leave)
            with lock:
                samples.append(s)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(worker) for _ in range(concurrency)]:
            f.result()
    return samples, time.perf_counter() - t0


def summarize(samples: list[_Sample], wall: float, method: str, concurrency: int) -> dict:
    """One table row of ``samples`` that took ``wall`` seconds of serving."""
    ok = [s for s in samples if s.error is None and not s.left]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [x for s in ok for x in s.itl]
    tokens = sum(s.tokens for s in ok)
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    return {
        "method": method,
        "concurrency": concurrency,
        "requests": len(samples),
        "errors": sum(s.error is not None for s in samples),
        "left": sum(s.left for s in samples),
        "tokens_per_s": round(tokens / wall, 2),
        "requests_per_s": round(len(ok) / wall, 3),
        "ttft_p50_ms": ms(_pct(ttft, 0.5)),
        "ttft_p99_ms": ms(_pct(ttft, 0.99)),
        "itl_p50_ms": ms(_pct(itl, 0.5)),
        "itl_p99_ms": ms(_pct(itl, 0.99)),
        "tpot_ms": ms(statistics.mean(tp)) if (tp := [s.tpot for s in ok if s.tpot is not None]) else None,
        "tokens_per_request": round(statistics.mean(s.tokens for s in ok), 1) if ok else 0,
        "wall_s": round(wall, 2),
        "first_errors": [s.error for s in samples if s.error][:3],
    }


def run_interleaved(
    client,
    model: str,
    prompts: list[Prompt],
    methods: list[str],
    concurrency: int,
    requests: int,
    max_tokens: int,
    rounds: int = 4,
    disconnect: float = 0.0,
) -> list[dict]:
    """Every method serves the same ``requests`` requests at ``concurrency``, in ``rounds``
    rounds; each round runs every method's share back to back, the order rotating from round to
    round, so the machine's drift and noise fall on every method alike. -> one row per method."""
    every = round(1 / disconnect) if disconnect > 0 else 0
    rounds = max(1, min(rounds, requests // max(1, concurrency)))  # a round keeps every client busy
    cuts = [requests * r // rounds for r in range(rounds + 1)]
    samples: dict[str, list[_Sample]] = {m: [] for m in methods}
    wall = dict.fromkeys(methods, 0.0)
    for r in range(rounds):
        for method in methods[r % len(methods) :] + methods[: r % len(methods)]:
            got, seconds = _requests(
                client, model, prompts, method, concurrency, range(cuts[r], cuts[r + 1]), max_tokens, every
            )
            samples[method] += got
            wall[method] += seconds
    return [summarize(samples[m], wall[m], m, concurrency) for m in methods]


def bench_serve(
    url: str,
    prompts: list[Prompt],
    methods: list[str],
    levels: list[int],
    requests: int,
    max_tokens: int,
    out: Path,
    api_key: str | None = None,
    model: str | None = None,
    disconnect: float = 0.0,
    rounds: int = 4,
) -> dict:
    import openai

    client = openai.OpenAI(
        base_url=url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1") else "/v1"),
        api_key=api_key or "none",
        max_retries=0,
        timeout=600,
    )
    model = model or client.models.list().data[0].id
    rows = []
    for level in levels:
        level_rows = run_interleaved(client, model, prompts, methods, level, requests, max_tokens, rounds, disconnect)
        for row in level_rows:
            print(markdown_table([row], COLUMNS).splitlines()[-1], flush=True)
        rows += level_rows
    result = {
        "config": {
            "url": url,
            "model": model,
            "methods": methods,
            "concurrency": levels,
            "requests": requests,
            "max_tokens": max_tokens,
            "prompts": len(prompts),
            "disconnect": disconnect,
            "rounds": rounds,
        },
        "rows": rows,
    }
    for row in rows:
        base = next(r for r in rows if r["concurrency"] == row["concurrency"] and r["method"] == methods[0])
        row[f"throughput_vs_{methods[0]}"] = (
            round(row["tokens_per_s"] / base["tokens_per_s"], 3) if base["tokens_per_s"] else None
        )
    out.mkdir(parents=True, exist_ok=True)
    write_json(result, out / "results.json")
    table = markdown_table(rows, COLUMNS + [f"throughput_vs_{methods[0]}"])
    (out / "results.md").write_text(table + "\n")
    _plot(rows, methods, out)
    return result


def _plot(rows: list[dict], methods: list[str], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional: pip install paradec[bench]
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        a1.plot([r["concurrency"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=m)
        a2.plot([r["concurrency"] for r in mine], [r["itl_p50_ms"] or 0 for r in mine], marker="o", label=m)
    a1.set(xlabel="concurrent clients", ylabel="completion tokens/s", xscale="log", title="throughput")
    a2.set(xlabel="concurrent clients", ylabel="ITL p50 (ms/token)", xscale="log", title="inter-token latency")
    a1.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)

"""``paradec serve`` (the OpenAI-compatible server) and ``paradec bench-serve`` (its load generator)."""

from __future__ import annotations

import argparse
from pathlib import Path

from paradec import methods
from paradec.cli.common import add_model_args, load_options, model_and_companions, writable_dir
from paradec.errors import ParadecError


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return levels


def add_serve_parsers(sub) -> None:
    sv = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server (continuous batching; /v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics)",
    )
    add_model_args(sv)
    served = [m.name for m in methods.methods()]
    sv.add_argument(
        "--method",
        default=methods.DEFAULT,
        choices=served,
        metavar="METHOD",
        help="the default method; a request may name another in its `method` field: "
        + ", ".join(served)
        + " (a method with a loop of its own, as ASPD's, is served when --method names it)",
    )
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-batch", type=int, default=8, help="requests decoding together (KV cache rows)")
    sv.add_argument(
        "--full-chains",
        action="store_true",
        help="verify every request's draft chain in full; default: cut a batch's chains to the width "
        "ProPD's cost model finds pays (one long chain pads every row of the pass)",
    )
    sv.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those; more get 429")
    sv.add_argument("--max-tokens-limit", type=int, default=4096, help="the largest max_tokens a request may ask")
    sv.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/ routes")
    sv.add_argument("--model-name", default=None, help="the model id clients send (default: the model file's name)")
    sv.add_argument(
        "--replicas",
        type=int,
        default=0,
        help='run N engine replicas on Ray Serve (pip install -e ".[ray]"); 0: one process, no Ray',
    )
    sv.add_argument("--ray-address", default=None, help="with --replicas: join this Ray cluster (e.g. HEAD:6379)")

    _add_bench_serve_parser(sub)


def _add_bench_serve_parser(sub) -> None:
    bs = sub.add_parser("bench-serve", help="load-test an OpenAI-compatible server: throughput, TTFT, ITL")
    bs.add_argument("--url", default="http://127.0.0.1:8000", help="the server (paradec serve, vLLM, ...)")
    bs.add_argument(
        "--methods",
        default="ar,auto",
        help="comma-separated paradec methods (the request's `method`); the first is the baseline",
    )
    bs.add_argument("--concurrency", type=_levels, default=[1, 4, 16], help="client threads per level (1,4,16)")
    bs.add_argument("--requests", type=int, default=32, help="requests per method and level")
    bs.add_argument(
        "--rounds", type=int, default=4, help="the methods take turns this many times per level (machine drift)"
    )
    bs.add_argument("--prompts", required=True, help="question.jsonl (Spec-Bench, MT-bench), HumanEval, or text")
    bs.add_argument("--per-category", type=int, default=None, help="first K prompts of each category")
    bs.add_argument("--limit", type=int, default=None)
    bs.add_argument("--max-tokens", type=int, default=128)
    bs.add_argument("--api-key", default=None)
    bs.add_argument(
        "--disconnect",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="this share of the requests (every k-th) leave after their first piece of text (a soak: 0.5)",
    )
    bs.add_argument("--model", default=None, help="model id (default: the server's first)")
    bs.add_argument("--out", required=True, help="directory for results.json, results.md, throughput.png")


def cmd_serve(args: argparse.Namespace) -> None:
    import paradec

    try:
        from paradec.serve import run
    except ImportError as exc:
        raise ParadecError(f'the server needs {exc.name}; install it with pip install -e ".[serve]"') from None
    if args.max_batch < 1 or args.max_queue < 1 or not 0 < args.port < 65536 or args.max_tokens_limit < 1:
        raise ParadecError("--max-batch, --max-queue and --max-tokens-limit must be >= 1 and --port in 1..65535")
    if args.replicas < 0 or (args.ray_address and not args.replicas):
        raise ParadecError("--replicas must be >= 0, and --ray-address needs --replicas N")
    # a request may ask any shared-loop method; an own-loop one (ASPD) is served when --method names it
    needs = {n for m in methods.methods() if m.drafter for n in m.needs} | methods.get(args.method).loads
    if args.backend == "llamacpp":  # llama.cpp serves the methods that need nothing loaded (ar, auto)
        needs = set(methods.get(args.method).needs)
    model, given = model_and_companions(args, [methods.get(args.method)], needs)
    _check_memory(model, args.max_batch)
    name = args.model_name or Path(str(model)).name
    app_options = dict(
        method=args.method,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        api_key=args.api_key,
        max_tokens_limit=args.max_tokens_limit,
    )
    # the format is chosen for a full batch: where it differs from one row's, throughput decides
    options = {**load_options(args, model, given), "batch_budget": not args.full_chains, "batch": args.max_batch}
    if args.replicas:
        import importlib.util

        if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
            raise ParadecError('--replicas needs Ray Serve; install it with pip install -e ".[ray]"')
        from paradec.serve import ray_app

        ray_app.run(
            options,
            name,
            args.replicas,
            host=args.host,
            port=args.port,
            ray_address=args.ray_address,
            **app_options,
        )
        return
    run(paradec.load(**options), name, host=args.host, port=args.port, **app_options)


def cmd_bench_serve(args: argparse.Namespace) -> None:
    from paradec.bench.prompts import load_prompts

    try:
        import httpx

        from paradec.bench.serve import bench_serve
    except ImportError as exc:
        raise ParadecError(f'bench-serve needs {exc.name}; install it with pip install -e ".[serve]"') from None
    if args.requests < 1 or args.max_tokens < 1 or args.rounds < 1:
        raise ParadecError("--requests, --rounds and --max-tokens must be >= 1")
    if not 0 <= args.disconnect <= 1:
        raise ParadecError(f"--disconnect {args.disconnect}: pass a share in [0, 1]")
    out = Path(args.out)
    writable_dir(out, "--out")
    prompts = load_prompts(args.prompts, args.limit, args.per_category)
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in methods.names()]
    if unknown or not names:
        raise ParadecError(f"unknown method(s) {', '.join(unknown) or '(none)'}; use: {', '.join(methods.names())}")
    try:
        httpx.get(args.url.rstrip("/").removesuffix("/v1") + "/health", timeout=5)
    except httpx.HTTPError:
        raise ParadecError(f"cannot reach {args.url}; start a server first (paradec serve) or pass --url") from None
    bench_serve(
        args.url,
        prompts,
        names,
        args.concurrency,
        args.requests,
        args.max_tokens,
        out,
        api_key=args.api_key,
        model=args.model,
        disconnect=args.disconnect,
        rounds=args.rounds,
    )
    print(f"wrote {out}/results.json, results.md, throughput.png")


def _check_memory(model, rows: int) -> None:
    """Refuse a --max-batch whose KV cache (every row holds the whole context) cannot fit in this
    machine's available memory, before the model is loaded (at 2 bytes a value: a lower bound)."""
    from paradec.cpu import _model_config
    from paradec.models.gguf import resolve_model
    from paradec.serve.worker import TREE_SCRATCH

    cfg = _model_config(resolve_model(model))
    per_row = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * (cfg.context_length + 1 + TREE_SCRATCH) * 2
    available = _available_bytes()
    if available is not None and rows * per_row > available:
        raise ParadecError(
            f"--max-batch {rows} needs {rows * per_row / 1e9:.1f} GB of KV cache ({per_row / 1e6:.0f} MB a "
            f"row for this model's {cfg.context_length}-token context) and this machine has "
            f"{available / 1e9:.1f} GB available; pass --max-batch <= {max(1, available // per_row)}"
        )


def _available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None (not checked)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None

"""Soak and head-of-line checks of `paradec serve`, each against a server this script starts.

    python benchmarks/serve_soak.py soak --backend llamacpp --out benchmarks/results/serve_soak
        32 clients x 50 streamed requests, every second one leaving after its first piece of
        text: failures, rows left running afterwards (/metrics), server RSS before and after
        (``--backend``: the server's runtime; torch is the default).
    python benchmarks/serve_soak.py long-prompt --out benchmarks/results/serve_long_prompt
        a ~6,000-token prompt, then 2-token requests while it is prefilled: their time to first
        token (the long prompt once held every other request for its whole prefill).

Both print one JSON object and write it to OUT/results.json. ``--python`` runs the server with
another interpreter or checkout (``--cwd``), for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Server:
    def __init__(self, args, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            args.python,
            "-m",
            "paradec",
            "serve",
            "--port",
            str(self.port),
            "--max-batch",
            str(args.max_batch),
            "--max-queue",
            "256",
            "--backend",
            args.backend,
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, cwd=args.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 600
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the server did not start: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def soak(args) -> dict:
    from paradec.bench.prompts import load_prompts
    from paradec.bench.serve import bench_serve

    server = Server(args)
    try:
        prompts = load_prompts(args.prompts, None, 2)
        warm = bench_serve(server.url, prompts, ["ar"], [4], 8, args.max_tokens, Path(args.out) / "warmup")
        rss_before = _rss_mb(server.proc.pid)
        run = bench_serve(
            server.url,
            prompts,
            args.methods.split(","),
            [args.clients],
            args.clients * args.per_client,
            args.max_tokens,
            Path(args.out) / "load",
            disconnect=0.5,
        )
        deadline = time.time() + 60
        while (m := _metrics(server.url))["paradec_running_requests"] or m["paradec_queue_length"]:
            if time.time() > deadline:
                break
            time.sleep(0.5)
        rss_after = _rss_mb(server.proc.pid)
        return {
            "clients": args.clients,
            "requests_per_method": args.clients * args.per_client,
            "rows": run["rows"],
            "warmup_errors": warm["rows"][0]["errors"],
            "failures": sum(r["errors"] for r in run["rows"]),
            "left_mid_stream": sum(r["left"] for r in run["rows"]),
            "running_after": m["paradec_running_requests"],
            "queue_after": m["paradec_queue_length"],
            "cancelled": m.get('paradec_requests_total{outcome="cancelled"}', 0.0),
            "ok": m.get('paradec_requests_total{outcome="ok"}', 0.0),
            "rss_mb_before": round(rss_before, 1),
            "rss_mb_after": round(rss_after, 1),
            "rss_growth": round(rss_after / rss_before - 1, 4),
        }
    finally:
        server.stop()


def long_prompt(args) -> dict:
    server = Server(args)
    try:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]

        def body(prompt: str, n: int) -> dict:
            return {
                "model": model,
                "prompt": prompt,
                "max_tokens": n,
                "temperature": 0,
            }

        short = body("The capital of France is", 2)
        t = time.perf_counter()
        httpx.post(server.url + "/v1/completions", json=short, timeout=600)
        alone = time.perf_counter() - t
        long_text = " ".join(f"item {i}: the quick brown fox jumps over the lazy dog." for i in range(args.long_items))
        done = {}

        def run_long():
            t0 = time.perf_counter()
            r = httpx.post(server.url + "/v1/completions", json=body(long_text, 2), timeout=3600)
            done["long_s"], done["long_prompt_tokens"] = time.perf_counter() - t0, r.json()["usage"]["prompt_tokens"]

        thread = threading.Thread(target=run_long)
        thread.start()
        time.sleep(1.0)  # the long prompt is being prefilled
        waits = []
        for _ in range(3):
            t = time.perf_counter()
            httpx.post(server.url + "/v1/completions", json=short, timeout=3600)
            waits.append(time.perf_counter() - t)
        thread.join()
        return {
            "short_alone_s": round(alone, 3),
            "short_beside_long_s": [round(w, 3) for w in waits],
            "long_s": round(done["long_s"], 2),
            "long_prompt_tokens": done["long_prompt_tokens"],
        }
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["soak", "long-prompt"])
    p.add_argument("--out", required=True)
    p.add_argument("--python", default=sys.executable, help="the server's interpreter")
    p.add_argument("--cwd", default=None, help="the server's working directory (another checkout)")
    p.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    p.add_argument("--methods", default="ar")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--per-client", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--backend", default="torch", choices=["auto", "torch", "llamacpp"], help="the server's runtime")
    p.add_argument("--long-items", type=int, default=450, help="sentences in the long prompt (~13 tokens each)")
    args = p.parse_args()
    if args.cwd:
        os.environ["PYTHONPATH"] = args.cwd
    result = {"what": args.what, "backend": args.backend, **(soak(args) if args.what == "soak" else long_prompt(args))}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

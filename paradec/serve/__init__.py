"""``paradec serve``: an OpenAI-compatible server with continuous batching (``worker``) behind
FastAPI (``app``) on uvicorn.

The engine loop runs on the process's main thread and uvicorn on a second one: torch's CPU
kernels run ~1.3-2x slower when called from a thread other than the one that owns OpenMP's
first team (measured here: a 1 x 576 x 1536 bf16 GEMV 76-94 us from the main thread, 165-190 us
from any other; whole decode steps 21 vs 15 tokens/s), and the HTTP side is light.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import asynccontextmanager

from paradec import methods
from paradec.errors import ParadecError
from paradec.serve.app import LOOPBACK_HOSTS, create_app
from paradec.serve.worker import Job, Worker

__all__ = ["Job", "Worker", "build_app", "run"]


def build_app(
    engine,
    model_name: str,
    method: str = methods.DEFAULT,
    max_batch: int = 8,
    max_queue: int = 64,
    api_key: str | None = None,
    max_tokens_limit: int = 4096,
    own_worker: bool = True,
    allowed_hosts: frozenset[str] | None = None,
):
    """The app and its ``Worker`` (``app.state.worker``). With ``own_worker`` the worker runs on a
    thread that starts and stops with the app's lifespan (tests, Ray replicas); ``run`` instead
    drives it from the main thread."""
    worker = Worker(engine, max_batch=max_batch, max_queue=max_queue)
    app = create_app(worker, model_name, method, api_key, max_tokens_limit, allowed_hosts=allowed_hosts)

    if own_worker:

        @asynccontextmanager
        async def lifespan(_app):
            worker.start()
            try:
                yield
            finally:
                worker.stop()

        app.router.lifespan_context = lifespan
    app.state.worker = worker
    return app


def run(engine, model_name: str, host: str = "127.0.0.1", port: int = 8000, **options) -> None:
    """Serve until SIGINT/SIGTERM: the engine loop on this (main) thread, uvicorn on another.
    On a signal, running and waiting requests end as cancelled and the process exits."""
    import uvicorn

    # bound to the loopback, it answers loopback Host names only: a web page on another name that
    # resolves to 127.0.0.1 (DNS rebinding) cannot drive it
    hosts = LOOPBACK_HOSTS if host in LOOPBACK_HOSTS or host.startswith("127.") else None
    app = build_app(engine, model_name, own_worker=False, allowed_hosts=hosts, **options)
    worker = app.state.worker
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5))
    http = threading.Thread(target=server.run, name="paradec-http", daemon=True)  # no signal handlers off main
    http.start()
    while not server.started:
        if not http.is_alive():
            raise ParadecError(f"cannot serve on {host}:{port} (is the port in use?); pass another --port")
        time.sleep(0.05)

    shown = f"[{host}]" if ":" in host else host
    print(f"paradec: serving {model_name} on http://{shown}:{port} (chat page: http://{shown}:{port}/)", flush=True)
    if engine.format is not None:
        print(f"paradec: weight format {engine.format.name} ({engine.format.reason})", flush=True)

    def stop(*_) -> None:
        worker.request_stop()
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()  # returns once stopped, every request answered
    http.join(10)

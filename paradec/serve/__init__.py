"""``paradec serve``: an OpenAI-compatible server with continuous batching (``worker``) behind
FastAPI (``app``) on uvicorn."""

from __future__ import annotations

from contextlib import asynccontextmanager

from paradec.serve.app import create_app
from paradec.serve.worker import Job, Worker

__all__ = ["Job", "Worker", "build_app", "run"]


def build_app(engine, model_name: str, method: str = "ar", max_batch: int = 8, max_queue: int = 64,
              api_key: str | None = None, max_tokens_limit: int = 4096):
    """The app with its worker, which starts and stops with the app's lifespan (uvicorn's
    SIGTERM/SIGINT handling ends in-flight requests as cancelled, then exits)."""
    worker = Worker(engine, max_batch=max_batch, max_queue=max_queue)
    app = create_app(worker, model_name, method, api_key, max_tokens_limit)

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
    import uvicorn

    uvicorn.run(build_app(engine, model_name, **options), host=host, port=port, log_level="info",
                timeout_graceful_shutdown=5)

"""The OpenAI-compatible HTTP API (FastAPI) in front of the engine ``Worker``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (through the model's chat
template), ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Responses follow OpenAI's JSON
shapes (``usage``, ``finish_reason``), ``stream: true`` sends server-sent events ending with
``data: [DONE]``, and errors carry OpenAI's ``{"error": {...}}`` body: 400 bad request, 401
wrong key, 404 unknown model, 413 body too large, 429 queue full (with Retry-After).
``method`` (any registered method with a drafter) is a paradec field per request.

Limits are checked before any work: a body over ``max_body_bytes`` (with or without a
Content-Length) is a 413 and one that stalls a 408; with an API key every route but
``/health`` needs it (compared in constant time); a server bound to the loopback answers only
Host names of the loopback (DNS rebinding). A client that leaves, streaming or not, cancels its
request at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from importlib.resources import files
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from paradec import methods
from paradec.errors import ParadecError
from paradec.serve.gate import LOOPBACK_HOSTS, Gate, error_response  # noqa: F401 (LOOPBACK_HOSTS: re-exported)
from paradec.serve.worker import Job, QueueFull, Worker

MAX_BODY_BYTES = 1 << 20
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is still there
RETRY_AFTER_S = 1


class _Request(BaseModel):
    # other fields: a method's options (``eagle_topk``: ``methods.option_table``); OpenAI's that paradec
    # does not use (user, logprobs=None, ...) are ignored
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: StrictInt | None = Field(None, ge=0)  # strict: `true` is not a token count
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=0)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False  # strict: "yes" is not a boolean
    stream_options: dict[str, Any] | None = None
    n: Literal[1] = 1
    method: str | None = None  # paradec: the decoding method (default: the server's)
    # paradec: trees sized from this request's own statistics, not the server's measured ones, so a
    # seed fixes sampled text (default: on for a seeded sampled request)
    deterministic: StrictBool | None = None
    # paradec: each streamed chunk carries one token and ``paradec``: how it was committed (step,
    # kind draft / bonus / plain, drafter, accepted, drafted, depth); the chat page draws it
    trace: StrictBool = False


class CompletionRequest(_Request):
    prompt: str | list[int]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers


class _Reply:
    """One response's OpenAI JSON: its id and timestamp, a whole body or stream events."""

    def __init__(self, job: Job, model_name: str, chat: bool, include_usage: bool = False) -> None:
        self.job, self.model_name, self.chat, self.include_usage = job, model_name, chat, include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def usage(self) -> dict:
        prompt, completion, stats = len(self.job.ids), self.job.completion_tokens, self.job.stats
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if stats is not None:  # paradec's own: target passes, and which drafters proposed in how many (auto)
            usage["paradec"] = {"method": stats.method, "steps": stats.steps, "tau": round(stats.tau, 4)}
            if stats.drafters:
                usage["paradec"]["drafters"] = dict(stats.drafters)
        return usage

    def finish(self) -> str:
        return "length" if self.job.finish_reason == "length" else "stop"

    def body(self, text: str) -> dict:
        choice = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": self.finish(),
                "logprobs": None,
            }
            if self.chat
            else {"index": 0, "text": text, "finish_reason": self.finish(), "logprobs": None}
        )
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": [choice],
            "usage": self.usage(),
        }

    def _chunk(self, choices: list, usage: dict | None, trace: dict | None = None) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        if trace is not None:  # asked for (``trace``): standard clients never see it
            body["paradec"] = trace
        return f"data: {json.dumps(body)}\n\n"

    def event(self, delta: str | None, reason: str | None, role: bool = False, trace: dict | None = None) -> str:
        """A stream chunk: a text piece, the final finish_reason, or (chat) the assistant role first."""
        if self.chat:
            d = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
            choice = {"index": 0, "delta": d, "finish_reason": reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": reason, "logprobs": None}
        return self._chunk([choice], None, trace)

    def usage_event(self) -> str:
        """The last chunk when the client asked for usage (``stream_options.include_usage``)."""
        return self._chunk([], self.usage())


def _method_options(req: _Request) -> dict:
    """The request's fields that are method options (the rest of its extra fields are OpenAI's)."""
    table = methods.option_table()
    return {k: v for k, v in (req.model_extra or {}).items() if k in table}


class _Api:
    """What the routes share: the worker and its engine, the served model name and methods, the limits."""

    def __init__(self, worker: Worker, model_name: str, default_method: str, max_tokens_limit: int) -> None:
        self.worker, self.engine, self.model_name = worker, worker.engine, model_name
        self.default_method, self.max_tokens_limit = default_method, max_tokens_limit
        self.served = [m for m in methods.names() if methods.get(m).available(self.engine)]
        if default_method in self.served and methods.get(default_method).drafter is not None:
            # its companions' one-time set-up (EAGLE's LM rows: 0.1-0.5 s) before the first request, not in it
            methods.get(default_method).drafter(self.engine, self.engine.config(method=default_method))

    def submit(self, req: _Request, ids_of: Callable[[], list[int]]) -> tuple[Job, asyncio.Queue]:
        """Check ``req``, queue its job on the worker; the queue receives its text pieces, then None."""
        if req.model != self.model_name:
            raise ApiError(
                404, f"model {req.model!r} is not served here; use {self.model_name!r}", "model", "not_found_error"
            )
        method = req.method or self.default_method
        if method not in self.served:
            raise ApiError(400, f"method {method!r} is not served; use one of {', '.join(self.served)}", "method")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = 16 if max_tokens is None else max_tokens  # OpenAI's completions default
        if max_tokens > self.max_tokens_limit:
            raise ApiError(
                400, f"max_tokens is {max_tokens}; this server allows at most {self.max_tokens_limit}", "max_tokens"
            )
        try:
            ids = ids_of()
            fixed = req.deterministic if req.deterministic is not None else req.seed is not None and req.temperature > 0
            gen = self.engine.config(
                method=method,
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                top_k=req.top_k,
                top_p=req.top_p,
                seed=req.seed,
                stop=req.stop,
                deterministic=bool(fixed),
                **_method_options(req),
            )
        except ParadecError as exc:
            raise ApiError(400, str(exc)) from None
        loop, out = asyncio.get_running_loop(), asyncio.Queue()
        job = Job(ids, gen, lambda piece, j: loop.call_soon_threadsafe(out.put_nowait, piece), trace=req.trace)
        try:
            self.worker.submit(job)
        except QueueFull:
            raise ApiError(
                429,
                "the server is busy (its queue is full); retry later",
                kind="rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        return job, out

    async def respond(self, req: _Request, job: Job, out: asyncio.Queue, chat: bool, request: Request):
        """The job's whole answer as one JSON body, or (``stream``) server-sent events as it decodes."""
        reply = _Reply(job, self.model_name, chat, bool((req.stream_options or {}).get("include_usage")))
        if not req.stream:
            pieces = []
            get = asyncio.ensure_future(out.get())
            checked = time.monotonic()
            try:
                while True:
                    done, _ = await asyncio.wait({get}, timeout=DISCONNECT_POLL_S)
                    if time.monotonic() - checked >= DISCONNECT_POLL_S:  # is the client still there?
                        checked = time.monotonic()
                        if await request.is_disconnected():
                            return Response(status_code=204)  # nobody reads it; the request is cancelled below
                    if not done:
                        continue
                    if (piece := get.result()) is None:
                        break
                    pieces.append(piece if isinstance(piece, str) else piece[0])
                    get = asyncio.ensure_future(out.get())
            finally:  # done, gone, or a handler cancelled mid-way: the row is freed at the next step
                get.cancel()
                self.worker.cancel(job)
            if job.error is not None:  # refused at admission (400), or the engine failed / is stopping (500, 503)
                status = {"cancelled": 503, "error": 400 if job.group is None else 500}[job.finish_reason]
                raise ApiError(status, job.error, kind="invalid_request_error" if status == 400 else "server_error")
            return reply.body("".join(pieces))
        return StreamingResponse(self._events(reply, out), media_type="text/event-stream")

    async def _events(self, reply: _Reply, out: asyncio.Queue):
        job = reply.job
        try:
            if reply.chat:
                yield reply.event(None, None, role=True)
            while (piece := await out.get()) is not None:
                yield (
                    reply.event(piece, None) if isinstance(piece, str) else reply.event(piece[0], None, trace=piece[1])
                )
            if job.error is not None:
                yield f"data: {json.dumps({'error': {'message': job.error, 'type': 'server_error'}})}\n\n"
            else:
                yield reply.event(None, reply.finish())
                if reply.include_usage:
                    yield reply.usage_event()
            yield "data: [DONE]\n\n"
        finally:  # the client went away (or we are done): the request leaves at the next step
            self.worker.cancel(job)


def create_app(
    worker: Worker,
    model_name: str,
    default_method: str = methods.DEFAULT,
    api_key: str | None = None,
    max_tokens_limit: int = 4096,
    max_body_bytes: int = MAX_BODY_BYTES,
    allowed_hosts: frozenset[str] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``worker``'s engine as ``model_name``; the caller runs the
    worker (``paradec.serve.run`` does both). ``allowed_hosts``: the Host names answered (None:
    any; ``run`` passes the loopback names when it binds the loopback)."""
    app = FastAPI(title="paradec", docs_url=None, redoc_url=None, openapi_url=None if api_key else "/openapi.json")
    api = _Api(worker, model_name, default_method, max_tokens_limit)
    engine = worker.engine
    app.add_middleware(Gate, worker=worker, api_key=api_key, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    _add_error_handlers(app, worker)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(worker.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def page():
        return _static("index.html", "text/html; charset=utf-8")

    @app.get("/static/{name}")
    async def asset(name: str):
        kinds = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
        if name not in kinds:
            raise ApiError(404, f"GET /static/{name}: no such file", kind="not_found_error")
        return _static(name, kinds[name])

    @app.get("/paradec/info")
    async def info():  # what the chat page offers: the served methods, the default one
        return {"model": model_name, "methods": api.served, "default_method": default_method}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "paradec"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        job, out = api.submit(req, lambda: engine.encode(req.prompt, False))
        return await api.respond(req, job, out, False, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        messages = [m.model_dump() for m in req.messages]
        job, out = api.submit(req, lambda: engine.encode(messages, True))
        return await api.respond(req, job, out, True, request)

    return app


# the page's own files only: no inline script, nothing from elsewhere, model text never run as code
PAGE_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:"


def _static(name: str, kind: str) -> Response:
    """A file of the chat page (``paradec/serve/static``: no build step, nothing from a CDN)."""
    body = (files("paradec") / "serve" / "static" / name).read_bytes()
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Content-Security-Policy": PAGE_CSP}
    return Response(body, media_type=kind, headers=headers)


def _add_error_handlers(app: FastAPI, worker: Worker) -> None:
    """Every error in OpenAI's shape, counted in the metrics (a 429 is load, not an error)."""

    @app.exception_handler(ApiError)
    async def _apierror_response(request: Request, exc: ApiError):
        if exc.status >= 400 and exc.status != 429:
            worker.metrics.errors.inc()
        return error_response(exc.status, exc.message, exc.param, exc.kind, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        worker.metrics.errors.inc()
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            return error_response(
                400, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})"
            )
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", where)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):  # 404, 405 ... in OpenAI's shape
        worker.metrics.errors.inc()
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(
            exc.status_code,
            f"{request.method} {request.url.path}: {exc.detail}",
            kind=kind,
            headers=getattr(exc, "headers", None),
        )

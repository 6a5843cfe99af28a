"""The server's ASGI gate, in front of every route: the API key (every route but ``/health`` and
the chat page's static files, which hold no data: the page asks for the key; compared in
constant time), the Host check of a server bound to the loopback (DNS rebinding), the body limit
(read here, so a chunked body cannot pass it and a stalled one is a 408), and the
``x-paradec-replica`` header. A refusal is an OpenAI-shaped JSON error."""

from __future__ import annotations

import asyncio
import hmac
import uuid

from fastapi.responses import JSONResponse, Response

from paradec.serve.worker import Worker

BODY_TIMEOUT_S = 10.0  # a body that sends nothing for this long is a 408
REPLICA = uuid.uuid4().hex[:12]  # the x-paradec-replica header: which process answered (no host name or PID)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# the chat page and its assets: served without the key (static text, no data; the page asks for the key)
PAGE_FILES = frozenset({"/", "/static/app.js", "/static/style.css"})


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict | None = None,
) -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


class Gate:
    """ASGI middleware in front of every route: the API key, the Host check, the body limit (read
    here, so a chunked body cannot pass it and a stalled one times out), the replica header."""

    def __init__(
        self, app, worker: Worker, api_key: str | None, max_body_bytes: int, allowed_hosts: frozenset[str] | None
    ) -> None:
        self.app, self.worker, self.max_body = app, worker, max_body_bytes
        self.key = None if api_key is None else f"Bearer {api_key}".encode()
        self.hosts = allowed_hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message):
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-paradec-replica", REPLICA.encode())],
                }
            await send(message)

        headers = dict(scope.get("headers") or [])
        refusal = self._refuse(scope["path"], headers)
        if refusal is None and scope["method"] in ("POST", "PUT", "PATCH"):
            refusal, receive = await self._read_body(headers, receive)
        if refusal is not None:
            self.worker.metrics.errors.inc()
            return await refusal(scope, receive, tagged)
        return await self.app(scope, receive, tagged)

    def _refuse(self, path: str, headers: dict) -> JSONResponse | None:
        if self.hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            name = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
            if name.lower() not in self.hosts:
                return error_response(
                    400,
                    f"Host {host!r} is not served here (this server answers its loopback names only); "
                    "connect to localhost or bind another --host",
                    "host",
                )
        if self.key is not None and path != "/health" and path not in PAGE_FILES:
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.key):
                return error_response(
                    401, "missing or wrong API key; send Authorization: Bearer KEY", kind="authentication_error"
                )
        return None

    async def _read_body(self, headers: dict, receive):
        """-> (a refusal or None, a receive that replays the body and then the client's own)."""
        try:
            length = int(headers[b"content-length"]) if b"content-length" in headers else None
        except ValueError:
            return error_response(400, "Content-Length is not a number"), receive
        if length is not None and length > self.max_body:
            return error_response(413, f"request body over {self.max_body} bytes"), receive
        body, more = bytearray(), True
        while more:
            try:
                message = await asyncio.wait_for(receive(), BODY_TIMEOUT_S)
            except asyncio.TimeoutError:
                return error_response(408, f"the request body stalled for {BODY_TIMEOUT_S:g} s; send it whole"), receive
            if message["type"] == "http.disconnect":
                return Response(status_code=400), receive
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return error_response(413, f"request body over {self.max_body} bytes"), receive
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # then the client's own messages: a disconnect is seen

        return None, replay

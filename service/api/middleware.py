"""ASGI middleware: every request passes the wire checks before any route runs.

- the body limit, enforced while streaming (413 before the route runs), and a cap on the JSON objects and
  arrays a body may hold, counted on the raw bytes before anything is parsed (413: a 48 MB body of 6M
  tiny objects took 3.5 GB to parse);
- path and query parameters without control characters (``service.api.wire_checks.check_params``);
- a non-empty body must be ``application/json`` (415) and a checked JSON document
  (``service.api.wire_checks.parse_json_body``: 400 malformed or duplicate keys, 422 unstorable values);
  ``POST /v1/groups`` also takes an Arrow body (``service.ingest.arrow_body``), whose route checks it.

The parsed document is left in ``scope["state"]["json_body"]`` for parsers that want it, and the body
is replayed unchanged to the app.
"""

from __future__ import annotations

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.wire_checks import (
    ARROW_MEDIA_TYPE,
    JSON_MEDIA_TYPES,
    WireError,
    check_containers,
    check_content_type,
    check_params,
    parse_json_body,
)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# the routes whose body may be Arrow IPC instead of JSON (each checks it itself)
_ARROW_BODIES = frozenset({("POST", "/v1/groups")})
# bodies above this size are parsed in a worker thread so the event loop keeps serving
_INLINE_PARSE_BYTES = 256 * 1024


async def reply_error(send: Send, status: int, field: str, message: str, headers: dict[str, str] | None = None) -> None:
    """The service's error body (``service.ingest.schemas.ErrorOut``), sent straight from the middleware."""
    body = orjson.dumps({"error": f"{field}: {message}", "detail": [{"field": field, "message": message}]})
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class RequestGuardMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, max_containers: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_containers = max_containers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_params(scope.get("path", ""), scope.get("query_string", b""))
            if scope.get("method") not in BODY_METHODS:
                await self.app(scope, receive, send)
                return
            body = await self._read_body(scope, receive)
            if body:
                arrow_ok = (scope.get("method"), scope.get("path")) in _ARROW_BODIES
                allowed = (*JSON_MEDIA_TYPES, ARROW_MEDIA_TYPE) if arrow_ok else JSON_MEDIA_TYPES
                if check_content_type(_header(scope, b"content-type"), allowed) == ARROW_MEDIA_TYPE:
                    await self.app(scope, _replay(body, receive), send)
                    return
                check_containers(body, self.max_containers)
                if len(body) > _INLINE_PARSE_BYTES:
                    doc = await run_in_threadpool(parse_json_body, body)
                else:
                    doc = parse_json_body(body)
                scope.setdefault("state", {})["json_body"] = doc
        except WireError as exc:
            await reply_error(send, exc.status, exc.field, exc.message)
            return
        except _TooLarge:
            limit = self.max_bytes
            await reply_error(send, 413, "body", f"larger than the limit of {limit} bytes (max_body_bytes)")
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            raise _TooLarge
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)  # the client went away; the route sees a short body
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _TooLarge(Exception):
    pass


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay

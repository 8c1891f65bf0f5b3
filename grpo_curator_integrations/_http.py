"""The one HTTP path every adapter uses: ``POST /v1/score`` in chunks, with retries on transient failures."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from service.client import resolve_connection

CHUNK = 256  # items per request to start with; smaller once the service answers 413 (its limit, or half)


class ScoringError(RuntimeError):
    """The service refused the request, or an item could not be scored where a number is required."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


@dataclass(frozen=True)
class Target:
    url: str
    spec: str
    api_key: str | None = field(repr=False)  # never in a log line or an error


def target(url: str | None = None, spec: str | None = None, api_key: str | None = None) -> Target:
    """Arguments first, then the environment; a spec is required. The URL and key are every command's one
    client configuration (``service.client.resolve_connection``: ``GRPO_CURATOR_URL``, else
    ``http://127.0.0.1:<GRPO_CURATOR_PORT or 8000>``; ``GRPO_CURATOR_API_KEY``)."""
    spec = spec or os.environ.get("GRPO_CURATOR_REWARD_SPEC")
    if not spec:
        raise ValueError("spec: pass the reward spec name (or set GRPO_CURATOR_REWARD_SPEC)")
    conn = resolve_connection(url, api_key)
    return Target(conn.url, spec, conn.api_key)


def jsonable(value: Any) -> Any:
    """Dataset cells (numpy scalars and arrays, tuples) -> plain JSON values."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback))


def tools_of(value: Any) -> list[dict[str, Any]] | None:
    """A trainer's tools cell (OpenAI tool definitions, a list or its JSON text) -> the score item's
    ``tools``; anything else is no tools (the service then reports the missing definitions by name)."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    value = jsonable(value) if value is not None else None
    return value if isinstance(value, list) else None


def _fallback(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


MAX_RETRY_AFTER_S = 10.0
TRANSIENT = frozenset({502, 504})  # a proxy / gateway that could not reach the service: the next try may


def retryable(r: httpx.Response) -> bool:
    """Can another try answer differently? A gateway's 502 / 504, or a 503 / 429 that says when to come back
    (``Retry-After``: the database unavailable, the per-key in-flight limit). A 503 without it is the service's
    considered answer (an item that cannot be scored, a breaker): the same request gets the same answer."""
    if r.status_code in TRANSIENT:
        return True
    return r.status_code in (429, 503) and "retry-after" in r.headers


def retry_delay(r: httpx.Response, attempt: int) -> float:
    """``Retry-After`` seconds (at most ``MAX_RETRY_AFTER_S``), else exponential backoff from 0.5 s."""
    try:
        seconds = float(r.headers["retry-after"])
    except (KeyError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds):  # absent, an HTTP date, nan, inf: the backoff
        return min(0.5 * 2**attempt, MAX_RETRY_AFTER_S)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


# transport errors where the request surely did not reach the service: no connection was made (refused, an
# unknown host, the connect timed out, no pooled connection free). A read timeout or a write error on POST
# /v1/score is not retried: the service may be scoring it (no idempotency key exists for /v1/score), and a retry
# would score it again, for as long again. A LocalProtocolError is our own request being malformed (a key
# that is no header value): the same request fails the same way.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class Client:
    """A pooled HTTP client for one target; ``retries`` attempts on a connection that could not be made
    (``NOT_SENT``) and on answers another try can change (``retryable``)."""

    def __init__(self, t: Target, timeout_s: float = 300.0, retries: int = 3) -> None:
        self.target, self.retries, self.chunk = t, retries, CHUNK
        headers = {"authorization": f"Bearer {t.api_key}"} if t.api_key else {}
        self._http = httpx.Client(base_url=t.url, timeout=timeout_s, headers=headers)

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result per item (``total``, ``outcome``, ``rewards``), in order."""
        answers = self.post_chunked("/v1/score", items, lambda part: {"reward_spec": self.target.spec, "items": part})
        return [r for a in answers for r in a["results"]]

    def post_chunked(self, path: str, items: list[Any], body: Callable[[list[Any]], dict[str, Any]]) -> list[dict]:
        """POST ``items`` in chunks, one answer per chunk in order. A 413 (more items than the service takes,
        or more of its pool time than one request may use) shrinks the chunk to the service's ``max_items``
        or to half, and the chunk is sent again; a single item answered 413 raises."""
        answers: list[dict[str, Any]] = []
        start = 0
        while start < len(items):
            part = items[start:start + self.chunk]
            try:
                answers.append(self.post(path, body(part)))
            except ScoringError as exc:
                if exc.status != 413 or len(part) == 1:
                    raise
                limit = exc.detail.get("max_items") if isinstance(exc.detail, dict) else None
                fits = isinstance(limit, int) and 0 < limit < len(part)
                self.chunk = limit if fits else max(len(part) // 2, 1)
                continue
            start += len(part)
        return answers

    def spec(self) -> dict[str, Any]:
        """The reward spec (``name``, ``version``, ``body`` with the weighted components): the version
        named, or the latest one."""
        name, _, version = self.target.spec.partition("@")
        params = {"version": version} if version else None
        return self._request("GET", f"/v1/reward-specs/{name}", params=params)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, content=orjson.dumps(body), headers={"content-type": "application/json"})

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """One call, retried ``retries`` times only where another try can answer differently (``retryable``);
        a deterministic error (a 500, the OpenRLHF route's ``fail`` 503, any 4xx) raises at once."""
        for attempt in range(self.retries):
            try:
                r = self._http.request(method, path, **kw)
            except NOT_SENT:
                if attempt + 1 == self.retries:
                    raise
                time.sleep(0.5 * 2**attempt)
                continue
            if not retryable(r) or attempt + 1 == self.retries:
                break
            time.sleep(retry_delay(r, attempt))
        if r.status_code >= 400:
            raise ScoringError(f"{method} {path}: {r.status_code} {_message(r)}", r.status_code, _detail(r))
        return r.json()

    def close(self) -> None:
        self._http.close()


def _detail(r: httpx.Response) -> Any:
    try:
        body = r.json()
    except ValueError:
        return None
    return body.get("detail") if isinstance(body, dict) else None


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json().get("error"))
    except ValueError:
        return r.text[:500]

"""The one HTTP path every adapter uses: ``POST /v1/score`` in chunks, with retries on transient failures."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

DEFAULT_URL = "http://127.0.0.1:8000"
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
    api_key: str | None


def target(url: str | None = None, spec: str | None = None, api_key: str | None = None) -> Target:
    """Arguments first, then the environment; a spec is required."""
    spec = spec or os.environ.get("GRPO_CURATOR_REWARD_SPEC")
    if not spec:
        raise ValueError("spec: pass the reward spec name (or set GRPO_CURATOR_REWARD_SPEC)")
    url = (url or os.environ.get("GRPO_CURATOR_URL") or DEFAULT_URL).rstrip("/")
    return Target(url, spec, api_key or os.environ.get("GRPO_CURATOR_API_KEY") or None)


def jsonable(value: Any) -> Any:
    """Dataset cells (numpy scalars and arrays, tuples) -> plain JSON values."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback))


def _fallback(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


class Client:
    """A pooled HTTP client for one target; ``retries`` attempts on connection errors and 5xx."""

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
        for attempt in range(self.retries):
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError:
                if attempt + 1 == self.retries:
                    raise
            else:
                if r.status_code < 500 or attempt + 1 == self.retries:
                    break
            time.sleep(0.5 * 2**attempt)
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

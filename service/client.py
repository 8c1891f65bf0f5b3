"""Typed HTTP client (httpx) for every endpoint: used by producers, trainers, tests and the demo."""

from __future__ import annotations

from typing import Any

import httpx


class CuratorError(Exception):
    """A 4xx / 5xx answer from the service; ``message`` is the service's ``error`` field."""

    def __init__(self, status_code: int, message: str, detail: Any = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.detail = detail


class CuratorClient:
    def __init__(self, base_url: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
                raise CuratorError(response.status_code, body.get("error", response.text), body.get("detail"))
            except ValueError:
                raise CuratorError(response.status_code, response.text) from None
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- ingest -----------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def upsert_prompts(self, prompts: list[dict[str, Any]]) -> dict[str, Any]:
        return self._json("POST", "/v1/prompts", json={"prompts": prompts})

    def post_group(self, group: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/groups", json=group)

    def post_groups(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        return self._json("POST", "/v1/groups", json={"groups": groups})

    def get_group(self, group_id: str, *, include_tokens: bool = False) -> dict[str, Any]:
        return self._json("GET", f"/v1/groups/{group_id}", params={"include_tokens": include_tokens})

    def list_groups(self, **filters: Any) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        return self._json("GET", "/v1/groups", params=params)

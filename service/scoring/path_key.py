"""OpenRLHF's remote-reward client sends no auth header, so its key may travel in the path.

``/compat/openrlhf/key/{api_key}/{spec}/get_reward`` is rewritten, before anything else sees the request,
to ``/compat/openrlhf/{spec}/get_reward`` with ``Authorization: Bearer {api_key}``: authentication then
treats it like any other request. (A key in a URL can reach access logs; prefer a key made for it.)

The key never travels further than this middleware: the request's scope is rewritten in place (uvicorn's
access log formats the same scope, so it logs the rewritten path), and any other path under
``/compat/openrlhf/key/`` (no spec segment, an empty key) has its key segment replaced by ``redacted`` before
routing, so a 404 / 405 body or a log line names ``/compat/openrlhf/key/redacted/...``, never the key.
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX = "/compat/openrlhf/key/"
MASK = "redacted"  # no character the access log would percent-encode


def rewrite(raw_path: str) -> tuple[str, str] | None:
    """'/compat/openrlhf/key/K/rest' (percent-encoded) -> ('/compat/openrlhf/rest' still encoded, K decoded);
    None for any other path."""
    if not raw_path.startswith(PREFIX):
        return None
    key, sep, rest = raw_path[len(PREFIX):].partition("/")
    if not key or not sep or not rest:
        return None
    return "/compat/openrlhf/" + rest, unquote(key)


def masked(raw_path: str) -> str:
    """A path under PREFIX that ``rewrite`` refused, with its key segment replaced by ``redacted``."""
    _, sep, rest = raw_path[len(PREFIX):].partition("/")
    return PREFIX + MASK + sep + rest


def _is_under_prefix(scope: Scope, raw: str) -> bool:
    # the decoded path too: '/compat/openrlhf/%6Bey/K' decodes to the prefix
    return raw.startswith(PREFIX) or unquote(raw).startswith(PREFIX) or scope["path"].startswith(PREFIX)


class PathKeyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
            found = rewrite(raw)
            if found is not None:
                raw_rest, key = found
                headers = [(k, v) for k, v in scope.get("headers", []) if k != b"authorization"]
                headers.append((b"authorization", b"Bearer " + key.encode("latin-1", "replace")))
                # in place: the server's access log formats this same dict
                scope.update(path=unquote(raw_rest), raw_path=raw_rest.encode("latin-1"), headers=headers)
            elif _is_under_prefix(scope, raw):
                hidden = masked(unquote(raw) if not raw.startswith(PREFIX) else raw)
                scope.update(path=unquote(hidden), raw_path=hidden.encode("latin-1"))
        await self.app(scope, receive, send)

"""OpenRLHF's remote-reward client sends no auth header, so its key may travel in the path.

``/compat/openrlhf/key/{api_key}/{spec}/get_reward`` is rewritten, before anything else sees the request,
to ``/compat/openrlhf/{spec}/get_reward`` with ``Authorization: Bearer {api_key}``: authentication then
treats it like any other request. (A key in a URL can reach access logs; prefer a key made for it.)

The key never travels further than this middleware: the request's scope is rewritten in place (uvicorn's
access log formats the same scope, so it logs the rewritten path), and any other path under
``/compat/openrlhf/key/`` (no spec segment, an empty key) has its key segment replaced by ``redacted`` before
routing, so a 404 / 405 body or a log line names ``/compat/openrlhf/key/redacted/...``, never the key.

Whatever the path's shape (doubled slashes, another case, percent-encoding, the key in any segment or in the
query), anything left in the path or query that looks like an API token (``service.api.errors.redact_tokens``)
is replaced by ``redacted`` before anything else sees the scope: no route, error handler, redirect or access
log line can echo it. Besides the one rewritten shape above, a key in the path authenticates only on a route
that declares it (``allow(..., token_param=...)``): such a path's key moves into ``Authorization`` as it is
redacted.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import TOKEN_MASK, redact_tokens

PREFIX = "/compat/openrlhf/key/"
MASK = TOKEN_MASK  # no character the access log would percent-encode


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
            if redact_tokens(scope["path"]) != scope["path"]:
                _token_param_to_header(scope)
            _redact_scope(scope)
        await self.app(scope, receive, send)


def _token_param_to_header(scope: Scope) -> None:
    """A route declaring ``token_param`` whose path carries the key: the key becomes the Bearer header
    (when the request has none), so redacting the path leaves it authenticated."""
    from service.auth.service import declared_routes

    app = scope.get("app")
    if app is None or any(k == b"authorization" for k, _ in scope.get("headers", [])):
        return
    for method, template, access in declared_routes(app):
        if access is None or not access.token_param or method != scope.get("method"):
            continue
        found = re.fullmatch(_template_regex(template, access.token_param), scope["path"])
        if found is not None and redact_tokens(found["key"]) != found["key"]:
            scope["headers"] = [*scope.get("headers", []), (b"authorization", b"Bearer " + found["key"].encode())]
            return


def _template_regex(template: str, token_param: str) -> str:
    """'/a/{key}/b/{x}' -> a regex capturing ``token_param``'s segment as ``key``."""
    parts = re.split(r"(\{[^}]+\})", template)
    return "".join(("(?P<key>[^/]+)" if p == "{" + token_param + "}" else "[^/]+") if p.startswith("{")
                   else re.escape(p) for p in parts)


def _redact_scope(scope: Scope) -> None:
    """Every token-shaped piece of the path, raw path and query string -> ``redacted`` (in place)."""
    path = scope["path"]
    raw = (scope.get("raw_path") or path.encode("latin-1", "replace")).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    clean_path, clean_raw, clean_query = redact_tokens(path), redact_tokens(raw), redact_tokens(query)
    if redact_tokens(unquote(clean_raw)) != unquote(clean_raw):  # a token spelled with percent-escapes
        clean_raw = quote(clean_path, safe="/")
    if redact_tokens(unquote(clean_query)) != unquote(clean_query):
        clean_query = quote(redact_tokens(unquote(clean_query)), safe="=&")
    if (clean_path, clean_raw, clean_query) != (path, raw, query):
        scope.update(path=clean_path, raw_path=clean_raw.encode("latin-1"),
                     query_string=clean_query.encode("latin-1"))

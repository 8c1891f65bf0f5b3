"""One error type with a status code, rendered by one handler as ``{"error", "detail"}`` (``ErrorOut``).

Every other failure is rendered the same way: request validation (422, or 400 for malformed JSON),
unknown routes (404) and methods (405), the database being unreachable (503 with ``Retry-After``) and
anything unexpected (500). ``ERROR_STATUSES`` / ``document_errors`` declare them in OpenAPI, in one place.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.api.validation import format_errors

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1

# anything shaped like one of our API tokens (``service.auth.service.new_token``: ``gck_<32 hex>_<urlsafe
# secret>``), leniently: any case, percent-encoded secret characters, and the ``<id>_<secret>`` tail alone
_TOKEN_LIKE = re.compile(r"(?i:gck_)[0-9a-fA-F]{32}_[A-Za-z0-9_%-]*|[0-9a-fA-F]{32}_[A-Za-z0-9_-]{43}(?![\w-])")
TOKEN_MASK = "redacted"  # no character the access log would percent-encode


def redact_tokens(text: str) -> str:
    """``text`` with everything that looks like an API token replaced by ``redacted``: what a response body,
    header or log line may echo of a request (its path, its query) never carries a key."""
    return _TOKEN_LIKE.sub(TOKEN_MASK, text)


class ServiceError(Exception):
    status_code: int = 400

    def __init__(self, message: str, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.detail = detail


class BadRequest(ServiceError):
    status_code = 422


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class GroupConflict(Conflict):
    pass


class LeaseConflict(Conflict):
    pass


class TooManyWaiters(ServiceError):
    """429: the process's long-poll waiters are at their cap; ``Retry-After`` says when to come back."""

    status_code = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, detail={"retry_after_s": retry_after_s})
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}


# what a request can fail with when the database cannot be reached (503 "unavailable, try again"); a
# statement error (too many parameters, a constraint, a cast) is a bug or a bad request, never a 503
_DB_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError, sa_exc.DisconnectionError)
# SQLSTATEs of a lost or refused connection: class 08, server shutting down / starting, too many clients
_CONNECTION_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")
# SQLSTATEs of a statement PostgreSQL cancelled and rolled back for a reason outside the request: a deadlock, a
# serialization failure (another transaction's sake), a lock timeout, a cancel or statement timeout (an operator's
# or the server's). The same request can succeed when sent again -- a 503 to retry, not a 500
_CONFLICT_SQLSTATES = ("40P01", "40001", "55P03", "57014")


def error_response(status: int, message: str, detail: Any = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": detail}, status_code=status, headers=headers)


def _is_db_unavailable(exc: BaseException) -> bool:
    """A connection failure: the pool timed out or saw a disconnect, the connection was lost (SQLAlchemy
    invalidated it), connecting failed (no statement ran), or the server said so (SQLSTATE)."""
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if exc.statement is None and isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    return sqlstate.startswith(_CONNECTION_SQLSTATES)


def db_error_response(exc: BaseException) -> JSONResponse | None:
    """The 503 of a database error the client may retry -- a transaction PostgreSQL cancelled (deadlock,
    serialization, lock timeout, cancel), or the database unreachable -- or None: any other statement error is a
    bug (a 500)."""
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if sqlstate in _CONFLICT_SQLSTATES:
        return error_response(
            503, f"database: the database cancelled this request's transaction (SQLSTATE {sqlstate}) and rolled it "
            "back; retry", None, headers={"Retry-After": "1"},
        )
    if _is_db_unavailable(exc):
        return error_response(
            503, "database: unavailable; retry later", None, headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    return None


def _allowed_methods(request: Request) -> str:
    """Every method some route of this path answers (Starlette's Allow names only the first route's)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in ("DELETE", "GET", "PATCH", "POST", "PUT")
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status_code, exc.message, exc.detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "body: invalid JSON", [{"field": "body", "message": "invalid JSON"}])
        message, items = format_errors(errors)
        return error_response(422, message, items)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the path is echoed redacted (service.scoring.path_key redacts the scope first; this is the backstop)
        path = redact_tokens(request.url.path)
        if exc.status_code == 404 and exc.detail == "Not Found":
            message = f"{redact_tokens(request.method)} {path}: no such route"
        elif exc.status_code == 405:
            allowed = _allowed_methods(request)
            message = f"{redact_tokens(request.method)} {path}: method not allowed (allowed: {allowed})"
            return error_response(405, message, None, headers={"Allow": allowed})
        else:
            message = redact_tokens(str(exc.detail))
        headers = {k: redact_tokens(v) for k, v in exc.headers.items()} if exc.headers else None
        return error_response(exc.status_code, message, None, headers=headers)

    async def db_error(request: Request, exc: Exception) -> JSONResponse:
        response = db_error_response(exc)
        if response is None:
            raise exc  # rendered as a 500 below
        log.warning("%s %s: database error answered 503 to retry: %s", request.method,
                    redact_tokens(request.url.path),
                    getattr(getattr(exc, "orig", None), "sqlstate", None) or exc.__class__.__name__)
        return response

    for cls in (*_DB_UNAVAILABLE, sa_exc.DBAPIError):
        app.add_exception_handler(cls, db_error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed: %s", request.method, redact_tokens(request.url.path), redact_tokens(repr(exc)))
        return error_response(500, "internal error (logged by the service)", None)


# (status, when) declared on every route, on routes with a body, on routes with path parameters
_ALWAYS = {422: "a field is invalid (named in error and detail)", 503: "the database is unavailable; retry after Retry-After seconds"}
_WITH_BODY = {
    400: "the body is not JSON, or repeats a key",
    413: "the body is larger than max_body_bytes",
    415: "the body is not application/json",
}
_WITH_PATH = {404: "no such resource"}


def _operation_errors(path: str, operation: dict[str, Any]) -> dict[int, str]:
    codes = dict(_ALWAYS)
    if "requestBody" in operation:
        codes.update(_WITH_BODY)
    if "{" in path:
        codes.update(_WITH_PATH)
    for code, response in operation.get("responses", {}).items():
        if code.isdigit() and int(code) >= 400:
            codes[int(code)] = response.get("description") or codes.get(int(code), "error")
    return codes


def document_errors(schema: dict[str, Any], extra_models: tuple[type, ...] = ()) -> dict[str, Any]:
    """Declare every error status of every operation with the ``ErrorOut`` schema; add ``extra_models``
    (bodies parsed by a dependency, e.g. GroupIn) to components. Mutates and returns ``schema``."""
    from service.api.schemas import ErrorOut

    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorOut, *extra_models):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")  # type: ignore[attr-defined]
        for name, sub in body.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components.setdefault(model.__name__, body)
    for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, replaced by ErrorOut
        components.pop(unused, None)
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            for code, description in _operation_errors(path, operation).items():
                declared = responses.get(str(code), {})
                entry = {"description": description, "content": ref}
                own = declared.get("content", {}).get("application/json", {}).get("schema")
                if own is not None and not own.get("$ref", "HTTPValidationError").endswith("HTTPValidationError"):
                    # a route's own error body (ErrorOut-shaped, e.g. the lease's LeasePausedOut), kept
                    entry["content"] = {"application/json": {"schema": own}}
                if "headers" in declared:  # e.g. Retry-After
                    entry["headers"] = declared["headers"]
                responses[str(code)] = entry
    return schema
class Unauthorized(ServiceError):
    status_code = 401
    headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(ServiceError):
    status_code = 403

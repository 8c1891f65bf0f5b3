"""Who may do what: API keys, roles declared next to each route, and the check that every route has one.

A route declares its access in its decorator, in one short line::

    @router.post("/lease", dependencies=[allow(TRAINER, dataset=SERVICE)])

``allow(*roles)`` admits the listed roles and ``admin``; ``public()`` admits everyone. ``create_app``
refuses to start when a route has no declaration (``check_routes``), and the tests build their
route x key matrix from the same declarations (``access_of``).

Dataset scoping (a key made with ``--dataset``): ``dataset=None`` (the default) refuses scoped keys,
because the route spans every dataset; ``dataset=ANY`` admits them (the route holds no dataset's data,
e.g. the policy version); ``dataset="<param>"`` requires that path / query parameter and checks it is in
the key's datasets; ``dataset=SERVICE`` leaves the check to the service, which is passed the key
(``KeyDep``) and filters or refuses by the stored rows' datasets.

**Session keys** are a kind of their own (not an API key, not a role): ``gcs_<session id>_<secret>``, made
by ``POST /v1/sessions`` for one agent session (``agent_sessions.secret_hash`` holds sha256(secret)). Only a
route declared with ``session_param`` (``allow(PRODUCER, session_param="session_id")``: the gateway's
routes of that one session) admits one, and only when the path names its own session: another session's
route is a 403, a wrong secret a 401, every other route a 403, whether auth is on or off. What a finished
session's key may still do is the route's business (service.sessions: it forwards and writes nothing).

Auth is on once any key exists (revoked ones included: revoking the last key does not open the service)
or when ``require_auth`` is set; otherwise requests without a token act as an anonymous admin.
Tokens are ``gck_<id>_<secret>``; the table holds the id and sha256(secret), compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from service.api.deps import SessionDep
from service.api.errors import Forbidden, Unauthorized
from service.api.lru import Lru
from service.auth import repository as key_repo
from service.store.db import statements_on_their_own


class Role(StrEnum):
    producer = "producer"
    trainer = "trainer"
    viewer = "viewer"
    admin = "admin"


PRODUCER, TRAINER, VIEWER, ADMIN = Role.producer, Role.trainer, Role.viewer, Role.admin
ANY = "*"  # dataset=ANY: scoped keys may use the route (it holds no dataset's data)
SERVICE = "service"  # dataset=SERVICE: the service checks the rows' datasets against the key's
TOKEN_PREFIX = "gck_"
SESSION_TOKEN_PREFIX = "gcs_"  # a session key (SessionKey), valid on its one session's routes only


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: a key's name, role and dataset scope (None: every dataset); name None = auth off."""

    name: str | None
    role: Role
    datasets: frozenset[str] | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == Role.admin

    def allows_dataset(self, dataset: str) -> bool:
        return self.datasets is None or dataset in self.datasets

    def check_dataset(self, dataset: str, field: str) -> None:
        """403 naming ``field`` when ``dataset`` is outside the key's scope."""
        if not self.allows_dataset(dataset):
            raise Forbidden(
                f"{field}: key {self.name!r} is scoped to datasets {sorted(self.datasets or ())}; "
                f"{dataset!r} is not one of them"
            )


OPEN = Principal(name=None, role=Role.admin)


@dataclass(frozen=True, slots=True)
class SessionKey:
    """The caller holds one agent session's key: it may use that session's routes and nothing else."""

    session_id: str
    dataset: str | None  # (what the session's status is now is its routes' business: they read its row)


# -- tokens ----------------------------------------------------------------------------------------------
def new_token() -> tuple[str, str, str]:
    """(key id, sha256 of the secret, the token shown once). 128 bits of id, 256 bits of secret."""
    key_id, secret = secrets.token_hex(16), secrets.token_urlsafe(32)
    return key_id, hash_secret(secret), f"{TOKEN_PREFIX}{key_id}_{secret}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """``gck_<id>_<secret>`` -> (id, secret); None when it is not of that shape."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    key_id, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
    if not sep or len(key_id) != 32 or not secret:
        return None
    return key_id, secret


def split_session_token(token: str) -> tuple[str, str] | None:
    """``gcs_<session id>_<secret>`` -> (session id, secret); None when it is not of that shape."""
    if not token.startswith(SESSION_TOKEN_PREFIX):
        return None
    session_id, sep, secret = token[len(SESSION_TOKEN_PREFIX) :].partition("_")
    return (session_id, secret) if sep and session_id and secret else None


async def authenticate_session(request: Request, session: SessionDep, token: str, session_param: str) -> SessionKey:
    """The session key ``token`` for the session the path names (403 for another session's, 401 for a
    wrong secret or a session that does not exist). A key this process verified before needs neither the
    database nor a worker thread (an agent's every call after its first); else it is looked up in a worker
    thread, the lookup's transaction ending there, as in ``authenticate``."""
    parts = split_session_token(token)
    if parts is None:
        raise Unauthorized("authorization: malformed session key (gcs_<session id>_<secret>)")
    if parts[0] != request.path_params.get(session_param):
        raise Forbidden("authorization: this session key belongs to another session")
    digest = hash_secret(parts[1])
    known = _verified_session_keys.get((parts[0], digest))
    if known is not None:
        return known
    return await run_in_threadpool(_look_up_session_key, session, parts[0], digest)


def _look_up_session_key(session: SessionDep, session_id: str, digest: str) -> SessionKey:
    try:
        row = key_repo.session_secret(session, session_id)
    except BaseException:  # the database's error, as it is: a commit here would replace it (PendingRollbackError)
        session.rollback()
        raise
    session.commit()
    # the digest is compared even when the session is unknown, so timing does not tell ids apart
    matches = hmac.compare_digest(digest, row[0] if row is not None else "0" * 64)
    if row is None or not matches:
        raise Unauthorized("authorization: wrong session key")
    return _verified_session_keys.put((session_id, digest), SessionKey(session_id=session_id, dataset=row[1]))


# Session keys this process verified, by (session id, sha256 of the secret): what a check reads (the secret's
# hash, the dataset) never changes once a session exists, so a key once verified is verified again without a
# lookup (an agent's every call). Only matches are kept (a wrong key is looked up each time); at most 65,536,
# the least recently used dropped first. The session's own routes check the key against its row again
# (``service.sessions.service.admit``).
_verified_session_keys = Lru[tuple[str, str], SessionKey](size=65536)


def _session_token(request: Request) -> str | None:
    """The request's bearer token when it is a session key (``gcs_...``)."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token.startswith(SESSION_TOKEN_PREFIX) else None


def _bearer(request: Request, token_param: str | None = None) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        # for clients that cannot send headers (e.g. OpenRLHF's remote reward URL): the token in the path
        return request.path_params.get(token_param) if token_param else None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("authorization: expected 'Bearer <token>'")
    return token.strip()


def authenticate(request: Request, session: SessionDep, token_param: str | None = None) -> Principal:
    """The request's key (401 when missing, unknown or revoked while auth is on); OPEN when auth is off.
    The lookup's read transaction ends here, so its pooled connection goes back at once (a long poll
    must hold none while it waits). It ends with COMMIT: auth runs before the route has written anything,
    and a COMMIT never discards what the caller's session already holds (a ROLLBACK would).

    The lookup is one statement: when the session holds no transaction yet (every request's first use), it
    runs on its own (autocommit: it sees what was committed before it, as a transaction's first statement
    does), which spares every request a BEGIN and a COMMIT round trip."""
    statements_on_their_own(session)
    try:
        principal = _authenticate(request, session, token_param)
    except BaseException:
        session.rollback()
        raise
    session.commit()
    return principal


def _authenticate(request: Request, session: SessionDep, token_param: str | None) -> Principal:
    token = _bearer(request, token_param)
    if token is None:
        if request.app.state.settings.require_auth or key_repo.any_key(session):
            raise Unauthorized("authorization: an API key is required (Authorization: Bearer <token>)")
        return OPEN
    parts = split_token(token)
    row = key_repo.get_key(session, parts[0]) if parts else None
    # the digest is compared even when the id is unknown, so timing does not tell ids apart
    stored = row.secret_hash if row is not None else "0" * 64
    matches = hmac.compare_digest(hash_secret(parts[1] if parts else token), stored)
    if row is None or not matches or row.revoked_at is not None:
        raise Unauthorized("authorization: unknown or revoked API key")
    datasets = None if row.datasets is None else frozenset(row.datasets)
    return Principal(name=row.name, role=Role(row.role), datasets=datasets)


def current_key(request: Request, session: SessionDep) -> Principal:
    """The key the route's access check authenticated (the check runs first: decorator dependencies)."""
    key = getattr(request.state, "principal", None)
    return key if key is not None else authenticate(request, session)


KeyDep = Annotated[Principal, Depends(current_key)]


# -- declarations ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Access:
    """A route's declaration: the roles it admits (empty and public: everyone) and its dataset rule."""

    roles: frozenset[Role]
    dataset: str | None = None
    public: bool = False
    public_setting: str | None = None  # a bool setting that, when true, opens the route (e.g. /metrics)
    token_param: str | None = None  # a path parameter that may carry the token (no Authorization header)
    session_param: str | None = None  # the path parameter naming the session whose key the route admits

    def admits(self, role: Role) -> bool:
        return self.public or role == Role.admin or role in self.roles


def _dataset_values(request: Request, name: str) -> list[str]:
    """Every value the request gives for ``name`` (a repeated query parameter gives several)."""
    if name in request.path_params:
        return [request.path_params[name]]
    return request.query_params.getlist(name)


def _checker(access: Access) -> Any:
    # async: what needs the database (an API key's lookup, a session key's first) runs in a worker thread, and
    # nothing else does (a session key verified before: no hand-off to the threadpool)
    async def check(request: Request, session: SessionDep) -> None:
        if access.public or (
            access.public_setting and getattr(request.app.state.settings, access.public_setting)
        ):
            return
        session_token = _session_token(request)
        if session_token is not None:
            if access.session_param is None:
                raise Forbidden("authorization: a session key is valid only on its own session's routes "
                                "(/v1/sessions/{session_id}/...); this route needs an API key")
            request.state.principal = await authenticate_session(request, session, session_token,
                                                                 access.session_param)
            return
        key = request.state.principal = await run_in_threadpool(authenticate, request, session, access.token_param)
        if not access.admits(key.role):
            allowed = ", ".join(sorted({*access.roles, Role.admin}))
            raise Forbidden(f"authorization: role {key.role.value!r} may not use this route (allowed: {allowed})")
        if key.datasets is None or access.dataset in (ANY, SERVICE):
            return
        if access.dataset is None:
            raise Forbidden(
                f"authorization: key {key.name!r} is scoped to datasets; this route spans every dataset"
            )
        values = _dataset_values(request, access.dataset)
        if not values:
            raise Forbidden(f"{access.dataset}: required for a key scoped to datasets {sorted(key.datasets)}")
        for value in values:
            key.check_dataset(value, access.dataset)

    check.access = access  # type: ignore[attr-defined]
    return Depends(check)


def allow(
    *roles: Role, dataset: str | None = None, public_setting: str | None = None, token_param: str | None = None,
    session_param: str | None = None,
) -> Any:
    """The route admits ``roles`` (and admin); see the module docstring for ``dataset``. ``token_param``:
    the path parameter that may carry the token instead of the Authorization header. ``session_param``:
    the path parameter naming a session whose own key (``SessionKey``) the route admits too."""
    access = Access(frozenset(roles), dataset=dataset, public_setting=public_setting, token_param=token_param,
                    session_param=session_param)
    return _checker(access)


_TOKEN_TEXT = re.compile(TOKEN_PREFIX + r"([0-9a-f]{32})_[A-Za-z0-9_-]+")


def redact(text: str) -> str:
    """Tokens in ``text`` -> ``gck_<id>_***`` (the id names the key; the secret never reaches a log)."""
    return _TOKEN_TEXT.sub(lambda m: f"{TOKEN_PREFIX}{m.group(1)}_***", text)


class RedactTokens(logging.Filter):
    """A logging filter for access logs: a token in a request path is logged redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        record.msg = redact(record.msg) if isinstance(record.msg, str) else record.msg
        return True


def public() -> Any:
    """The route is open to everyone, with or without a key. Its check is async and takes no session: a
    public route (``/healthz``) costs neither a database connection nor a threadpool thread."""
    access = Access(frozenset(), public=True)

    async def check() -> None:
        return None

    check.access = access  # type: ignore[attr-defined]
    return Depends(check)


def _access(dependencies: list[Any]) -> Access | None:
    found = [a for d in dependencies if (a := getattr(d.dependency, "access", None)) is not None]
    return found[0] if len(found) == 1 else None


def declared_routes(app: FastAPI) -> list[tuple[str, str, Access | None]]:
    """(method, path, declaration or None) for every route of the app, included routers flattened. A route
    that is not an APIRoute (Starlette's Route, a Mount, a WebSocket route) cannot carry a declaration, so
    it is listed with None: ``check_routes`` refuses it (serve such a thing from a declared APIRoute)."""
    out: list[tuple[str, str, Access | None]] = []
    for route in app.routes:
        # FastAPI >= 0.16x keeps included routers as one entry that expands into route contexts
        contexts = route.effective_route_contexts() if hasattr(route, "effective_route_contexts") else [route]
        for ctx in contexts:
            original = getattr(ctx, "original_route", ctx)
            if not isinstance(original, APIRoute):  # a plain Route, Mount, WebSocket route: nothing checks it
                path = getattr(ctx, "path", "") or getattr(original, "path", repr(original))
                out.extend((m, path, None) for m in sorted(getattr(original, "methods", None) or {"*"}))
                continue
            path = getattr(ctx, "path", "") or original.path
            access = _access(list(getattr(ctx, "dependencies", None) or original.dependencies))
            methods = getattr(ctx, "methods", None) or original.methods
            assert methods is not None  # FastAPI gives every APIRoute a set of methods (GET when none is named)
            out.extend((method, path, access) for method in sorted(methods))
    return out


def check_routes(app: FastAPI) -> None:
    """Refuse an app with a route that declares no access (or more than one)."""
    missing = [f"{method} {path}" for method, path, access in declared_routes(app) if access is None]
    if missing:
        raise RuntimeError(
            "routes without exactly one access declaration (add dependencies=[allow(...)] or "
            f"[public()] to the decorator): {'; '.join(missing)}"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

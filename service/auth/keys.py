"""API keys: create (the token is returned once, never stored), list, revoke; and ``provision`` for
tools that start their own service (the demo)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service.api.errors import BadRequest, Conflict, NotFound
from service.auth import repository as key_repo
from service.auth.service import Role, new_token
from service.store.db import get_engine, make_sessionmaker

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def create_key(session: Session, name: str, role: str, datasets: Iterable[str] | None = None) -> str:
    """Store a new key; returns its token (shown once: only a hash of its secret is stored)."""
    if not _NAME.match(name):
        raise BadRequest("name: 1-128 characters from A-Z a-z 0-9 . _ @ -, starting with a letter or digit")
    try:
        role_ = Role(role)
    except ValueError:
        raise BadRequest(f"role: unknown role {role!r}; valid: {', '.join(r.value for r in Role)}") from None
    scope = sorted(set(datasets)) if datasets else None
    if scope is not None and role_ == Role.admin:
        raise BadRequest("dataset: admin keys cannot be scoped to datasets")
    if scope is not None and any(not d for d in scope):
        raise BadRequest("dataset: empty dataset name")
    if key_repo.key_by_name(session, name) is not None:
        raise Conflict(f"name: a key named {name!r} already exists (revoked names are not reused)")
    key_id, digest, token = new_token()
    key_repo.insert_key(
        session, {"id": key_id, "name": name, "role": role_.value, "datasets": scope, "secret_hash": digest}
    )
    return token


def list_keys(session: Session) -> list[dict[str, Any]]:
    """Every key without its secret: name, role, datasets, created_at, revoked_at."""
    return [
        {
            "name": k.name,
            "role": k.role,
            "datasets": k.datasets,
            "created_at": k.created_at.isoformat(),
            "revoked_at": None if k.revoked_at is None else k.revoked_at.isoformat(),
        }
        for k in key_repo.list_keys(session)
    ]


def revoke_key(session: Session, name: str) -> None:
    if not key_repo.revoke(session, name):
        raise NotFound(f"name: no active key named {name!r}")


def provision(database_url: str, keys: dict[str, str]) -> dict[str, str]:
    """Create keys ``{name: role}`` in the (migrated) database; returns ``{name: token}``."""
    factory = make_sessionmaker(get_engine(database_url))
    with factory.begin() as session:
        return {name: create_key(session, name, role) for name, role in keys.items()}


def provision_local(data_dir: Path, keys: dict[str, str]) -> dict[str, str]:
    """``provision`` in the embedded PostgreSQL of ``data_dir`` (started, and migrated, here); for tools
    such as the demo that start their own service with auth on."""
    from service.settings import Settings
    from service.store.db import resolve_database_url
    from service.store.migrate import upgrade

    url = resolve_database_url(Settings(data_dir=data_dir, database_url=None))
    upgrade(url)
    return provision(url, keys)


def any_key(session: Session) -> bool:
    """Whether any key was ever created (revoked ones count: auth stays on)."""
    return key_repo.any_key(session)

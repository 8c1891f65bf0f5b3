"""Fixtures shared by the service tests: an admin key, and clients that answer a server error with a 500
response instead of raising it (a hostile-input test then reports the status it got)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.auth import keys
from tests.helpers import bearer


@pytest.fixture
def admin(session: Session) -> dict[str, str]:
    """The Authorization header of an admin key created in the test's transaction (auth is on)."""
    token = keys.create_key(session, "atk-admin", "admin")
    session.commit()
    return bearer(token)


@pytest.fixture
def lenient_client(session: Session, db_url: str) -> Iterator[TestClient]:
    """As conftest's ``client``, but a 500 comes back as a response (so the test reports the status it got)."""
    from service.api.deps import get_session
    from service.app import create_app

    app = create_app(database_url=db_url)

    def joined_session() -> Iterator[Session]:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

    app.dependency_overrides[get_session] = joined_session
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def lenient_api(fresh_db: str) -> Iterator[TestClient]:
    """As conftest's ``api`` (requests really commit, ``.factory`` for the worker), but a 500 comes back
    as a response."""
    from service.app import create_app
    from service.store.db import get_engine, make_sessionmaker

    app = create_app(database_url=fresh_db)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.factory = make_sessionmaker(get_engine(fresh_db))
        yield c
    app.state.engine.dispose()


@pytest.fixture
def app_client(make_db) -> Iterator[tuple[TestClient, str]]:
    """A fresh database and the real app, with that database's URL; server errors come back as HTTP 500
    instead of raising."""
    from service.app import create_app

    url = make_db()
    with TestClient(create_app(database_url=url), raise_server_exceptions=False) as c:
        yield c, url

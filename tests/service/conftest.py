"""Fixtures shared by the service tests that run the real score / curate worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker


@pytest.fixture(scope="module")
def scorer() -> Iterator[Scorer]:
    """One real Scorer (a killable process pool) per test module."""
    with Scorer(processes=1, timeout_s=20) as s:
        yield s


@pytest.fixture
def api(fresh_db: str) -> Iterator:
    """TestClient over a fresh database whose requests really commit (the worker reads them);
    ``api.factory`` is a session factory on the same database for the worker."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(database_url=fresh_db)) as c:
        c.factory = make_sessionmaker(get_engine(fresh_db))
        yield c

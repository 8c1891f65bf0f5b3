"""A trainer key publishes one policy version at a time (latest + 1); an admin key may set any higher version.

Attack (round 2, /tmp/attack-svc/b_policy.py): one trainer publish of version 2**31 - 1 turned every ready
group stale; afterwards nothing could be published (the column's maximum) and leases with max_staleness
returned nothing, irreversibly.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth import keys
from service.store.models import PolicyState
from tests.helpers import bearer


@pytest.fixture
def tokens(session: Session) -> dict[str, str]:
    made = {role: keys.create_key(session, f"k-{role}", role) for role in ("trainer", "admin")}
    session.commit()
    return made


def _versions(session: Session) -> list[int]:
    session.expire_all()
    return list(session.execute(select(PolicyState.version).order_by(PolicyState.version)).scalars())


def test_a_trainer_key_cannot_jump_to_the_top_of_the_version_range(client: TestClient, session: Session,
                                                                   tokens: dict[str, str]) -> None:
    trainer = bearer(tokens["trainer"])
    r = client.post("/v1/policy", json={"version": 2**31 - 1, "metrics": {}}, headers=trainer)
    assert r.status_code == 409, r.text
    assert r.json()["error"].startswith("version: expected 1") and r.json()["detail"]["expected"] == 1
    assert _versions(session) == []  # nothing stored
    assert client.post("/v1/policy", json={"version": 1, "metrics": {}}, headers=trainer).status_code == 201
    r = client.post("/v1/policy", json={"version": 3, "metrics": {}}, headers=trainer)  # skips 2
    assert r.status_code == 409 and r.json()["detail"]["expected"] == 2
    assert client.post("/v1/policy", json={"version": 2, "metrics": {}}, headers=trainer).status_code == 201
    # an idempotent retry of the latest still answers 200
    assert client.post("/v1/policy", json={"version": 2, "metrics": {}}, headers=trainer).status_code == 200
    assert _versions(session) == [1, 2]


def test_an_admin_key_may_set_any_higher_version_for_recovery(client: TestClient, session: Session,
                                                              tokens: dict[str, str]) -> None:
    admin, trainer = bearer(tokens["admin"]), bearer(tokens["trainer"])
    assert client.post("/v1/policy", json={"version": 40, "metrics": {}}, headers=admin).status_code == 201
    assert client.post("/v1/policy", json={"version": 42, "metrics": {}}, headers=trainer).status_code == 409
    assert client.post("/v1/policy", json={"version": 41, "metrics": {}}, headers=trainer).status_code == 201
    r = client.post("/v1/policy", json={"version": 3, "metrics": {}}, headers=admin)
    assert r.status_code == 409  # still strictly increasing
    assert _versions(session) == [40, 41]

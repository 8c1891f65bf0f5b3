"""Request bodies are bounded by what they cost to parse, not only by bytes; metadata by its JSON size.

Attack (round 2, /tmp/attack-svc/h_bigbody.py): a 48 MB POST /v1/groups whose metadata was 6M tiny objects
peaked at 3.5 GB of server RSS: under max_body_bytes, but every object became Python objects (several times
over). Now a body with more objects + arrays than ``max_body_containers`` is a 413 before it is parsed, and a
group's or trajectory's metadata above ``max_metadata_bytes`` is a 422 naming the field; nothing is stored.
"""

from __future__ import annotations

import orjson
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.api.deps import get_session
from service.app import create_app
from service.settings import Settings
from service.store.models import Group
from tests.helpers import make_group


def _client(session: Session, db_url: str, **settings: object) -> TestClient:
    app = create_app(Settings(database_url=db_url, **settings), database_url=db_url)

    def joined() -> object:
        yield session

    app.dependency_overrides[get_session] = joined
    return TestClient(app)


def _groups(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Group))


def test_a_body_of_a_million_tiny_objects_is_413_before_it_is_parsed(session: Session, db_url: str) -> None:
    group = make_group("g-many", metadata={"x": []})
    body = orjson.dumps(group).replace(b'"x":[]', b'"x":[' + b",".join([b'{"a":1}'] * 1_200_000) + b"]")
    with _client(session, db_url) as c:  # the default settings
        r = c.post("/v1/groups", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    assert "max_body_containers" in r.json()["error"] and r.json()["detail"][0]["field"] == "body"
    assert _groups(session) == 0


def test_the_body_limits_name_their_settings(session: Session, db_url: str) -> None:
    with _client(session, db_url, max_body_containers=50, max_body_bytes=200_000) as c:
        assert c.post("/v1/groups", json=make_group("g-ok", n=2)).status_code == 201  # a real group fits
        r = c.post("/v1/groups", json={"groups": [make_group(f"g-{i}", prompt_id=f"p-{i}") for i in range(20)]})
        assert r.status_code == 413 and "(max_body_containers)" in r.json()["error"]
        r = c.post("/v1/groups", json=make_group("g-big", metadata={"x": "y" * 300_000}))
        assert r.status_code == 413 and "(max_body_bytes)" in r.json()["error"]
    assert _groups(session) == 1


def test_metadata_above_max_metadata_bytes_is_422_naming_the_field(session: Session, db_url: str) -> None:
    with _client(session, db_url, max_metadata_bytes=1000) as c:
        big = {"notes": "n" * 2000}
        ok = make_group("g-a", prompt_id="p-a", metadata={"run": "r1"})
        bad = make_group("g-b", prompt_id="p-b")
        bad["trajectories"][1]["metadata"] = big
        r = c.post("/v1/groups", json={"groups": [ok, bad]})
        assert r.status_code == 422, r.text
        assert r.json()["error"].startswith("groups[1].trajectories[1].metadata:")
        assert "max_metadata_bytes" in r.json()["error"]
        r = c.post("/v1/groups", json=make_group("g-c", prompt_id="p-c", metadata=big))
        assert r.status_code == 422 and r.json()["error"].startswith("metadata:")
    assert _groups(session) == 0  # all or nothing

"""What a call costs (docs/agents.md, "What a call costs"), counted on the API's own engine: once a session's
call went through this process, each next call is two statements (the reservation, the answer) and no ping;
a call that finds the session changed since (a segment mark, another process's write, time run out) reads the
session first and decides as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from service.settings import Settings
from tests.service.sessions.helpers import USER, age
from tests.service.sessions.upstreams import Upstream


@pytest.fixture
def api(fake: Upstream, fresh_db: str) -> Iterator[tuple[TestClient, list[str]]]:
    from service.app import create_app

    app = create_app(Settings(database_url=fresh_db, inference_url=fake.url, embedded_worker=False,
                              session_max_seconds=600))
    statements: list[str] = []
    event.listen(app.state.engine, "before_cursor_execute",
                 lambda conn, cursor, sql, params, context, many: statements.append(sql.split(None, 1)[0].upper()))
    with TestClient(app) as client:
        yield client, statements


def _open(client: TestClient) -> dict[str, Any]:
    r = client.post("/v1/sessions", json={"group_id": "g-cost", "group_size": 1, "policy_version": 0,
                                          "prompt_id": "cost", "prompt": {"dataset": "agents", "messages": USER,
                                                                            "reference": {"answer": "5"}}})
    assert r.status_code == 201, r.text
    return {**r.json(), "headers": {"Authorization": f"Bearer {r.json()['api_key']}"}}


def _call(client: TestClient, session: dict[str, Any], statements: list[str]) -> tuple[int, list[str]]:
    statements.clear()
    r = client.post(f"/v1/sessions/{session['session_id']}/chat/completions", headers=session["headers"],
                    json={"model": "fake", "messages": USER, "max_tokens": 4})
    return r.status_code, list(statements)


def test_a_session_s_next_call_is_two_statements(api) -> None:
    client, statements = api
    session = _open(client)
    status, first = _call(client, session, statements)  # its key looked up, the session read (the group's first call)
    assert status == 200 and first[-2:] == ["WITH", "WITH"] and "SELECT" in first, first
    status, second = _call(client, session, statements)  # read again: its group had made no call before the first
    assert status == 200 and second == ["SELECT", "WITH", "WITH"], second
    for _ in range(3):
        status, next_ = _call(client, session, statements)
        assert status == 200 and next_ == ["WITH", "WITH"], next_  # reserve, store; nothing read, no ping


def test_a_call_reads_the_session_a_segment_mark_or_time_changed(api, fresh_db: str) -> None:
    client, statements = api
    session = _open(client)
    for _ in range(2):
        assert _call(client, session, statements)[0] == 200
    r = client.post(f"/v1/sessions/{session['session_id']}/segment", headers=session["headers"])
    assert r.status_code == 200 and r.json()["marked"]
    status, after_mark = _call(client, session, statements)  # the reservation finds another count: read, reserve
    assert status == 200 and after_mark == ["WITH", "SELECT", "WITH", "WITH"], after_mark
    with client.app.state.engine.begin() as db:  # another process's write: the session's tokens moved
        db.execute(text("UPDATE agent_sessions SET n_tokens = n_tokens + 1 WHERE id = :s"),
                   {"s": session["session_id"]})
    status, after_write = _call(client, session, statements)
    assert status == 200 and after_write == ["WITH", "SELECT", "WITH", "WITH"], after_write
    age(fresh_db, session, seconds=601)  # its wall time runs out: the session's start moved, so it is read
    status, late = _call(client, session, statements)
    assert status == 409, late
    assert client.get(f"/v1/sessions/{session['session_id']}", headers=session["headers"]).json()[
        "finish_reason"] == "timeout"


# Attack on the fast path (helper-42): B's first call, its timestamp taken before its reservation waited on B's
# row (a finish of B held it), was stored as earlier than A's calls made meanwhile, so B's call became the group's
# first and the group's temperature B's. The process that knew A kept A's first call's temperature and let A
# sample at it; another process followed the database. The state that race leaves is written directly here.
def test_a_call_reads_the_session_when_its_group_s_first_call_changed(api) -> None:
    client, statements = api

    def opened(group: str) -> dict[str, Any]:
        r = client.post("/v1/sessions", json={"group_id": group, "group_size": 2, "policy_version": 0,
                                              "prompt_id": "cost", "prompt": {"dataset": "agents", "messages": USER,
                                                                                "reference": {"answer": "5"}}})
        assert r.status_code == 201, r.text
        return {**r.json(), "headers": {"Authorization": f"Bearer {r.json()['api_key']}"}}

    def call(session: dict[str, Any], temperature: float) -> int:
        r = client.post(f"/v1/sessions/{session['session_id']}/chat/completions", headers=session["headers"],
                        json={"model": "fake", "messages": USER, "max_tokens": 4, "temperature": temperature})
        return r.status_code

    a, b = opened("g-first"), opened("g-first")
    assert [call(a, 0.5) for _ in range(3)] == [200] * 3  # A's first call is the group's: 0.5; A known now
    assert call(b, 1.0) == 400 and call(b, 0.5) == 200
    with client.app.state.engine.begin() as db:  # B's call at 1.0, stored as the group's first
        db.execute(text("UPDATE session_calls SET created_at = created_at - interval '1 hour', "
                        "request = jsonb_set(request, '{temperature}', '1.0') WHERE session_id = :s"),
                   {"s": b["session_id"]})
    statements.clear()
    assert call(a, 0.5) == 400, "sampled at the temperature of a call that is no longer the group's first"
    assert "SELECT" in statements, statements  # the reservation found the group changed: the session was read
    assert call(a, 1.0) == 200 and call(b, 1.0) == 200

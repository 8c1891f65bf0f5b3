"""A session key (``gcs_...``) is its own kind of credential, with auth on (API keys exist): it reaches its
own session's gateway routes and nothing else -- not another session (403), not a forged secret (401),
not one non-gateway route of the app (403, generated from the routes' declarations, nothing stored) --
and once its session finished it forwards and writes nothing (calls are a 409, a second finish changes
nothing), keeping only the read of its own session's outcome."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from service.app import create_app
from service.auth.keys import provision
from service.auth.service import declared_routes
from service.store.db import dispose_engine
from tests.conftest import LiveServer, start_server, stop_server
from tests.helpers import bearer, end_the_backend_it_waits_on, make_group
from tests.service.sessions.conftest import GATEWAY_ENV
from tests.service.sessions.helpers import HTTP
from tests.service.sessions.upstreams import Upstream

USER = [{"role": "user", "content": "add 2 and 3"}]
CHAT = {"model": "fake", "messages": USER, "max_tokens": 4}


@pytest.fixture(scope="module")
def keyed(make_db: Callable[..., str], fake: Upstream) -> Iterator[tuple[LiveServer, dict[str, str], str]]:
    db = make_db()
    tokens = provision(db, {"prod": "producer", "ops": "admin"})
    dispose_engine(db)
    server = start_server(db, env={**GATEWAY_ENV, "GRPO_CURATOR_INFERENCE_URL": fake.url})
    yield server, tokens, db
    stop_server(server)


def _open(url: str, producer: str) -> dict[str, Any]:
    body = {"group_id": f"g-{uuid.uuid4().hex[:8]}", "group_size": 1, "policy_version": 0, "prompt_id": "agent-add",
            "prompt": {"dataset": "agents", "messages": USER, "reference": {"answer": "5"}}}
    r = HTTP.post(url + "/v1/sessions", json=body, headers=bearer(producer))
    assert r.status_code == 201, r.text
    return r.json()


def _n_calls(session: dict[str, Any], admin: str) -> int:
    r = HTTP.get(session["base_url"], headers=bearer(admin))
    assert r.status_code == 200, r.text
    return r.json()["n_calls"]


def test_a_session_key_reaches_only_its_own_session(keyed: tuple[LiveServer, dict[str, str], str]) -> None:
    server, tokens, _ = keyed
    a, b = _open(server.url, tokens["prod"]), _open(server.url, tokens["prod"])
    a_key = bearer(a["api_key"])
    r = HTTP.post(a["base_url"] + "/chat/completions", json=CHAT, headers=a_key)
    assert r.status_code == 200, r.text  # its own session: forwarded
    for method, route, body in [("POST", "/chat/completions", CHAT), ("POST", "/completions", {"prompt": "x"}),
                                ("POST", "/finish", {}), ("GET", "", None)]:
        r = HTTP.request(method, b["base_url"] + route, json=body, headers=a_key)
        assert r.status_code == 403 and "another session" in r.json()["error"], (route, r.text)
    forged = bearer(f"gcs_{b['session_id']}_{a['api_key'].rsplit('_', 1)[1]}")  # B's id, A's secret
    assert HTTP.get(b["base_url"], headers=forged).status_code == 401
    assert HTTP.post(b["base_url"] + "/chat/completions", json=CHAT, headers=forged).status_code == 401
    unknown = f"{server.url}/v1/sessions/{'0' * 32}"
    assert HTTP.get(unknown, headers=bearer(f"gcs_{'0' * 32}_x")).status_code == 401
    assert _n_calls(b, tokens["ops"]) == 0 and _n_calls(a, tokens["ops"]) == 1


def _url(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path) + "?dataset=agents"


def test_a_session_key_is_refused_on_every_non_gateway_route(keyed: tuple[LiveServer, dict[str, str], str]) -> None:
    server, tokens, db = keyed
    session = _open(server.url, tokens["prod"])
    key = bearer(session["api_key"])
    routes = [(m, p, a) for m, p, a in declared_routes(create_app(database_url=db))
              if a is not None and not a.public and a.session_param is None]
    dispose_engine(db)
    assert {("POST", "/v1/groups"), ("POST", "/v1/batches/lease"), ("POST", "/v1/sessions")} <= {(m, p) for m, p, _ in routes}
    failures = []
    for method, path, _ in routes:
        body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
        r = HTTP.request(method, server.url + _url(path), headers=key, **body)
        if r.status_code != 403 or "only on its own session's routes" not in r.json()["error"]:
            failures.append(f"{method} {path} -> {r.status_code}: {r.text[:120]}")
    assert not failures, "\n".join(failures)
    # a well-formed request changes nothing either
    group = make_group("sk-group", dataset="agents")
    assert HTTP.post(server.url + "/v1/groups", json=group, headers=key).status_code == 403
    assert HTTP.get(server.url + "/v1/groups/sk-group", headers=bearer(tokens["ops"])).status_code == 404
    lease = HTTP.post(server.url + "/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1}, headers=key)
    assert lease.status_code == 403
    new = {"group_id": "sk-new", "group_size": 1, "policy_version": 0, "prompt_id": "agent-add"}
    assert HTTP.post(server.url + "/v1/sessions", json=new, headers=key).status_code == 403


def test_a_session_key_is_spent_once_its_session_finished(keyed: tuple[LiveServer, dict[str, str], str]) -> None:
    server, tokens, _ = keyed
    session = _open(server.url, tokens["prod"])
    key = bearer(session["api_key"])
    assert HTTP.post(session["base_url"] + "/chat/completions", json=CHAT, headers=key).status_code == 200
    done = HTTP.post(session["base_url"] + "/finish", json={"final_answer": "fak"}, headers=key)
    assert done.status_code == 200 and done.json()["finish_reason"] == "stop"
    for route, body in [("/chat/completions", CHAT), ("/completions", {"prompt": [1, 2]})]:
        r = HTTP.post(session["base_url"] + route, json=body, headers=key)
        assert r.status_code == 409 and r.json()["detail"]["finish_reason"] == "stop", r.text
    again = HTTP.post(session["base_url"] + "/finish", json={"final_answer": "6", "finish_reason": "env_error"},
                      headers=key)
    assert again.status_code == 200 and again.json()["finish_reason"] == "stop"
    state = HTTP.get(session["base_url"], headers=key)  # it still reads its own outcome
    assert state.status_code == 200
    assert state.json()["n_calls"] == 1 and state.json()["final_answer"] == "fak" and state.json()["status"] == "finished"
    assert HTTP.get(server.url + "/v1/groups/" + state.json()["group_id"], headers=key).status_code == 403


def test_a_producer_key_calls_a_session_and_every_answered_call_is_stored(
    keyed: tuple[LiveServer, dict[str, str], str],
) -> None:
    """The gateway's other credential: a producer API key (its check ends the reservation's first transaction,
    and what follows is still committed before the answer)."""
    server, tokens, _ = keyed
    session = _open(server.url, tokens["prod"])
    for _ in range(2):
        r = HTTP.post(session["base_url"] + "/chat/completions", json=CHAT, headers=bearer(tokens["prod"]))
        assert r.status_code == 200, r.text
    state = HTTP.get(session["base_url"], params={"include_tokens": "true"}, headers=bearer(tokens["ops"])).json()
    assert state["n_calls"] == 2 and [c["index"] for c in state["calls"]] == [0, 1]
    assert all(c["completion_token_ids"] and c["error"] is None for c in state["calls"])


# Attack on the gateway's fast path (helper-42): a key's first lookup on a backend that PostgreSQL terminates
# (pg_terminate_backend, a restart; no longer pinged first when the connection was back in the pool < 10 s ago)
# was a 500 -- its ``finally: commit`` replaced the error with SQLAlchemy's PendingRollbackError -- where the
# error is the database's, a 503 to retry.
def test_a_session_keys_first_lookup_on_a_terminated_backend_is_a_503_to_retry(
        keyed: tuple[LiveServer, dict[str, str], str]) -> None:
    server, tokens, db = keyed
    session = _open(server.url, tokens["prod"])  # its key never used: the GET below looks it up
    r = end_the_backend_it_waits_on(
        db, "agent_sessions", lambda: HTTP.get(session["base_url"], headers=bearer(session["api_key"])))
    assert r.status_code == 503 and r.headers.get("retry-after") and "unavailable" in r.json()["error"], r.text
    again = HTTP.get(session["base_url"], headers=bearer(session["api_key"]))  # nothing of it was kept
    assert again.status_code == 200 and again.json()["session_id"] == session["session_id"], again.text

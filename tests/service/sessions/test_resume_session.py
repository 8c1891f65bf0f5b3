"""Resume through the agent gateway, over real HTTP, the real API in a subprocess and fake_vllm (vLLM's wire
format): a member cut by the budget makes its group wait with a resume request; a session opened with
``resume`` starts from the checkpoint, continues it under the current policy and, on finish, fills that
slot of the same group; the member's tokens carry -1 / the old version / the new one, and the group is
scored, curated and leased with it. Bad resume requests name the field and store nothing; a continuation
that does not extend the checkpoint fills nothing (the slot stays open)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from filters.advantages import compute_advantages
from filters.types import AdvantageConfig
from service.client import CuratorClient
from service.store.db import dispose_engine, get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.conftest import Databases, LiveServer, start_server, stop_server
from tests.helpers import assert_client_error
from tests.service.sessions.conftest import GATEWAY_ENV
from tests.service.sessions.fake_upstream import COMPLETION_IDS
from tests.service.sessions.helpers import HTTP, end_next, finish, group, open_session, read, say, set_mode
from tests.service.sessions.upstreams import Upstream

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}
PROMPT = [1, 5, 6, 7]
TOOL = [8, 9]  # a tool's result, rendered into the second call's prompt
C = COMPLETION_IDS  # what fake_vllm generates for every call


@contextlib.contextmanager
def _resume_gateway(db_url: str, fake: Upstream) -> Iterator[LiveServer]:
    """The API on ``db_url`` over ``fake``, its dataset ``agents`` scored by ``math`` and curated by a policy
    that resumes a member cut by the budget (once)."""
    server = start_server(db_url, env={**GATEWAY_ENV, "GRPO_CURATOR_INFERENCE_URL": fake.url})
    try:
        with httpx.Client(base_url=server.url) as c:
            assert c.post("/v1/reward-specs", json=SPEC).status_code == 201
            assert c.post("/v1/curation-policies", json={
                "name": "resume", "finish_reason_actions": {"length": "resume"}, "resample_wait_seconds": 3600,
                "max_resumes": 1}).status_code == 201
            assert c.put("/v1/datasets/agents", json={"reward_spec": "math", "curation_policy": "resume"}).status_code == 200
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def gateway(make_db: Databases, fake: Upstream) -> Iterator[LiveServer]:
    """One API for the module: each test cuts and resumes a group of its own (its own group id), and reads
    only that group; what one test leaves (another group waiting, ready, a newer policy version) is nothing
    another test reads. The test that reads the whole service (the sampling requests of ``agents``, a lease)
    runs on ``own_gateway``."""
    url = make_db()
    with _resume_gateway(url, fake) as server:
        yield server
    dispose_engine(url)  # this process's pooled connections (``_drain``, ``_n_sessions``)
    make_db.retire(url)


@pytest.fixture
def own_gateway(fresh_db: str, fake: Upstream) -> Iterator[LiveServer]:
    """The API on a database of the test's own (nothing else waiting, ready or requested there)."""
    with _resume_gateway(fresh_db, fake) as server:
        yield server


def _complete(fake: Upstream, session: dict[str, Any], prompt: list[int], text: str | None = None
              ) -> dict[str, Any]:
    """One completion; ``text`` is what the fake model "says" (a final_answer must occur in it)."""
    if text is not None:
        say(fake.url, text)
    r = HTTP.post(session["base_url"] + "/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 4,
                                                              "temperature": 1.0},
                  headers={"Authorization": f"Bearer {session['api_key']}"})
    assert r.status_code == 200, r.text
    return r.json()


def _cut_group(fake: Upstream, url: str, gid: str) -> None:
    """Three members answer (right, wrong, right) in one call; the fourth makes two calls (a tool's result
    in between) and is cut by the budget."""
    for answer in ("\\boxed{5}", "\\boxed{4}", "\\boxed{5}"):
        s = open_session(url, gid, group_size=4)
        _complete(fake, s, PROMPT, answer)
        finish(s, final_answer=answer)
    s = open_session(url, gid, group_size=4)
    _complete(fake, s, PROMPT)
    end_next(fake.url, "length")  # the upstream cuts it at its max_tokens: a length the record shows
    _complete(fake, s, PROMPT + C + TOOL)
    assert finish(s, finish_reason="length")["group_ingested"] is True


def _resume(url: str, body: dict[str, Any]) -> httpx.Response:
    return HTTP.post(url + "/v1/sessions", json=body)


def _drain(server: LiveServer, scorer) -> None:
    drain(make_sessionmaker(get_engine(server.db_url)), scorer, timeout_s=60)


def _n_sessions(server: LiveServer) -> int:
    with get_engine(server.db_url).connect() as conn:
        return conn.execute(text("SELECT count(*) FROM agent_sessions")).scalar_one()


def test_a_cut_member_resumed_through_the_gateway_rejoins_its_group_and_trains(
    own_gateway: LiveServer, fake: Upstream, scorer
) -> None:
    gateway = own_gateway  # the only resume request of ``agents`` and the only group to lease are this test's
    _cut_group(fake, gateway.url, "g")
    _drain(gateway, scorer)
    before = group(gateway.url, "g")
    assert before["status"] == "waiting"
    k = len(PROMPT + C + TOOL)  # the checkpoint: before the cut call's completion (every tool result in it)
    assert before["trajectories"][3]["metadata"]["checkpoint"] == {"tokens": k, "messages": 0}

    with CuratorClient(gateway.url) as c:
        [req] = [r for r in c.sampling_requests(10, producer_id="p", dataset="agents") if r["reason"] == "resume"]
    assert (req["group_id"], req["index"]) == ("g", 3)
    old_versions = [-1] * len(PROMPT) + [0] * len(C) + [-1] * len(TOOL)
    assert req["checkpoint"]["token_ids"] == PROMPT + C + TOOL and req["checkpoint"]["versions"] == old_versions

    r = _resume(gateway.url, {"resume": {"group_id": "g", "index": 3}, "policy_version": 1})
    assert r.status_code == 201, r.text
    session = {**r.json(), "group_id": "g"}
    assert session["checkpoint"]["token_ids"] == PROMPT + C + TOOL
    _complete(fake, session, session["checkpoint"]["token_ids"], "\\boxed{5}")  # continue from it: no tool runs again
    done = finish(session, final_answer="\\boxed{5}")
    assert done["group_ingested"] is True  # the slot is filled
    state = read(session, tokens=False)
    assert state["group_id"] == "g" and state["error"] is None
    with CuratorClient(gateway.url) as c:
        c.sampling_done([req["request_id"]])

    _drain(gateway, scorer)
    g = group(gateway.url, "g")
    assert g["status"] == "ready"
    member = g["trajectories"][3]
    assert member["token_ids"] == PROMPT + C + TOOL + C
    assert member["loss_mask"] == [0] * 4 + [1] * 4 + [0] * 2 + [1] * 4
    assert member["versions"] == old_versions + [1] * len(C)  # -1 / the old version / the new one
    assert member["logprobs"][:k] == pytest.approx(before["trajectories"][3]["logprobs"][:k])
    assert member["metadata"]["resumed_from"]["checkpoint_tokens"] == k
    totals = [t["total_reward"] for t in g["trajectories"]]
    assert totals == [1.0, 0.0, 1.0, 1.0]
    ref = compute_advantages(np.array(totals), AdvantageConfig(), np.zeros(4, dtype=bool))
    np.testing.assert_allclose([t["advantage"] for t in g["trajectories"]], ref)
    assert (3, "resume", "remedy_filled") in {(d["index"], d["action"], d["rule"]) for d in g["decisions"]}

    with CuratorClient(gateway.url) as c:  # the group trains: a trainer leases it with the mixed versions
        batch = c.lease("t", max_groups=1)
        [leased] = batch["groups"]
        assert leased["id"] == "g"
        leased_member = next(t for t in leased["trajectories"] if t["index"] == 3)
        assert leased_member["versions"] == old_versions + [1] * len(C)


def test_a_resumed_member_cut_again_is_resumed_at_most_max_resumes_times(
    gateway: LiveServer, fake: Upstream, scorer
) -> None:
    _cut_group(fake, gateway.url, "m")
    _drain(gateway, scorer)
    r = _resume(gateway.url, {"resume": {"group_id": "m", "index": 3}, "policy_version": 1})
    session = r.json()
    end_next(fake.url, "length")
    _complete(fake, session, session["checkpoint"]["token_ids"])
    assert finish(session, finish_reason="length")["group_ingested"] is True  # filled, but cut again
    _drain(gateway, scorer)
    g = group(gateway.url, "m")
    assert g["status"] == "ready"  # max_resumes 1: no second wait
    assert g["trajectories"][3]["action"] == "resume" and g["trajectories"][3]["advantage"] == 0.0
    rules = {(d["index"], d["rule"]) for d in g["decisions"]}
    assert (3, "remedy_exhausted") in rules
    again = _resume(gateway.url, {"resume": {"group_id": "m", "index": 3}, "policy_version": 2})
    assert_client_error(again, "resume.index", (409,))


def test_a_continuation_that_does_not_extend_the_checkpoint_fills_nothing(
    gateway: LiveServer, fake: Upstream, scorer
) -> None:
    _cut_group(fake, gateway.url, "s")
    _drain(gateway, scorer)
    session = _resume(gateway.url, {"resume": {"group_id": "s", "index": 3}, "policy_version": 1}).json()
    _complete(fake, session, [1, 99, 98], "\\boxed{5}")  # the agent rewrote its history: a new segment
    assert finish(session, final_answer="\\boxed{5}")["group_ingested"] is False
    state = read(session, tokens=False)
    assert "resume" in state["error"] and "extend the checkpoint" in state["error"]
    g = group(gateway.url, "s")
    assert g["status"] == "waiting"  # the slot stays open for another try until its deadline
    assert g["trajectories"][3]["token_ids"] == PROMPT + C + TOOL + C
    retry = _resume(gateway.url, {"resume": {"group_id": "s", "index": 3}, "policy_version": 1})
    assert retry.status_code == 201, retry.text


BAD = [
    ({"resume": {"group_id": "b", "index": 0}, "policy_version": 1}, "resume.index", (409,)),  # a member that answered
    ({"resume": {"group_id": "b", "index": 9}, "policy_version": 1}, "resume.index", (422,)),
    ({"resume": {"group_id": "nope", "index": 3}, "policy_version": 1}, "resume.group_id", (404,)),
    ({"resume": {"group_id": "b", "index": 3}, "policy_version": 1, "group_id": "b"}, "group_id", (422,)),
    ({"resume": {"group_id": "b", "index": 3}, "policy_version": 1, "prompt_id": "x"}, "prompt_id", (422,)),
    ({"resume": {"group_id": "b", "index": -1}, "policy_version": 1}, "index", (422,)),
    ({"resume": {"group_id": "b"}, "policy_version": 1}, "index", (422,)),
    ({"resume": {"group_id": "b", "index": 3}}, "policy_version", (422,)),
    ({"policy_version": 1, "prompt_id": "x"}, "group_id", (422,)),
]


def test_bad_resume_sessions_name_the_field_and_store_nothing(
    gateway: LiveServer, fake: Upstream, scorer
) -> None:
    _cut_group(fake, gateway.url, "b")
    _drain(gateway, scorer)
    n = _n_sessions(gateway)
    for body, field, status in BAD:
        assert_client_error(_resume(gateway.url, body), field, status)
    assert _n_sessions(gateway) == n
    assert group(gateway.url, "b")["status"] == "waiting"


def test_a_continuation_served_by_a_newer_policy_fills_its_slot(gateway: LiveServer, fake: Upstream, scorer) -> None:
    """Attack: the trainer published version 7 while a producer resumed an episode in a session opened at 6;
    the upstream (already serving 7) tagged the continuation with 7, and the fill -- posted at the session's
    6 -- was refused, so the slot waited out its deadline. The fill is posted by the newest version that
    generated its tokens."""
    _cut_group(fake, gateway.url, "v")
    _drain(gateway, scorer)
    assert group(gateway.url, "v")["status"] == "waiting"
    for v in range(1, 8):
        assert HTTP.post(gateway.url + "/v1/policy", json={"version": v}).status_code in (200, 201)
    r = _resume(gateway.url, {"resume": {"group_id": "v", "index": 3}, "policy_version": 6})
    assert r.status_code == 201, r.text
    session = {**r.json(), "group_id": "v"}
    set_mode(fake.url, "version-7")
    try:
        _complete(fake, session, session["checkpoint"]["token_ids"], "\\boxed{5}")
    finally:
        set_mode(fake.url, "ok")
    done = finish(session, final_answer="\\boxed{5}")
    assert done["group_ingested"] is True, read(session, tokens=False)["error"]
    _drain(gateway, scorer)
    g = group(gateway.url, "v")
    assert g["status"] == "ready", g
    assert 7 in g["trajectories"][3]["versions"]  # the continuation's tokens keep the version that made them

"""Resume through the gateway, its two guards, over real HTTP with the API in a subprocess and fake_vllm
(docs/curation.md, "Resume"): one open session at a time per slot (a second is a 409 naming
``resume.index``), and a resume session that finishes without an answered call adds no token, so it fills
nothing (the refusal recorded on the session, the slot open until its deadline) — never a cut member
turned into a positive."""

from __future__ import annotations

from tests.helpers import assert_client_error
from tests.service.sessions.helpers import finish, group, read
from tests.service.sessions.test_resume_session import _complete, _cut_group, _drain, _resume, gateway

__all__ = ["gateway"]  # the fixture, shared with test_resume_session


def test_a_second_session_for_an_open_resume_slot_is_a_409(gateway, fake, scorer) -> None:
    _cut_group(fake, gateway.url, "o")
    _drain(gateway, scorer)
    body = {"resume": {"group_id": "o", "index": 3}, "policy_version": 1}
    first = _resume(gateway.url, body)
    assert first.status_code == 201, first.text
    assert_client_error(_resume(gateway.url, body), "resume.index", (409,))
    session = first.json()
    _complete(fake, session, session["checkpoint"]["token_ids"])
    assert finish(session)["group_ingested"] is True
    assert group(gateway.url, "o")["status"] == "received"


def test_a_resume_session_finished_without_a_call_fills_nothing(gateway, fake, scorer) -> None:
    _cut_group(fake, gateway.url, "n")
    _drain(gateway, scorer)
    before = group(gateway.url, "n")
    body = {"resume": {"group_id": "n", "index": 3}, "policy_version": 1}
    session = _resume(gateway.url, body).json()
    assert finish(session)["group_ingested"] is False
    state = read(session, tokens=False)
    assert "resume" in state["error"] and "trajectory.token_ids" in state["error"]
    _drain(gateway, scorer)
    after = group(gateway.url, "n")
    assert after["status"] == "waiting"  # not a positive: the slot waits for a real continuation
    assert after["trajectories"][3] == before["trajectories"][3]
    retry = _resume(gateway.url, body)  # the finished session no longer holds the slot
    assert retry.status_code == 201, retry.text

"""An agent's summary checkpoint (issue 22 item 5; docs/agents.md, "Segments"): ``POST
/v1/sessions/{id}/segment`` makes the session's next call start a new segment of its one trajectory, even
when that call's prompt extends the last one; each segment holds its own calls' tokens, mask 1 exactly on
their completions and log-probs aligned, nothing misaligned. The mark is durable (a row among the calls)
and counts against no limit. The agent is the `openai` SDK sending token ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.fake_upstream import COMPLETION_IDS
from tests.service.sessions.helpers import HTTP, agent, finish, group, open_session, read
from tests.service.sessions.upstreams import Upstream

P = [1, 11, 12, 13, 4]
LP = -0.25  # the fake's log-prob of every completion token


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2")


def _segment(session: dict[str, Any], key: str | None = None) -> httpx.Response:
    return HTTP.post(session["base_url"] + "/segment", headers={"Authorization": f"Bearer {key or session['api_key']}"})


def _two_calls(session: dict[str, Any], mark: bool) -> None:
    client = agent(session)
    client.completions.create(model="fake", prompt=P, max_tokens=4)
    if mark:
        r = _segment(session)
        assert r.status_code == 200 and r.json() == {"session_id": session["session_id"], "marks": 1, "marked": True}
        again = _segment(session)  # nothing answered since: no second mark
        assert again.status_code == 200 and again.json()["marks"] == 1 and again.json()["marked"] is False
    client.completions.create(model="fake", prompt=P + COMPLETION_IDS + [50, 51], max_tokens=4)
    finish(session)


def test_a_segment_call_splits_the_trajectory_with_nothing_misaligned(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    _two_calls(session, mark=True)
    state = read(session, tokens=False)
    assert [c["kind"] for c in state["calls"]] == ["completions", "segment", "completions"]
    assert state["n_calls"] == 2 and state["finish_reason"] == "stop"  # 2 calls of max 2: the mark is no call
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["metadata"]["calls"] == [[0], [2]] and t["metadata"]["segment_marks"] == [2]
    assert t["metadata"]["prefix_mismatch"] == [None, None]
    first, second = t["segments"]
    assert (first["segment_index"], first["is_last"], second["segment_index"], second["is_last"]) == (0, False, 1, True)
    prompt2 = P + COMPLETION_IDS + [50, 51]
    assert first["token_ids"] == P + COMPLETION_IDS
    assert first["loss_mask"] == [0] * len(P) + [1] * 4 and first["logprobs"] == [0.0] * len(P) + [LP] * 4
    assert second["token_ids"] == prompt2 + COMPLETION_IDS
    assert second["loss_mask"] == [0] * len(prompt2) + [1] * 4
    assert second["logprobs"] == [0.0] * len(prompt2) + [LP] * 4


def test_without_a_mark_the_same_calls_are_one_segment(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    _two_calls(session, mark=False)
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t.get("segments") is None and t["token_ids"] == P + COMPLETION_IDS + [50, 51] + COMPLETION_IDS


def test_only_the_sessions_key_or_a_producer_marks_and_only_an_open_session(gateway: LiveServer) -> None:
    session, other = open_session(gateway.url), open_session(gateway.url)
    assert _segment(session, key=other["api_key"]).status_code == 403
    assert _segment(session, key="gcs_nope").status_code in (401, 403)
    assert _segment(session).json()["marked"] is False  # no call yet: nothing to split
    agent(session).completions.create(model="fake", prompt=P, max_tokens=4)
    finish(session)
    r = _segment(session)
    assert r.status_code == 409 and r.json()["error"].startswith("session_id"), r.text

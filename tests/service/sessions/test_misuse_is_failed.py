"""A session that misused a tool is the model's failure, a negative, whatever happens after (docs/agents.md,
"Whose failure is it"): a right answer in a later call does not earn it the outcome, and a misuse session
still open at the group's deadline is a member of its group (``tool_misuse``), never left out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import (
    HTTP,
    TOOLS,
    USER,
    age,
    chat_call,
    finish_call,
    open_session,
    read,
    say,
    set_mode,
)
from tests.service.sessions.upstreams import Upstream


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    return gateway_for(fake.url, GRPO_CURATOR_EMBEDDED_WORKER="true", GRPO_CURATOR_WORKER_POLL_SECONDS="0.2",
                       GRPO_CURATOR_SESSION_GROUP_DEADLINE_S="600")  # a group ``age``d past it is overdue


def _curated(url: str, group_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = HTTP.get(f"{url}/v1/groups/{group_id}")
        if r.status_code == 200 and r.json()["status"] in ("ready", "dropped", "waiting"):
            return r.json()
        time.sleep(0.3)
    raise AssertionError(f"group {group_id} was not curated in {timeout_s} s")


def _misuse(fake: Upstream, session: dict[str, Any]) -> dict[str, Any]:
    """One call whose answer calls ``add`` with arguments that are not JSON (the fake's bad-tool mode)."""
    set_mode(fake.url, "bad-tool")
    try:
        r = chat_call(session, tools=TOOLS)
    finally:
        set_mode(fake.url, "ok")
    assert r.status_code == 200 and read(session, tokens=False)["misuse"]
    return r.json()["choices"][0]["message"]


def test_a_right_answer_after_a_misuse_earns_no_outcome(gateway: LiveServer, fake: Upstream) -> None:
    misused = open_session(gateway.url, group_size=2)
    right = open_session(gateway.url, group_id=misused["group_id"], group_size=2)
    call = _misuse(fake, misused)
    history = [*USER, {"role": "assistant", "content": "", "tool_calls": call["tool_calls"]},
               {"role": "tool", "tool_call_id": "c1", "content": "error: arguments not JSON"}]
    say(fake.url, "5")
    assert chat_call(misused, messages=history, tools=TOOLS).status_code == 200  # then answers right
    assert finish_call(misused, final_answer="5").json()["finish_reason"] == "tool_misuse"
    say(fake.url, "5")
    assert chat_call(right).status_code == 200
    assert finish_call(right, final_answer="5").json()["group_ingested"]
    group = _curated(gateway.url, misused["group_id"])
    by_session = {t["metadata"]["session_id"]: t for t in group["trajectories"]}
    bad, good = by_session[misused["session_id"]], by_session[right["session_id"]]
    assert bad["finish_reason"] == "tool_misuse" and bad["final_answer"] == "5"
    assert bad["outcome"] == 0.0 and bad["total_reward"] == 0.0 and good["outcome"] == 1.0
    assert group["status"] == "ready" and bad["advantage"] < 0 < good["advantage"]  # a negative, trained


def test_a_misuse_session_open_at_the_deadline_is_a_negative_member(gateway: LiveServer, fake: Upstream) -> None:
    misused = open_session(gateway.url, group_size=3)
    right = open_session(gateway.url, group_id=misused["group_id"], group_size=3)
    idle = open_session(gateway.url, group_id=misused["group_id"], group_size=3)
    _misuse(fake, misused)  # and never finished
    assert chat_call(idle).status_code == 200  # answered, never finished, no misuse: left out
    say(fake.url, "5")
    assert chat_call(right).status_code == 200
    assert finish_call(right, final_answer="5").json()["group_ingested"] is False
    age(gateway.db_url, misused, right, idle, seconds=601)  # the group deadline passes (the wall time, 3600 s, does not)
    group = _curated(gateway.url, misused["group_id"])  # the worker's sweep, after the deadline
    meta = group["metadata"]
    assert sorted(meta["sessions"]) == sorted([misused["session_id"], right["session_id"]])
    assert meta["left_out_sessions"] == [idle["session_id"]]
    by_session = {t["metadata"]["session_id"]: t for t in group["trajectories"]}
    bad = by_session[misused["session_id"]]
    assert bad["finish_reason"] == "tool_misuse" and bad["outcome"] == 0.0
    assert group["status"] == "ready" and bad["advantage"] < 0 < by_session[right["session_id"]]["advantage"]
    state = read(misused, tokens=False)
    assert state["finish_reason"] == "tool_misuse" and state["ingested"] and state["error"] is None
    assert read(idle, tokens=False)["finish_reason"] == "timeout"

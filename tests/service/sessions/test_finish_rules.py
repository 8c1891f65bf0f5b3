"""What an agent may and may not claim at finish, and how a group ends (docs/agents.md, "Finish", "Whose
failure is it"): a tool misuse the gateway saw wins over any reason the agent or a later limit gives;
rewards never overwrite the producer's metadata; the answer scored is the model's (a final_answer must be
the end of its last completion, never cut from inside a word; no answered call is the environment's failure); a group that cannot be
posted is recorded and never retried; the group deadline ends open sessions even when none finished and
refuses new members; a group trains at one temperature; a malformed agent request is a 400."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import (
    HTTP,
    TOOLS,
    age,
    chat_call,
    finish_call,
    group,
    open_session,
    read,
    say,
    set_mode,
)
from tests.service.sessions.upstreams import Upstream


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The module's API: a call limit of 2, a group deadline of 600 s (a group ``age``d past it is overdue;
    the wall time stays the default 3600 s)."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2", GRPO_CURATOR_SESSION_GROUP_DEADLINE_S="600")


@pytest.fixture(scope="module")
def swept(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The module's other API: its own worker sweeping group deadlines of 60 s (a group ``age``d past one is
    overdue; the wall time stays the default 3600 s), and a sequence limit of 8 tokens, below every prompt of
    the fake's (a group of this API cannot be posted). Its two tests each read one of these: the deadline's
    group has no finished session (nothing is posted, whatever its length), and the group that cannot be
    posted is finished at once, far from any deadline."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_GROUP_DEADLINE_S="60", GRPO_CURATOR_EMBEDDED_WORKER="true",
                       GRPO_CURATOR_WORKER_POLL_SECONDS="0.2", GRPO_CURATOR_MAX_SEQUENCE_TOKENS="8")


def _join(gateway: LiveServer, session: dict[str, Any], size: int) -> httpx.Response:
    return HTTP.post(gateway.url + "/v1/sessions", json={
        "group_id": session["group_id"], "group_size": size, "policy_version": 0, "prompt_id": "agent-add",
        "prompt": {"dataset": "agents", "messages": [{"role": "user", "content": "add 2 and 3"}],
                   "reference": {"answer": "5"}}})


def _misused(gateway: LiveServer, fake: Upstream) -> dict[str, Any]:
    session = open_session(gateway.url)
    set_mode(fake.url, "bad-tool")
    try:
        assert chat_call(session, tools=TOOLS).status_code == 200
    finally:
        set_mode(fake.url, "ok")
    assert read(session, tokens=False)["misuse"]
    return session


@pytest.mark.parametrize("claim", [{"finish_reason": "tool_failure", "error": "backend down"}, {"error": "x"},
                                   {"finish_reason": "timeout"}, {"finish_reason": "aborted"},
                                   {"finish_reason": "stop"}])
def test_the_misuse_the_gateway_saw_wins_over_what_the_agent_claims(
    gateway: LiveServer, fake: Upstream, claim: dict[str, Any]
) -> None:
    session = _misused(gateway, fake)
    assert finish_call(session, **claim).json()["finish_reason"] == "tool_misuse"
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "tool_misuse"


def test_the_call_limit_after_a_misuse_ends_the_session_as_tool_misuse(gateway: LiveServer, fake: Upstream) -> None:
    session = _misused(gateway, fake)
    assert chat_call(session).status_code == 200
    assert chat_call(session).status_code == 409  # max_calls 2
    assert read(session, tokens=False)["finish_reason"] == "tool_misuse"


@pytest.mark.parametrize(("route", "body", "named"), [
    ("/completions", {"prompt": ["a", "b"]}, "prompt"), ("/completions", {"prompt": {"x": 1}}, "prompt"),
    ("/chat/completions", {"messages": ["hi"]}, "messages"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": -1}, "max_tokens"),
])
def test_a_malformed_agent_request_is_a_400_naming_the_field_never_an_environment_failure(
    gateway: LiveServer, route: str, body: dict[str, Any], named: str
) -> None:
    session = open_session(gateway.url)
    r = HTTP.post(session["base_url"] + route, json={"model": "fake", **body},
                  headers={"Authorization": f"Bearer {session['api_key']}"})
    assert r.status_code == 400 and r.json()["error"].startswith(named), r.text
    state = read(session, tokens=False)
    assert state["status"] == "open" and state["n_calls"] == 0


@pytest.mark.parametrize("key", ["difficulty", "session_id", "tool_misuse"])
def test_a_reward_key_may_not_overwrite_session_metadata(gateway: LiveServer, key: str) -> None:
    session = open_session(gateway.url, metadata={"difficulty": 3})
    assert chat_call(session).status_code == 200
    r = finish_call(session, rewards={"reward": 1.0, key: 0.0})
    assert r.status_code == 422 and r.json()["error"].startswith(f"rewards.{key}"), r.text
    assert read(session, tokens=False)["status"] == "open"  # nothing of the refused finish stored
    assert finish_call(session, rewards={"reward": 1.0}).status_code == 200
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["metadata"]["difficulty"] == 3 and t["metadata"]["reward"] == 1.0
    assert t["metadata"]["session_id"] == session["session_id"]


def test_the_answer_scored_is_the_models(gateway: LiveServer, fake: Upstream) -> None:
    session = open_session(gateway.url)
    say(fake.url, "so it is \\boxed{5}")
    assert chat_call(session).status_code == 200
    r = finish_call(session, final_answer="\\boxed{6}")  # not what the model said
    assert r.status_code == 422 and r.json()["error"].startswith("final_answer"), r.text
    assert read(session, tokens=False)["status"] == "open"
    assert finish_call(session, final_answer="\\boxed{5}").status_code == 200  # cut out of its text
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["final_answer"] == "\\boxed{5}"
    bare = open_session(gateway.url)
    say(fake.url, "it is 7")
    assert chat_call(bare).status_code == 200
    finish_call(bare)
    (t,) = group(gateway.url, bare["group_id"])["trajectories"]
    assert t["final_answer"] == "it is 7"  # no final_answer: the last completion's text


@pytest.mark.parametrize(("said", "claimed", "ok"), [
    ("15", "5", False), ("the answer is 15", "5", False), ("5 apples, not 6", "5", False),  # not its last word
    ("x 5", "x", False),  # out of the middle
    ("15", "15", True), ("  15 ", "15", True), ("the answer is 15", "15", True), ("so x=5", "5", True),
    ("so it is \\boxed{5}", "\\boxed{5}", True),
])
def test_the_final_answer_is_the_end_of_the_models_last_completion_never_a_substring(
    gateway: LiveServer, fake: Upstream, said: str, claimed: str, ok: bool
) -> None:
    session = open_session(gateway.url)
    say(fake.url, said)
    assert chat_call(session).status_code == 200
    r = finish_call(session, final_answer=claimed)
    assert r.status_code == (200 if ok else 422), r.text
    if not ok:
        assert r.json()["error"].startswith("final_answer") and read(session, tokens=False)["status"] == "open"


def test_the_final_answer_is_taken_from_the_last_completion_not_an_earlier_one(
    gateway: LiveServer, fake: Upstream
) -> None:
    session = open_session(gateway.url)
    say(fake.url, "5")
    assert chat_call(session).status_code == 200
    say(fake.url, "let me check")
    assert chat_call(session).status_code == 200
    assert finish_call(session, final_answer="5").status_code == 422


def test_a_session_with_no_answered_call_is_an_environment_failure(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    assert finish_call(session, final_answer="5").status_code == 422  # nothing generated holds it
    done = finish_call(session)
    assert done.status_code == 200 and done.json()["finish_reason"] == "env_error"
    assert "no answered call" in read(session, tokens=False)["error"]
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "env_error" and t["outcome"] is None


def test_a_group_trains_at_one_temperature(gateway: LiveServer) -> None:
    a = open_session(gateway.url, group_size=2)
    b = open_session(gateway.url, group_id=a["group_id"], group_size=2)
    assert chat_call(a, temperature=0.7).status_code == 200
    for session, t in ((a, 0.05), (b, 3.0), (b, None)):
        extra = {} if t is None else {"temperature": t}
        r = chat_call(session, **extra)
        assert r.status_code == 400 and r.json()["error"].startswith("temperature"), r.text
    assert chat_call(b, temperature=0.7).status_code == 200
    assert read(b, tokens=False)["n_calls"] == 1  # the refused calls were not stored
    finish_call(a)
    finish_call(b)
    assert group(gateway.url, a["group_id"])["sampling"]["temperature"] == 0.7


# Attack (helper-43): two sessions' first calls at once, at two temperatures, each saw no call in the group and
# each was stored: a group trained at two temperatures (20 of 40 rounds, before and after the fast path). A
# group's first call is reserved under the group's lock: one of them is first, the other a 400 (nothing stored).
def test_concurrent_first_calls_of_a_group_fix_one_temperature(gateway: LiveServer) -> None:
    import threading

    for _ in range(20):
        a = open_session(gateway.url, group_size=2)
        b = open_session(gateway.url, group_id=a["group_id"], group_size=2)
        start: threading.Barrier = threading.Barrier(2)
        answers: dict[float, int] = {}

        def first(session: dict[str, Any], t: float, start: threading.Barrier, answers: dict[float, int]) -> None:
            start.wait()
            answers[t] = chat_call(session, temperature=t).status_code

        threads = [threading.Thread(target=first, args=(s, t, start, answers)) for s, t in ((a, 0.5), (b, 1.0))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(answers.values()) == [200, 400], answers
        kept = 0.5 if answers[0.5] == 200 else 1.0
        assert read(a, tokens=False)["n_calls"] + read(b, tokens=False)["n_calls"] == 1
        loser = b if kept == 0.5 else a
        assert chat_call(loser, temperature=kept).status_code == 200  # the group's temperature, as the first's


def test_a_group_that_cannot_be_posted_is_recorded_and_never_retried(swept: LiveServer) -> None:
    gateway = swept  # a sequence limit of 8 tokens: the fake's prompts are longer
    session = open_session(gateway.url)
    assert chat_call(session).status_code == 200
    done = finish_call(session)
    assert done.status_code == 200 and done.json()["group_ingested"] is False
    state = read(session, tokens=False)
    assert state["status"] == "failed" and "exceed" in state["error"] and not state["ingested"]
    assert HTTP.get(f"{gateway.url}/v1/groups/{session['group_id']}").status_code == 404
    again = finish_call(session).json()  # nothing retries it
    assert again["status"] == "failed" and again["group_ingested"] is False
    r = _join(gateway, session, 1)
    assert r.status_code == 409 and r.json()["error"].startswith("group_id")


def test_the_deadline_ends_open_sessions_when_none_finished_and_refuses_new_members(swept: LiveServer) -> None:
    gateway = swept  # its worker sweeps group deadlines of 60 s
    session = open_session(gateway.url, group_size=2)
    assert chat_call(session).status_code == 200
    assert read(session, tokens=False)["status"] == "open"  # the worker leaves it be before the deadline
    age(gateway.db_url, session, seconds=61)  # the group deadline passes (the wall time, 3600 s, does not)
    deadline = time.monotonic() + 30
    while read(session, tokens=False)["status"] == "open" and time.monotonic() < deadline:
        time.sleep(0.2)
    state = read(session, tokens=False)
    assert state["status"] == "failed" and state["finish_reason"] == "timeout" and "deadline" in state["error"]
    assert chat_call(session).status_code == 409
    r = _join(gateway, session, 2)
    assert r.status_code == 409 and r.json()["error"].startswith("group_id"), r.text
    assert HTTP.get(f"{gateway.url}/v1/groups/{session['group_id']}").status_code == 404  # nothing to train


def test_the_deadline_refuses_new_members_without_a_worker(gateway: LiveServer) -> None:
    session = open_session(gateway.url, group_size=2)
    age(gateway.db_url, session, seconds=601)  # the group deadline passes (the wall time, 3600 s, does not)
    r = _join(gateway, session, 2)
    assert r.status_code == 409 and r.json()["error"].startswith("group_id"), r.text
    r = chat_call(session)  # the group's deadline is the session's too
    assert r.status_code == 409
    assert read(session, tokens=False)["finish_reason"] == "timeout"


@pytest.mark.parametrize("said", ["the answer is -5", "so it is 1.5", "x = 10^5", "the answer is 3,5", "\u22125",
                                  "it is 15"])
def test_a_final_answer_cut_after_a_sign_point_power_or_digit_is_refused(said: str) -> None:
    """Attack: "5" out of "-5", "1.5", "10^5" or "3,5" passed the word-boundary rule and flipped a wrong
    answer into a right one."""
    from service.api.errors import BadRequest
    from service.sessions.service import check_final_answer

    with pytest.raises(BadRequest):
        check_final_answer("5", [said])


@pytest.mark.parametrize(("said", "answer"), [("so it is 5", "5"), ("x=5", "5"), ("the answer: 5", "5"),
                                               ("it is \\boxed{5}", "\\boxed{5}"), ("5", "5"), ("(5)", "5)")])
def test_a_final_answer_cut_after_whitespace_or_an_opener_is_accepted(said: str, answer: str) -> None:
    from service.sessions.service import check_final_answer

    check_final_answer(answer, ["earlier call", said])

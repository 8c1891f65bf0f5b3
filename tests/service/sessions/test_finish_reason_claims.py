"""A finish_reason the agent claims is checked against the gateway's record (docs/agents.md, "What the agent
may claim at finish"): a cut (length, max_turns) or an environment failure escapes the negative, so it is
a 422 naming ``finish_reason`` (nothing stored, the session open) where the record contradicts it —
``length`` unless the last answered completion was cut at its max_tokens (or the tokens reached the limit,
or the upstream refused the call after it), ``max_turns`` and the environment's reasons after the model's
final answer (a message with no tool calls in a session that offers tools). Over real HTTP, the API in a
subprocess on its own PostgreSQL database, fake_vllm as the upstream."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import (
    TOOLS,
    USER,
    age,
    call_in_mode,
    chat_call,
    end_next,
    finish_call,
    group,
    open_session,
    read,
    set_mode,
)
from tests.service.sessions.upstreams import Upstream

ENVIRONMENT = ["tool_failure", "env_error", "timeout", "aborted"]
# USER renders to 20 prompt ids and fake_vllm generates 4: a call of 24 tokens, one of LONGER's 25
TOKEN_LIMIT = 25
LONGER = [{"role": "user", "content": "add 2 and 3!"}]


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2",
                       GRPO_CURATOR_SESSION_MAX_TOKENS=str(TOKEN_LIMIT))


@pytest.fixture(scope="module")
def roomy(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """Room for histories that grow (the default token limit), still a call limit of 2; a wall time of 600 s
    (a session ``age``d past it has run out of time)."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2", GRPO_CURATOR_SESSION_MAX_SECONDS="600")


def went_on(history: list[dict[str, Any]], answer: httpx.Response, turn: str = "and 4?") -> list[dict[str, Any]]:
    """The history after ``answer``: the model's message echoed, then the environment's next turn (a user
    simulator's, or a tool result after a tool call)."""
    message = answer.json()["choices"][0]["message"]
    echoed = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = message["tool_calls"]
        return [*history, {**echoed, "tool_calls": calls},
                *({"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in calls)]
    return [*history, echoed, {"role": "user", "content": turn}]


def _calls(fake: Upstream, session: dict[str, Any], ends: list[str], tools: bool = True) -> list[dict[str, Any]]:
    """One answered chat call per entry, ending as it says (``tool_calls``: a valid call of ``add``), each
    going on from the one before (``went_on``); returns the history after the last."""
    history = list(USER)
    for end in ends:
        end_next(fake.url, end)
        r = chat_call(session, messages=history, **({"tools": TOOLS} if tools else {}))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == end
        history = went_on(history, r)
    return history


def _refused(session: dict[str, Any], r: httpx.Response, claimed: str, n_calls: int) -> None:
    """A 422 naming finish_reason, and nothing of the finish stored: the session open as it was."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"].startswith("finish_reason") and body["detail"]["claimed"] == claimed, body
    assert claimed not in body["detail"]["allowed"]
    state = read(session, tokens=False)
    assert state["status"] == "open" and state["finish_reason"] is None and state["final_answer"] is None
    assert state["n_calls"] == n_calls and state["error"] is None


def _trained_as(gateway: LiveServer, session: dict[str, Any], reason: str) -> None:
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == reason


@pytest.mark.parametrize("claim", [{"finish_reason": "length"}, {"finish_reason": "max_turns"},
                                   {"finish_reason": "tool_failure"}, {"finish_reason": "stop"}, {"error": "x"}])
def test_zero_calls_is_the_environments_whatever_the_claim(gateway: LiveServer, claim: dict[str, Any]) -> None:
    session = open_session(gateway.url)
    r = finish_call(session, **claim)
    assert r.status_code == 200 and r.json()["finish_reason"] == "env_error", r.text


@pytest.mark.parametrize(("ends", "tools", "ok"), [
    (["length"], True, True), (["stop", "length"], True, True),  # the last answer was cut at its max_tokens
    (["length"], False, True),
    (["stop"], True, False), (["stop"], False, False),  # the model stopped: checked on every route
    (["length", "stop"], True, False),  # an earlier cut is not the last word
    (["tool_calls"], True, False),  # the model wanted to go on, but nothing cut it by length: max_turns
])
def test_length_is_taken_only_when_the_last_answer_was_cut(
    roomy: LiveServer, fake: Upstream, ends: list[str], tools: bool, ok: bool
) -> None:
    gateway = roomy
    session = open_session(gateway.url)
    _calls(fake, session, ends, tools)
    r = finish_call(session, finish_reason="length", final_answer="fak" if ends[-1] != "tool_calls" else None)
    if not ok:
        _refused(session, r, "length", len(ends))
        r = finish_call(session)  # the agent finishes again: the model's last completion is scored
        assert r.status_code == 200 and r.json()["finish_reason"] == "stop", r.text
        _trained_as(gateway, session, "stop")
        return
    assert r.status_code == 200 and r.json()["finish_reason"] == "length", r.text
    _trained_as(gateway, session, "length")


def test_length_one_token_below_the_limit_is_refused_and_the_limit_exactly_reached_is_length(
    gateway: LiveServer, fake: Upstream
) -> None:
    below = open_session(gateway.url)
    assert chat_call(below).status_code == 200  # 24 tokens of 25
    assert read(below, tokens=False)["n_tokens"] == TOKEN_LIMIT - 1
    _refused(below, finish_call(below, finish_reason="length"), "length", 1)
    reached = open_session(gateway.url)
    assert chat_call(reached, messages=LONGER).status_code == 200  # 25 of 25: the gateway ends it
    state = read(reached, tokens=False)
    assert state["n_tokens"] == TOKEN_LIMIT and state["finish_reason"] == "length"
    r = finish_call(reached, finish_reason="length")
    assert r.status_code == 200 and r.json()["finish_reason"] == "length", r.text


def test_length_after_a_call_the_upstream_refused_is_taken(gateway: LiveServer, fake: Upstream) -> None:
    """The model asked for a tool; its next prompt was past the model's context (vLLM's 400)."""
    session = open_session(gateway.url)
    _calls(fake, session, ["tool_calls"])
    assert call_in_mode(fake.url, session, "refuse", tools=TOOLS).status_code == 400
    r = finish_call(session, finish_reason="length")
    assert r.status_code == 200 and r.json()["finish_reason"] == "length", r.text


def test_length_while_a_call_is_in_flight_is_refused(gateway: LiveServer, fake: Upstream) -> None:
    """A call in flight was refused by nobody: the model stopped, nothing cut it by a length."""
    import threading

    session = open_session(gateway.url)
    _calls(fake, session, ["stop"])
    set_mode(fake.url, "slow")  # the next call is in flight for 1.5 s
    try:
        flying = threading.Thread(target=chat_call, args=(session,))
        flying.start()
        deadline = time.monotonic() + 10
        while read(session, tokens=False)["n_calls"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = finish_call(session, finish_reason="length")
        assert r.status_code == 422 and r.json()["error"].startswith("finish_reason"), r.text
        flying.join(timeout=30)
    finally:
        set_mode(fake.url, "ok")
    assert read(session, tokens=False)["status"] == "open"


@pytest.mark.parametrize(("ends", "tools", "ok"), [
    (["tool_calls"], True, True), (["stop", "tool_calls"], True, True),  # the model asked for a tool
    (["length"], True, True),  # cut mid-answer: it wanted to go on
    (["stop"], False, True),  # no tools offered: the gateway cannot see a tool call in the text
    (["stop", "stop"], True, True),  # the environment answered the model's message (a conversation)
    (["stop"], True, False),  # the model's final answer: nothing cut it
    (["tool_calls", "stop"], True, False),  # its final answer at the call limit (2): no call was cut
])
def test_max_turns_is_refused_after_the_models_final_answer(
    roomy: LiveServer, fake: Upstream, ends: list[str], tools: bool, ok: bool
) -> None:
    gateway = roomy
    session = open_session(gateway.url)
    _calls(fake, session, ends, tools)
    r = finish_call(session, finish_reason="max_turns", rewards={"reward": 0.0})
    if not ok:
        _refused(session, r, "max_turns", len(ends))
        assert r.json()["detail"]["last_call"] == len(ends) - 1
        assert r.json()["detail"]["last_finish_reason"] == "stop"
        assert finish_call(session, rewards={"reward": 0.0}).json()["finish_reason"] == "stop"
        _trained_as(gateway, session, "stop")  # a negative, as the model's wrong answer must be
        return
    assert r.status_code == 200 and r.json()["finish_reason"] == "max_turns", r.text
    _trained_as(gateway, session, "max_turns")


@pytest.mark.parametrize("claim", [*({"finish_reason": r, "error": "down"} for r in ENVIRONMENT), {"error": "down"}])
def test_an_environment_failure_is_refused_after_the_models_final_answer(
    roomy: LiveServer, fake: Upstream, claim: dict[str, Any]
) -> None:
    gateway = roomy
    final = open_session(gateway.url)
    _calls(fake, final, ["tool_calls", "stop"])
    _refused(final, finish_call(final, **claim), claim.get("finish_reason", "env_error"), 2)
    asked = open_session(gateway.url)  # the model asked for a tool, then the environment failed
    _calls(fake, asked, ["tool_calls", "tool_calls"])
    r = finish_call(asked, **claim)
    assert r.status_code == 200 and r.json()["finish_reason"] == claim.get("finish_reason", "env_error"), r.text
    assert read(asked, tokens=False)["error"] == "down"
    untooled = open_session(gateway.url)  # no tools offered: nothing the record shows contradicts it
    _calls(fake, untooled, ["stop"], tools=False)
    assert finish_call(untooled, **claim).status_code == 200
    submitted = open_session(gateway.url)  # ... unless the agent submits the model's answer with it
    _calls(fake, submitted, ["stop"], tools=False)
    _refused(submitted, finish_call(submitted, final_answer="fak", **claim), claim.get("finish_reason", "env_error"), 1)


@pytest.mark.parametrize("claim", ["length", "max_turns", "tool_failure", "timeout"])
def test_a_misuse_the_gateway_saw_is_never_refused_nor_erased(
    gateway: LiveServer, fake: Upstream, claim: str
) -> None:
    """The model's tool misuse, then its final answer: whatever the claim, the negative stays (no 422)."""
    session = open_session(gateway.url)
    assert call_in_mode(fake.url, session, "bad-tool", tools=TOOLS).status_code == 200
    _calls(fake, session, ["stop"])
    r = finish_call(session, finish_reason=claim, error="backend down")
    assert r.status_code == 200 and r.json()["finish_reason"] == "tool_misuse", r.text
    _trained_as(gateway, session, "tool_misuse")


def test_a_late_finish_cuts_nothing_after_the_final_answer_but_times_out_a_cut_episode(
    roomy: LiveServer, fake: Upstream
) -> None:
    gateway = roomy
    final, cut = open_session(gateway.url), open_session(gateway.url)
    _calls(fake, final, ["tool_calls", "stop"])
    _calls(fake, cut, ["tool_calls"])
    age(gateway.db_url, final, cut, seconds=601)  # past the wall-time limit (a slow environment)
    assert finish_call(final).json()["finish_reason"] == "stop"
    assert finish_call(cut).json()["finish_reason"] == "timeout"

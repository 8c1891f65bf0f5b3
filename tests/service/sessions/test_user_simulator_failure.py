"""A conversation's environment failing is the environment's (docs/agents.md, "What the agent may claim at
finish"): in a user-simulator dialogue the model's message is a turn, and the environment may fail on its side
after it -- before its next turn, or with that turn sent and never answered (the upstream failing or refusing
it). The session is then dropped (``env_error``, never a negative), while an environment failure claimed
with the model's answer submitted (``final_answer``) is still refused. The episode went on when a call's history
is the last call's, the model's message, then a turn that is not the assistant's. Real HTTP, the API in a
subprocess on its own database, fake_vllm as the upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import (
    TOOLS,
    USER,
    call_in_mode,
    chat_call,
    finish_call,
    group,
    open_session,
    read,
)
from tests.service.sessions.upstreams import Upstream


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_CALL_TIMEOUT_S="1")


def _turn(s: dict[str, Any], history: list[dict[str, Any]], tools: bool) -> list[dict[str, Any]]:
    """The model answers ``history`` (a message without tool calls); the history with the user's next turn."""
    r = chat_call(s, messages=history, **({"tools": TOOLS} if tools else {}))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert not message.get("tool_calls")
    return [*history, {"role": "assistant", "content": message["content"]}, {"role": "user", "content": "and 4?"}]


def _dropped(url: str, s: dict[str, Any], reason: str = "env_error") -> None:
    (t,) = group(url, s["group_id"])["trajectories"]
    assert t["finish_reason"] == reason, t


@pytest.mark.parametrize("tools", [True, False])
def test_the_environment_failing_after_a_turn_of_a_conversation_is_dropped(
    gateway: LiveServer, fake: Upstream, tools: bool
) -> None:
    s = open_session(gateway.url)
    _turn(s, _turn(s, list(USER), tools), tools)  # two turns: the user simulator answered the first
    r = finish_call(s, finish_reason="env_error", error="user simulator down")
    assert r.status_code == 200 and r.json()["finish_reason"] == "env_error", r.text
    _dropped(gateway.url, s)


@pytest.mark.parametrize("tools", [True, False])
def test_the_users_turn_refused_upstream_is_the_environments(gateway: LiveServer, fake: Upstream,
                                                             tools: bool) -> None:
    """The model asked a question; the user's answer went out and the upstream refused it (past the context):
    the episode went on, so a cut or an environment failure is taken (was a 422 with tools)."""
    for claim in ("length", "env_error"):
        s = open_session(gateway.url)
        turn = _turn(s, list(USER), tools)
        assert call_in_mode(fake.url, s, "refuse", messages=turn, **({"tools": TOOLS} if tools else {})).status_code == 400
        r = finish_call(s, finish_reason=claim, error="user turn past the context")
        assert r.status_code == 200 and r.json()["finish_reason"] == claim, r.text


def test_the_users_turn_failing_upstream_ends_the_session_as_env_error(gateway: LiveServer, fake: Upstream) -> None:
    """The gateway ends it itself when the upstream fails the user's turn (a timeout): the environment's failure,
    dropped -- not ``stop`` with the model's question scored as its answer (it was)."""
    s = open_session(gateway.url)
    turn = _turn(s, list(USER), True)
    assert call_in_mode(fake.url, s, "slow", messages=turn, tools=TOOLS).status_code == 502
    state = read(s, tokens=False)
    assert state["status"] == "finished" and state["finish_reason"] == "env_error", state
    _dropped(gateway.url, s)


def test_an_environment_failure_with_the_answer_submitted_is_refused(gateway: LiveServer, fake: Upstream) -> None:
    """The agent that submits the model's last message as its answer says the episode ended there."""
    s = open_session(gateway.url)
    _turn(s, _turn(s, list(USER), False), False)
    r = finish_call(s, finish_reason="env_error", final_answer="fak")
    assert r.status_code == 422 and r.json()["detail"]["claimed"] == "env_error", r.text
    assert read(s, tokens=False)["status"] == "open"
    r = finish_call(s, final_answer="fak")
    assert r.status_code == 200 and r.json()["finish_reason"] == "stop", r.text

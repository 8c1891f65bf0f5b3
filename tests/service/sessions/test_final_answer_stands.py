"""The model's final answer stands (docs/agents.md): once the session's last answered call is a message
without tool calls, not cut, in a session that offers tools, nothing that comes after it -- a call in flight,
a call the upstream refuses, a call past a limit, a late call, never finishing -- turns its (wrong) answer into
a cut or an environment failure, which curation would mask or drop instead of training as a negative; nor
does an answered extra call that does not go on from it with a turn of the environment (the same prompt
again, a ``max_tokens=1`` call, a padded or rewritten prompt), on any route, with tools or without. Each
test is an attack on issue 21 that escaped before: the finish claim is a 422, or the session ends as ``stop``
and its answer is scored. Real HTTP, the API in a subprocess on its own database, fake_vllm as the upstream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import (
    HTTP,
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
    say,
    set_mode,
)
from tests.service.sessions.upstreams import Upstream

WRONG = "the answer is 7"  # the reference of the gateway's prompt is 5


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The module's API: a wall time of 600 s (a session ``age``d past it has run out of time; the group
    deadline stays the default 7200 s)."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="8", GRPO_CURATOR_SESSION_MAX_SECONDS="600")


@pytest.fixture(scope="module")
def limited(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The module's other API: a call limit of 2 (a call past it right after the final answer) and a group
    deadline of 600 s (a group ``age``d past it is overdue; the wall time stays the default 3600 s). Its
    tests' sessions make at most 2 calls each, and none is ``age``d but the deadline test's."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2", GRPO_CURATOR_SESSION_GROUP_DEADLINE_S="600")


def _final_wrong(fake: Upstream, s: dict[str, Any]) -> None:
    """A tool call, then the model's final (wrong) answer: a message without tool calls."""
    end_next(fake.url, "tool_calls")
    assert chat_call(s, tools=TOOLS).status_code == 200
    say(fake.url, WRONG)
    r = chat_call(s, tools=TOOLS, messages=[*USER, {"role": "assistant", "content": "x"}])
    assert r.status_code == 200 and r.json()["choices"][0]["message"].get("tool_calls") is None


def _scored_as_stop(url: str, s: dict[str, Any]) -> None:
    members = [t for t in group(url, s["group_id"])["trajectories"]
               if t["metadata"].get("session_id") == s["session_id"]]
    assert [t["finish_reason"] for t in members] == ["stop"], members


def test_a_call_in_flight_does_not_undo_the_final_answer(gateway: LiveServer, fake: Upstream) -> None:
    s = open_session(gateway.url)
    _final_wrong(fake, s)
    set_mode(fake.url, "slow")
    out: dict[str, Any] = {}
    try:
        t = threading.Thread(target=lambda: out.setdefault("r", chat_call(s, tools=TOOLS)))
        t.start()
        deadline = time.monotonic() + 10
        while read(s, tokens=False)["n_calls"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read(s, tokens=False)["n_calls"] == 3  # the extra call is in flight
        r = finish_call(s, finish_reason="tool_failure", error="backend down")
        t.join(30)
    finally:
        set_mode(fake.url, "ok")
    assert r.status_code == 422 and r.json()["detail"]["claimed"] == "tool_failure", r.text
    assert finish_call(s).json()["finish_reason"] == "stop"
    _scored_as_stop(gateway.url, s)


@pytest.mark.parametrize("claim", ["length", "tool_failure"])
def test_a_refused_call_after_the_final_answer_is_no_cut(gateway: LiveServer, fake: Upstream, claim: str) -> None:
    s = open_session(gateway.url)
    _final_wrong(fake, s)
    assert call_in_mode(fake.url, s, "refuse", tools=TOOLS).status_code == 400
    r = finish_call(s, finish_reason=claim)
    assert r.status_code == 422 and r.json()["detail"]["claimed"] == claim, r.text


@pytest.mark.parametrize(("api", "mode", "status"), [
    ("limited", "ok", 409),  # one call past the call limit (2)
    ("gateway", "stall", 502),  # a call that times out upstream (the fake answers past the 3 s call deadline)
])
def test_a_limit_or_failure_after_the_final_answer_ends_it_as_stop(request: pytest.FixtureRequest,
        fake: Upstream, api: str, mode: str, status: int) -> None:
    gw: LiveServer = request.getfixturevalue(api)
    s = open_session(gw.url)
    _final_wrong(fake, s)
    r = call_in_mode(fake.url, s, mode, tools=TOOLS)
    assert r.status_code == status, r.text
    state = read(s, tokens=False)
    assert state["status"] == "finished" and state["finish_reason"] == "stop", state
    _scored_as_stop(gw.url, s)


def test_a_late_call_after_the_final_answer_ends_it_as_stop(gateway: LiveServer, fake: Upstream) -> None:
    gw = gateway
    late, cut = open_session(gw.url), open_session(gw.url)
    _final_wrong(fake, late)
    end_next(fake.url, "tool_calls")  # the control: an episode still asking for tools when the time ran out
    assert chat_call(cut, tools=TOOLS).status_code == 200
    age(gw.db_url, late, cut, seconds=601)  # the wall time runs out (the group deadline does not)
    assert chat_call(late, tools=TOOLS).status_code == 409
    assert read(late, tokens=False)["finish_reason"] == "stop"
    _scored_as_stop(gw.url, late)
    assert chat_call(cut, tools=TOOLS).status_code == 409
    assert read(cut, tokens=False)["finish_reason"] == "timeout"


def test_never_finishing_after_the_final_answer_is_scored_at_the_deadline(limited: LiveServer, fake: Upstream) -> None:
    gw = limited
    gid = f"g-deadline-{time.monotonic_ns()}"
    silent, other, cut = (open_session(gw.url, gid, 3) for _ in range(3))
    _final_wrong(fake, silent)  # the agent never finishes it
    _final_wrong(fake, other)
    end_next(fake.url, "tool_calls")  # cut by the deadline while asking for a tool: left out, no negative
    assert chat_call(cut, tools=TOOLS).status_code == 200
    age(gw.db_url, silent, other, cut, seconds=601)  # the group deadline passes (below the wall time, 3600 s)
    assert finish_call(other).status_code == 200  # after the deadline: the group is posted now
    g = group(gw.url, gid)
    by_session = {t["metadata"]["session_id"]: t["finish_reason"] for t in g["trajectories"]}
    assert by_session == {silent["session_id"]: "stop", other["session_id"]: "stop"}, g
    assert g["metadata"]["left_out_sessions"] == [cut["session_id"]]
    assert read(cut, tokens=False)["finish_reason"] == "timeout"


def test_a_nul_the_model_generated_is_stored_not_a_500(gateway: LiveServer, fake: Upstream) -> None:
    s = open_session(gateway.url)
    say(fake.url, "the answer is\u0000 7")
    r = chat_call(s, tools=TOOLS)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "the answer is\u0000 7"
    (call,) = read(s)["calls"]
    assert call["attempts"] == 1 and call["error"] is None and call["completion_token_ids"]
    assert finish_call(s, finish_reason="tool_failure").status_code == 422  # a final answer, wrong as any
    assert finish_call(s).json()["finish_reason"] == "stop"
    _scored_as_stop(gateway.url, s)


FINAL = [*USER, {"role": "assistant", "content": "x"}]  # _final_wrong's last history (after the tool call)
# extra calls after the final answer that do not go on from it: the agent's, whatever they answer
EXTRA = {
    "the same prompt again": {"messages": FINAL},
    "max_tokens=1, cut": {"messages": FINAL, "max_tokens": 1, "finish": "length"},
    "asking for a tool": {"messages": FINAL, "finish": "tool_calls"},
    "padded": {"messages": [*FINAL, {"role": "user", "content": "pad " * 40}]},
    "only the assistant's words appended": {"messages": [*FINAL, {"role": "assistant", "content": WRONG},
                                                         {"role": "assistant", "content": "hm"}]},
    "an earlier history, cut": {"messages": USER, "finish": "length"},
}


@pytest.mark.parametrize("extra", EXTRA.values(), ids=EXTRA.keys())
@pytest.mark.parametrize("claim", ["length", "max_turns", "tool_failure", "env_error"])
def test_an_answered_extra_call_after_the_final_answer_launders_no_claim(
    gateway: LiveServer, fake: Upstream, extra: dict[str, Any], claim: str
) -> None:
    s = open_session(gateway.url)
    _final_wrong(fake, s)
    extra = dict(extra)
    end_next(fake.url, extra.pop("finish", "stop"))
    assert chat_call(s, tools=TOOLS, **extra).status_code == 200  # answered
    r = finish_call(s, finish_reason=claim, error="down")
    assert r.status_code == 422 and r.json()["detail"]["claimed"] == claim, r.text
    assert r.json()["detail"]["last_call"] == 1  # the final answer, not the extra call
    assert finish_call(s).json()["finish_reason"] == "stop"
    _scored_as_stop(gateway.url, s)


def test_the_environment_going_on_after_the_answer_is_no_extra_call(gateway: LiveServer, fake: Upstream) -> None:
    """The control: a user simulator's next turn after the model's message (its history, the message, a user
    message), answered and cut at its max_tokens: the episode went on, the cut is taken."""
    s = open_session(gateway.url)
    _final_wrong(fake, s)
    end_next(fake.url, "length")
    turn = [*FINAL, {"role": "assistant", "content": WRONG}, {"role": "user", "content": "why 7?"}]
    assert chat_call(s, tools=TOOLS, messages=turn).status_code == 200
    r = finish_call(s, finish_reason="length")
    assert r.status_code == 200 and r.json()["finish_reason"] == "length", r.text


def _completion(s: dict[str, Any], prompt: Any, **extra: Any) -> httpx.Response:
    return HTTP.post(s["base_url"] + "/completions", timeout=30, headers={"Authorization": f"Bearer {s['api_key']}"},
                     json={"model": "fake", "prompt": prompt, "max_tokens": 4, **extra})


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_without_tools_an_extra_call_launders_no_claim_and_a_submitted_answer_none(
    gateway: LiveServer, fake: Upstream, route: str
) -> None:
    """Where the gateway cannot see tool calls, a plain answer may be a text tool call whose backend failed (an
    environment failure is taken); but a max_tokens=1 replay makes no cut, and an agent that submits the
    answer (final_answer) says the model ended its episode: no environment failure with it."""
    s = open_session(gateway.url)
    say(fake.url, WRONG)
    first = (chat_call(s) if route == "chat" else _completion(s, "add 2 and 3"))
    assert first.status_code == 200, first.text
    end_next(fake.url, "length")
    again = (chat_call(s, max_tokens=1) if route == "chat" else _completion(s, "add 2 and 3", max_tokens=1))
    assert again.status_code == 200, again.text
    r = finish_call(s, finish_reason="length")
    assert r.status_code == 422 and r.json()["detail"]["last_call"] == 0, r.text
    r = finish_call(s, finish_reason="tool_failure", final_answer="fak")
    assert r.status_code == 422 and r.json()["detail"]["claimed"] == "tool_failure", r.text
    r = finish_call(s, finish_reason="tool_failure")
    assert r.status_code == 200 and r.json()["finish_reason"] == "tool_failure", r.text

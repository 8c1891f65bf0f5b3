"""Whose failure is it, and what survives: a dead upstream is the environment's (env_error, never a
negative); a session key reaches only its own session; a SIGKILL of the API loses no answered call;
limits end a session as max_turns; an answer the upstream aborted (vLLM's finish_reason "abort") ends the
session as aborted (the environment's) whatever the agent says at finish; streaming is refused with a 400 naming the field.
The upstream is fake_vllm where the rule holds whatever model answers; our transformers upstream (``tiny``)
where the test reads the real tokenizer's tokens (the call and token limits, a SIGKILL)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.service.sessions.conftest import GATEWAY_ENV
from tests.service.sessions.helpers import HTTP, age, agent, end_next, finish, group, open_session, read, turn
from tests.service.sessions.upstreams import Upstream, start_fake_vllm, start_infer, stop

USER = [{"role": "user", "content": "add 2 and 3"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    """Our transformers upstream over the tiny random model, built in its own process (``infer --tiny``): these
    tests read its tokenizer's tokens, never its weights, so none is saved for them (the package's
    ``upstream`` saves one for a test that loads the very same weights)."""
    server = start_infer(None)
    yield server
    stop(server)


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The module's API over fake_vllm (these are the gateway's rules, whatever model answers), a wall time of
    600 s (a session ``age``d past it has run out of time); each test its own session."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_SECONDS="600")


def test_upstream_killed_mid_session_ends_it_as_an_environment_failure(
    gateway_for: Callable[..., LiveServer]
) -> None:
    own = start_fake_vllm()  # an upstream of its own to kill (fake_vllm: starts in a fraction of a second)
    try:
        gateway = gateway_for(own.url)
        session = open_session(gateway.url)
        client = agent(session)
        first = turn(client, USER, seed=0, model="fake")
        own.kill()
        with pytest.raises(openai.APIStatusError) as failed:
            turn(client, [*USER, {"role": "assistant", "content": first.choices[0].message.content},
                          {"role": "user", "content": "go on"}], seed=1, model="fake")
        assert failed.value.status_code == 502
    finally:
        stop(own)
    state = read(session, tokens=False)
    assert state["finish_reason"] == "env_error" and state["calls"][1]["attempts"] > 1
    assert finish(session, finish_reason="stop")["finish_reason"] == "env_error"  # the agent cannot undo it
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "env_error" and t["outcome"] is None


def test_a_session_key_cannot_read_or_write_another_session(gateway: LiveServer) -> None:
    a, b = open_session(gateway.url), open_session(gateway.url)
    a_key = {"Authorization": f"Bearer {a['api_key']}"}
    body = {"model": "fake", "messages": USER, "max_tokens": 2}
    assert HTTP.post(b["base_url"] + "/chat/completions", json=body, headers=a_key).status_code == 403
    assert HTTP.get(b["base_url"], headers=a_key).status_code == 403
    assert HTTP.post(b["base_url"] + "/finish", json={}, headers=a_key).status_code == 403
    forged = {"Authorization": f"Bearer gcs_{b['session_id']}_guess"}
    assert HTTP.get(b["base_url"], headers=forged).status_code == 401
    assert read(b)["n_calls"] == 0 and read(b)["status"] == "open"


def test_streaming_is_refused_with_a_400_naming_the_field(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    r = HTTP.post(session["base_url"] + "/chat/completions", json={"messages": USER, "stream": True},
                  headers={"Authorization": f"Bearer {session['api_key']}"})
    assert r.status_code == 400 and r.json()["error"].startswith("stream")
    assert read(session)["n_calls"] == 0


def test_the_call_limit_ends_the_session_as_max_turns(gateway_for: Callable[..., LiveServer], upstream) -> None:
    gateway = gateway_for(upstream.url, GRPO_CURATOR_SESSION_MAX_CALLS="2")
    session = open_session(gateway.url)
    client, history = agent(session), list(USER)
    for seed in (0, 1):
        answer = turn(client, history, seed=seed)
        history += [{"role": "assistant", "content": answer.choices[0].message.content},
                    {"role": "user", "content": "go on"}]
    with pytest.raises(openai.APIStatusError) as refused:
        turn(client, history, seed=2)
    assert refused.value.status_code == 409
    assert read(session)["finish_reason"] == "max_turns"
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "max_turns"


def test_a_sigkill_of_the_api_between_two_calls_loses_no_answered_call(make_db, upstream) -> None:
    url = make_db()
    env = {**GATEWAY_ENV, "GRPO_CURATOR_INFERENCE_URL": upstream.url}
    server = start_server(url, env=env)
    try:
        session = open_session(server.url)
        first = turn(agent(session), USER, seed=0)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        server = start_server(url, env=env)  # the same database, a new port: the session goes on
        session = {**session, "base_url": f"{server.url}/v1/sessions/{session['session_id']}"}
        history = [*USER, {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "go on"}]
        turn(agent(session), history, seed=1)
        finish(session)
        calls = read(session)["calls"]
        assert [c["index"] for c in calls] == [0, 1]
        assert calls[0]["completion_token_ids"] and len(calls[0]["completion_token_ids"]) == len(
            first.choices[0].message.content or "") + (calls[0]["finish_reason"] == "stop")
        (t,) = group(server.url, session["group_id"])["trajectories"]
        assert t["token_ids"] == calls[1]["prompt_token_ids"] + calls[1]["completion_token_ids"]
    finally:
        stop_server(server)


def test_the_token_limit_ends_the_session_as_length(gateway_for: Callable[..., LiveServer], upstream) -> None:
    gateway = gateway_for(upstream.url, GRPO_CURATOR_SESSION_MAX_TOKENS="40")
    session = open_session(gateway.url)
    client = agent(session)
    turn(client, USER, seed=0)  # the tools preamble alone is over 40 tokens: this call reaches the limit
    assert read(session, tokens=False)["finish_reason"] == "length"
    with pytest.raises(openai.APIStatusError) as refused:
        turn(client, USER, seed=1)
    assert refused.value.status_code == 409 and read(session)["n_calls"] == 1
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "length" and sum(t["loss_mask"]) == len(read(session)["calls"][0]["completion_token_ids"])


def test_the_wall_time_limit_ends_the_session_as_timeout(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    age(gateway.db_url, session, seconds=601)  # the session's wall time runs out before its first call
    with pytest.raises(openai.APIStatusError) as refused:
        turn(agent(session), USER, seed=0, model="fake")
    assert refused.value.status_code == 409
    state = read(session)
    assert state["finish_reason"] == "timeout" and state["n_calls"] == 0
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "timeout" and t["outcome"] is None


@pytest.mark.parametrize("asked", [None, "stop"])
def test_an_upstream_abort_ends_the_session_as_aborted_never_a_negative(
    gateway: LiveServer, fake: Upstream, asked: str | None
) -> None:
    session = open_session(gateway.url)
    client = agent(session)
    end_next(fake.url, "abort")  # vLLM's answer for a request its engine gave up on
    try:
        answer = turn(client, USER, seed=0, model="fake")
        assert answer.choices[0].finish_reason == "abort"  # the agent sees what the upstream said
        state = read(session)
        assert state["status"] == "finished" and state["finish_reason"] == "aborted"
        assert state["calls"][0]["finish_reason"] == "abort" and state["calls"][0]["completion_token_ids"]
        with pytest.raises(openai.APIStatusError) as refused:  # the session takes no more calls
            turn(client, [*USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "go on"}], seed=1,
                 model="fake")
        assert refused.value.status_code == 409
        body = {} if asked is None else {"finish_reason": asked}
        assert finish(session, final_answer="5", **body)["finish_reason"] == "aborted"  # not undone
        (t,) = group(gateway.url, session["group_id"])["trajectories"]
        assert t["finish_reason"] == "aborted" and t["outcome"] is None
    finally:
        end_next(fake.url, "stop")  # whatever happened, the next test's answer is not an abort


def test_an_answer_that_finished_normally_is_not_an_abort(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    turn(agent(session), USER, seed=0, model="fake")
    assert read(session, tokens=False)["status"] == "open"
    assert finish(session, final_answer="fak")["finish_reason"] == "stop"

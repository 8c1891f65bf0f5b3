"""An upstream that answers garbage, and agents that race their own session (docs/agents.md, "Whose
failure is it" and "Limits"): log-probs outside ingest's range (non-finite, positive, below its floor) and token ids outside int32 are the
upstream's failure (502, env_error) before anything is answered; an unusable answer after a tool misuse
still ends the session as tool_misuse; concurrent calls never pass GRPO_CURATOR_SESSION_MAX_CALLS; a
call in flight when its session ends is refused (409) and nothing of its answer is kept."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import TOOLS, chat_call, finish_call, group, open_session, read, set_mode
from tests.service.sessions.upstreams import Upstream


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """One API for the module's tests (each opens its own session), a token budget of 1000 (for
    test_max_tokens_is_capped_to_the_sessions_token_budget; the others' calls use a few dozen)."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_TOKENS="1000")


@pytest.fixture(scope="module")
def limited(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The API at a call limit of 2."""
    return gateway_for(fake.url, GRPO_CURATOR_SESSION_MAX_CALLS="2")


@pytest.fixture
def hostile(fake: Upstream) -> Iterator[Callable[[str], None]]:
    yield lambda mode: set_mode(fake.url, mode)
    set_mode(fake.url, "ok")


@pytest.mark.parametrize(("mode", "named"), [
    ("nan", "logprobs[0]"), ("positive", "logprobs[0]"), ("abyss", "logprobs[0]"), ("negative-id", "token_ids[0]"),
    ("huge-id", "token_ids[0]"), ("list", "choices"),
])
def test_an_impossible_answer_is_the_upstreams_failure_before_it_is_answered(
    gateway: LiveServer, hostile: Callable[[str], None], mode: str, named: str
) -> None:
    session = open_session(gateway.url)
    hostile(mode)
    r = chat_call(session)
    assert r.status_code == 502 and named in r.json()["error"]["message"], r.text
    state = read(session)
    assert state["status"] == "finished" and state["finish_reason"] == "env_error"
    (c,) = state["calls"]
    assert c["completion_token_ids"] is None and c["logprobs"] is None and named in c["error"]
    assert finish_call(session).json()["finish_reason"] == "env_error"


def test_misuse_then_an_unusable_answer_stays_the_models_failure(
    gateway: LiveServer, hostile: Callable[[str], None]
) -> None:
    session = open_session(gateway.url)
    hostile("bad-tool")
    assert chat_call(session, tools=TOOLS).status_code == 200
    assert "not JSON" in read(session)["misuse"]
    hostile("list")
    assert chat_call(session, tools=TOOLS).status_code == 502  # the upstream's failure ends it ...
    state = read(session)
    assert state["status"] == "finished" and state["finish_reason"] == "tool_misuse"  # ... as the model's
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["finish_reason"] == "tool_misuse"


def test_tool_calls_as_an_object_is_a_misuse(
    gateway: LiveServer, hostile: Callable[[str], None]
) -> None:
    session = open_session(gateway.url)
    hostile("tools-dict")
    chat_call(session, tools=TOOLS)
    assert "not a list" in read(session)["misuse"]
    assert finish_call(session).json()["finish_reason"] == "tool_misuse"


def test_concurrent_calls_never_pass_max_calls(
    limited: LiveServer, hostile: Callable[[str], None]
) -> None:
    gateway = limited
    session = open_session(gateway.url)
    hostile("slow")
    with cf.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: chat_call(session).status_code, range(8)))
    assert sorted(codes) == [200, 200] + [409] * 6, codes
    state = read(session)
    assert state["n_calls"] == 2 and [c["index"] for c in state["calls"]] == [0, 1]
    assert all(c["completion_token_ids"] for c in state["calls"])
    assert chat_call(session).status_code == 409  # a call after them: the limit
    assert read(session)["finish_reason"] == "max_turns"


def test_a_call_in_flight_when_its_session_finishes_is_refused_and_not_kept(
    gateway: LiveServer, hostile: Callable[[str], None]
) -> None:
    session = open_session(gateway.url)
    assert chat_call(session).status_code == 200
    hostile("slow")
    late: list[httpx.Response] = []
    t = threading.Thread(target=lambda: late.append(chat_call(session)))
    t.start()
    deadline = time.monotonic() + 10
    while read(session, tokens=False)["n_calls"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the second call is reserved (in flight)
    done = finish_call(session)
    assert done.status_code == 200 and done.json()["group_ingested"]
    t.join()
    assert late[0].status_code == 409, late[0].text
    calls = read(session)["calls"]
    assert calls[1]["completion_token_ids"] is None and "not answered" in calls[1]["error"]
    (traj,) = group(gateway.url, session["group_id"])["trajectories"]
    assert traj["metadata"]["calls"] == [0]


def test_max_tokens_is_capped_to_the_sessions_token_budget(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    first = chat_call(session, max_tokens=10**9).json()
    used = first["usage"]["total_tokens"]
    assert first["usage"]["max_tokens_seen"] == 1000  # nothing used yet: the whole budget
    second = chat_call(session, max_tokens=10**9).json()
    assert second["usage"]["max_tokens_seen"] == 1000 - used
    assert chat_call(session, max_tokens=5).json()["usage"]["max_tokens_seen"] == 5  # never raised


def test_an_upstream_of_another_policy_version_is_flagged_and_tags_its_tokens(
    gateway: LiveServer, hostile: Callable[[str], None]
) -> None:
    session = open_session(gateway.url)  # policy_version 0
    hostile("version-7")
    assert chat_call(session).status_code == 200
    assert read(session)["calls"][0]["policy_version"] == 7
    finish_call(session)
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    assert t["metadata"]["policy_version_mismatch"] == {"session": 0, "upstream": [7]}
    generated = [v for v, m in zip(t["versions"], t["loss_mask"], strict=True) if m == 1]
    assert generated and set(generated) == {7} and set(t["versions"]) == {-1, 7}


def test_a_placeholder_left_by_a_killed_api_does_not_hold_the_session_open_at_its_limit(
    limited: LiveServer
) -> None:
    """An API SIGKILLed mid-forward leaves its call's placeholder (attempts 0) behind. Older than the call's
    deadline (GATEWAY_ENV's 3 s, plus the gateway's 5 s margin) it is in flight no more: at the call limit
    the session ends as max_turns, not 409 forever."""
    from sqlalchemy import text

    from service.store.db import get_engine

    gateway = limited
    session = open_session(gateway.url)
    assert chat_call(session).status_code == 200
    with get_engine(gateway.db_url).begin() as db:  # what the killed API left: call 1 reserved a minute ago
        db.execute(text("INSERT INTO session_calls (session_id, idx, kind, request, upstream, attempts,"
                        " latency_ms, created_at) VALUES (:s, 1, 'chat', '{}'::jsonb, 'x', 0, 0,"
                        " now() - interval '1 minute')"), {"s": session["session_id"]})
        db.execute(text("UPDATE agent_sessions SET n_calls = 2 WHERE id = :s"), {"s": session["session_id"]})
    r = chat_call(session)
    assert r.status_code == 409 and "session limit" in r.text, r.text
    assert read(session)["finish_reason"] == "max_turns"

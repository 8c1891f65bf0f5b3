"""Small helpers for the gateway tests: open a session, run an agent turn with the `openai` SDK, post a raw
call or finish, steer ``fake_vllm`` (its hostile mode, what it says next, how its next answer ends)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai

# one client for every request of a test process: a top-level ``httpx.post`` builds a client, and with it an SSL
# context (~27 ms of CPU) per request, which was most of the tests' own CPU; no keep-alive, so each request still
# opens its own connection as before (none is reused across a server's restart or its idle timeout)
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
# the agents' (the `openai` SDK's) transport, shared the same way (the SDK's own client builds one per agent)
AGENT_HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), follow_redirects=True)

USER = [{"role": "user", "content": "add 2 and 3"}]
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}]


def open_session(url: str, group_id: str | None = None, group_size: int = 1, **extra: Any) -> dict[str, Any]:
    body = {"group_id": group_id or f"g-{uuid.uuid4().hex[:8]}", "group_size": group_size, "policy_version": 0,
            "prompt_id": extra.pop("prompt_id", "agent-add"),
            "prompt": {"dataset": "agents", "messages": [{"role": "user", "content": "add 2 and 3"}],
                       "reference": {"answer": "5"}}, **extra}
    r = HTTP.post(url + "/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return {**r.json(), "group_id": body["group_id"]}


def agent(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0,
                         http_client=AGENT_HTTP)


def turn(client: openai.OpenAI, messages: list[dict[str, Any]], seed: int, model: str = "tiny",
         **extra: Any) -> Any:
    """One model turn of the tiny random model (its text round-trips to its ids: rollout.infer); ``model``
    the name its upstream serves it under."""
    return client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=6, temperature=1.0, seed=seed, extra_body=extra,
    )


def finish(session: dict[str, Any], **body: Any) -> dict[str, Any]:
    r = HTTP.post(session["base_url"] + "/finish", json=body,
                  headers={"Authorization": f"Bearer {session['api_key']}"})
    assert r.status_code == 200, r.text
    return r.json()


def read(session: dict[str, Any], tokens: bool = True) -> dict[str, Any]:
    r = HTTP.get(session["base_url"], params={"include_tokens": tokens},
                 headers={"Authorization": f"Bearer {session['api_key']}"})
    assert r.status_code == 200, r.text
    return r.json()


def group(url: str, group_id: str) -> dict[str, Any]:
    r = HTTP.get(f"{url}/v1/groups/{group_id}", params={"include_tokens": True})
    assert r.status_code == 200, r.text
    return r.json()


def _auth(session: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {session['api_key']}"}


def chat_call(session: dict[str, Any], **extra: Any) -> httpx.Response:
    """One chat call as raw HTTP (a 4-token answer of ``fake`` to ``USER`` unless ``extra`` says otherwise)."""
    return HTTP.post(session["base_url"] + "/chat/completions", timeout=30, headers=_auth(session),
                     json={"model": "fake", "messages": USER, "max_tokens": 4, **extra})


def finish_call(session: dict[str, Any], **body: Any) -> httpx.Response:
    return HTTP.post(session["base_url"] + "/finish", json=body, timeout=30, headers=_auth(session))


def age(db_url: str, *sessions: dict[str, Any], seconds: float) -> None:
    """Time passes for ``sessions``: their ``created_at`` moves ``seconds`` back, so their wall time and their
    group's deadline (both measured by the database's clock from it) run out as if that time had been waited
    out; a test sees the limit happen without sleeping through it."""
    from sqlalchemy import text

    from service.store.db import get_engine

    with get_engine(db_url).begin() as db:
        n = db.execute(text("UPDATE agent_sessions SET created_at = created_at - make_interval(secs => :s)"
                            " WHERE id = ANY(:ids)"), {"s": seconds, "ids": [s["session_id"] for s in sessions]})
    assert n.rowcount == len(sessions)


def _fake(fake_url: str, route: str, content: str) -> None:
    r = HTTP.post(fake_url.removesuffix("/v1") + route, content=content)
    assert r.status_code == 200, r.text


def set_mode(fake_url: str, mode: str) -> None:
    """``fake_vllm``'s hostile mode (``tests.service.sessions.fake_upstream.MODES``), until set again."""
    _fake(fake_url, "/fake/mode", mode)


def say(fake_url: str, text: str) -> None:
    """What ``fake_vllm``'s next answer says (a final_answer must be the end of it)."""
    _fake(fake_url, "/fake/say", text)


def end_next(fake_url: str, finish_reason: str) -> None:
    """``fake_vllm``'s next answer's ``finish_reason`` (``tool_calls``: a valid call of ``add``, chat)."""
    _fake(fake_url, "/fake/finish", finish_reason)


def call_in_mode(fake_url: str, session: dict[str, Any], mode: str, **extra: Any) -> httpx.Response:
    """One chat call answered by ``fake_vllm`` in hostile ``mode`` (back to ``ok`` after it, whatever happens)."""
    set_mode(fake_url, mode)
    try:
        return chat_call(session, **extra)
    finally:
        set_mode(fake_url, "ok")

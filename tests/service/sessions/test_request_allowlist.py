"""A session call's request is an allowlist (docs/agents.md, "Streaming, sampling"): a field outside its
route's allowlist, or an allowed field at a value that changes what is sampled or what comes back (guided
decoding, structured outputs, beam search, more than one sample, echo, prompt log-probs, another model or
a LoRA adapter, streaming), is a 400 naming the field, and nothing is stored for the session. What is
forwarded is built from the allowlist only and names no model (the upstream answers with its own), and
every allowed field still works. The real API over HTTP, against fake_vllm (it serves ``fake`` and a LoRA
adapter of it, ``fake-lora``, and echoes the fields it was sent as ``usage.fields_seen``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.fake_upstream import COMPLETION_IDS
from tests.service.sessions.helpers import HTTP, TOOLS, USER, open_session, read

ROUTES = {"chat": "/chat/completions", "completions": "/completions"}
BODY: dict[str, dict[str, Any]] = {"chat": {"model": "fake", "messages": USER, "max_tokens": 4},
                                   "completions": {"model": "fake", "prompt": [1, 5, 6], "max_tokens": 4}}

REFUSED: list[tuple[str, str, Any]] = [
    # guided decoding, structured outputs: a masked distribution
    ("chat", "guided_json", {"type": "object"}), ("completions", "guided_regex", "[0-9]+"),
    ("chat", "guided_choice", ["5", "6"]), ("completions", "guided_grammar", 'root ::= "5"'),
    ("chat", "structured_outputs", {"choice": ["5"]}), ("chat", "response_format", {"type": "json_object"}),
    ("completions", "response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("chat", "tool_choice", "required"), ("chat", "tool_choice", {"type": "function", "function": {"name": "add"}}),
    # more than one sample, beam search, past the end of sequence, custom logits processors
    ("chat", "n", 2), ("completions", "n", True), ("completions", "best_of", 2), ("chat", "use_beam_search", True),
    ("completions", "ignore_eos", True), ("chat", "logits_processors", ["m.P"]), ("chat", "vllm_xargs", {"a": 1}),
    # what comes back: the request's text as the answer, the prompt's log-probs
    ("completions", "echo", True), ("chat", "echo", True), ("completions", "prompt_logprobs", 1),
    # another model: an adapter the upstream serves, a name it does not, SGLang's adapter field
    ("chat", "model", "fake-lora"), ("completions", "model", "other"), ("chat", "model", 7),
    ("chat", "lora_path", "fake-lora"),
    # streaming
    ("chat", "stream", True), ("chat", "stream_options", {"include_usage": True}),
    # an allowed field of the wrong type
    ("chat", "logprobs", 1), ("completions", "logprobs", True), ("chat", "seed", "1"), ("chat", "stop", [1]),
    ("chat", "tools", {"type": "function"}), ("chat", "parallel_tool_calls", "yes"), ("chat", "user", 1),
    # unknown, legacy, or the other route's
    ("chat", "chat_template", "{{ 'x' }}"), ("chat", "frobnicate", 1), ("chat", "functions", [{"name": "add"}]),
    ("completions", "messages", USER), ("completions", "max_completion_tokens", 4), ("chat", "prompt", "x"),
]


def _post(session: dict[str, Any], kind: str, body: dict[str, Any]) -> httpx.Response:
    return HTTP.post(session["base_url"] + ROUTES[kind], json=body, timeout=30,
                     headers={"Authorization": f"Bearer {session['api_key']}"})


@pytest.mark.parametrize(("kind", "field", "value"), REFUSED, ids=[f"{k}-{f}" for k, f, _ in REFUSED])
def test_a_field_or_value_outside_the_allowlist_is_a_400_naming_it_and_stores_nothing(
    fake_gateway: LiveServer, kind: str, field: str, value: Any
) -> None:
    session = open_session(fake_gateway.url)
    r = _post(session, kind, {**BODY[kind], field: value})
    assert r.status_code == 400 and r.json()["error"].startswith(f"{field}: "), r.text
    state = read(session, tokens=False)
    assert state["n_calls"] == 0 and state["calls"] == [] and state["status"] == "open"  # nothing stored


# what the gateway forwards of the allowed fields below (model, the fields allowed only at their default and
# the empty-only ones are never sent) plus the neutral sampling it writes out and the token fields it asks for
SENT_SHARED = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
               "repetition_penalty", "seed", "stop", "stop_token_ids", "user", "return_token_ids", "logprobs",
               "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output"}
ALLOWED_SHARED = {"model": "fake", "max_tokens": 4, "temperature": 0.9, "top_p": 1.0, "top_k": 0, "min_p": 0,
                  "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {},
                  "allowed_token_ids": [], "bad_words": [], "min_tokens": 0, "seed": 7, "stop": ["\n\n"],
                  "stop_token_ids": [99], "user": "agent-1", "stream": False, "stream_options": None, "n": 1,
                  "best_of": 1, "echo": False, "response_format": {"type": "text"}, "return_token_ids": False,
                  "skip_special_tokens": True, "spaces_between_special_tokens": True,
                  "include_stop_str_in_output": False}
ALLOWED = {
    "chat": ({**ALLOWED_SHARED, "messages": USER, "max_completion_tokens": 4, "tools": TOOLS, "tool_choice": "auto",
              "parallel_tool_calls": True, "logprobs": False, "top_logprobs": 0},
             SENT_SHARED | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                            "top_logprobs"}),
    "completions": ({**ALLOWED_SHARED, "prompt": "add 2 and 3", "logprobs": 2}, SENT_SHARED | {"prompt"}),
}


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_every_allowed_field_works_and_only_the_allowlist_is_forwarded(fake_gateway: LiveServer, kind: str) -> None:
    body, sent = ALLOWED[kind]
    session = open_session(fake_gateway.url)
    r = _post(session, kind, body)
    assert r.status_code == 200, r.text
    assert set(r.json()["usage"]["fields_seen"]) == sent  # no model: the upstream's own answers
    choice = r.json()["choices"][0]
    assert "token_ids" not in choice  # return_token_ids false: the agent's answer has none
    assert (choice["logprobs"] is None) == (kind == "chat")  # logprobs false (chat) / 2 (completions)
    (call,) = read(session)["calls"]
    assert call["completion_token_ids"] == COMPLETION_IDS and call["logprobs"] == [-0.25] * len(COMPLETION_IDS)


def test_the_model_is_the_upstreams_own_and_never_forwarded(fake_gateway: LiveServer) -> None:
    session = open_session(fake_gateway.url)
    r = _post(session, "chat", {**BODY["chat"], "model": "fake-lora"})
    assert r.status_code == 400 and "served as fake;" in r.json()["error"], r.text
    for model in ("fake", None):  # its name, or none
        r = _post(session, "chat", {**BODY["chat"], "model": model})
        assert r.status_code == 200 and "model" not in r.json()["usage"]["fields_seen"], r.text
    assert read(session, tokens=False)["n_calls"] == 2

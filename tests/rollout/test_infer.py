"""rollout.infer: our own OpenAI-compatible upstream answers with vLLM's token-id and log-prob fields,
driven by the `openai` SDK over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rollout.infer import AsciiTokenizer
from tests.service.sessions.upstreams import (
    LETTERS_AND_EOS,
    Upstream,
    recompute_logprobs,
    save_tiny_model,
    start_infer,
    stop,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def upstream(model_dir: Path) -> Iterator[Upstream]:
    server = start_infer(model_dir, policy_version=7)
    yield server
    stop(server)


def test_chat_returns_prompt_and_completion_ids_with_the_trainers_logprobs(upstream: Upstream, model_dir: Path) -> None:
    client = openai.OpenAI(base_url=upstream.url, api_key="unused")
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "add 2 and 3"}], max_tokens=12, temperature=0.7,
        seed=3, logprobs=True, extra_body={"return_token_ids": True},
    )
    assert raw.headers["x-policy-version"] == "7"
    answer = raw.parse().model_dump()
    prompt, choice = answer["prompt_token_ids"], answer["choices"][0]
    completion = choice["token_ids"]
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert prompt[0] == 1 and len(completion) == len(logprobs) > 0
    assert choice["finish_reason"] in ("stop", "length")
    recomputed = recompute_logprobs(model_dir, prompt + completion, temperature=0.7)[len(prompt) - 1:]
    assert logprobs == pytest.approx(recomputed, abs=1e-4)


def test_completions_take_token_ids_and_give_them_back(upstream: Upstream) -> None:
    client = openai.OpenAI(base_url=upstream.url, api_key="unused")
    prompt = [1, *AsciiTokenizer().encode("hi")]
    answer = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, logprobs=1, seed=1,
        extra_body={"return_token_ids": True, "allowed_token_ids": LETTERS_AND_EOS},
    ).model_dump()
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert set(choice["token_ids"]) <= set(LETTERS_AND_EOS)
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])


def test_fields_not_asked_for_are_not_sent(upstream: Upstream) -> None:
    answer = httpx.post(upstream.url + "/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}).json()
    assert "prompt_token_ids" not in answer and "token_ids" not in answer["choices"][0]
    assert answer["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("field", "value"), [("stream", True), ("n", 2), ("max_tokens", 0), ("temperature", -1)])
def test_unsupported_or_bad_params_are_a_400_naming_the_field(upstream: Upstream, field: str, value: object) -> None:
    r = httpx.post(upstream.url + "/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], field: value})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(field)


def test_tool_calls_are_parsed_from_the_hermes_block() -> None:
    from rollout.infer import parse_tool_calls

    content, calls = parse_tool_calls('hi<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert content == "hi" and calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    content, calls = parse_tool_calls("<tool_call>not json</tool_call>")
    assert calls == [] and content == "<tool_call>not json</tool_call>"


def test_the_tiny_tokenizer_round_trips_every_id_sequence_through_text() -> None:
    tok = AsciiTokenizer()
    ids = list(range(tok.vocab_size)) * 2
    assert tok.encode(tok.decode(ids)) == ids

"""An SGLang upstream (fake_sglang: SGLang's wire format) records the same token ids and log-probs as vLLM:
per-choice ``prompt_token_ids`` / ``token_ids`` for ``return_token_ids``; for a release whose chat route
lacks it, ``return_prompt_token_ids`` + ``meta_info.output_token_logprobs`` once the deployment says so
(``GRPO_CURATOR_INFERENCE_SGLANG_META_INFO``), and without that setting a clear env_error, never a guess."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.conftest import LiveServer
from tests.service.sessions.fake_upstream import COMPLETION_IDS, render
from tests.service.sessions.helpers import HTTP, agent, finish, open_session, read
from tests.service.sessions.upstreams import Upstream, start_fake_vllm, stop

USER = [{"role": "user", "content": "add 2 and 3"}]


@pytest.fixture(scope="module", params=["sglang", "sglang-meta"])
def fake_sglang(request: pytest.FixtureRequest) -> Iterator[Upstream]:
    server = start_fake_vllm(flavor=request.param)
    server.flavor = request.param  # type: ignore[attr-defined]
    yield server
    stop(server)


@pytest.fixture(scope="module")
def sglang_gateway(gateway_for: Callable[..., LiveServer], fake_sglang: Upstream) -> LiveServer:
    """The API pointed at ``fake_sglang``, its deployment saying so (one per flavor; each test its own session)."""
    return gateway_for(fake_sglang.url, GRPO_CURATOR_INFERENCE_SGLANG_META_INFO="true")


def test_sglang_token_ids_and_logprobs_are_recorded_and_hidden_from_the_agent(sglang_gateway: LiveServer) -> None:
    gateway = sglang_gateway
    session = open_session(gateway.url)
    client = agent(session)
    answer = client.chat.completions.create(model="fake", messages=USER, max_tokens=4, temperature=1.0)
    raw = answer.choices[0].model_dump()
    assert "token_ids" not in raw and "prompt_token_ids" not in raw and "meta_info" not in raw
    assert answer.choices[0].logprobs is None  # the agent did not ask for them
    history = [*USER, {"role": "assistant", "content": answer.choices[0].message.content}, {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="fake", messages=history, max_tokens=4, temperature=1.0)
    text = client.completions.create(model="fake", prompt=[1, 5, 6], max_tokens=4, temperature=1.0)
    assert "token_ids" not in text.choices[0].model_dump()
    calls = read(session)["calls"]
    assert [c["error"] for c in calls] == [None, None, None]
    assert calls[0]["prompt_token_ids"] == render(USER) and calls[1]["prompt_token_ids"] == render(history)
    assert calls[2]["prompt_token_ids"] == [1, 5, 6]
    assert all(c["completion_token_ids"] == COMPLETION_IDS for c in calls)
    assert all(c["logprobs"] == [-0.25] * len(COMPLETION_IDS) for c in calls)
    assert finish(session, final_answer="fak")["finish_reason"] == "stop"


def test_the_agent_that_asks_for_sglang_fields_gets_them(sglang_gateway: LiveServer) -> None:
    gateway = sglang_gateway
    session = open_session(gateway.url)
    r = HTTP.post(session["base_url"] + "/chat/completions", headers={"Authorization": f"Bearer {session['api_key']}"},
                  json={"messages": USER, "return_prompt_token_ids": True, "return_meta_info": True, "logprobs": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == render(USER)
    assert [e[1] for e in choice["meta_info"]["output_token_logprobs"]] == COMPLETION_IDS
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [-0.25] * len(COMPLETION_IDS)


def test_an_old_sglang_without_the_setting_is_an_env_error_naming_it(gateway_for: Callable[..., LiveServer]) -> None:
    fake = start_fake_vllm(flavor="sglang-meta")  # its chat route ignores return_token_ids
    try:
        gateway = gateway_for(fake.url)
        session = open_session(gateway.url)
        r = HTTP.post(session["base_url"] + "/chat/completions", json={"messages": USER},
                      headers={"Authorization": f"Bearer {session['api_key']}"})
        assert r.status_code == 502 and "GRPO_CURATOR_INFERENCE_SGLANG_META_INFO" in r.json()["error"]["message"]
        state = read(session)
        assert state["finish_reason"] == "env_error" and state["calls"][0]["completion_token_ids"] is None
    finally:
        stop(fake)

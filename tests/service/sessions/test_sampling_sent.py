"""A session's calls are sampled at temperature only (docs/agents.md, "Streaming, sampling"): vLLM's processed
log-probs include top-k / top-p truncation, penalties and logit biases, the trainer's recomputation does not.
An agent's non-neutral value is a 400 naming the field (nothing stored); every call goes upstream with the
neutral values and its temperature written out (1.0 when the agent sent none, so no upstream default
applies), and the group records what was sent. The agent is the `openai` SDK."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import LiveServer
from tests.service.sessions.helpers import agent, finish, group, open_session, read

USER = [{"role": "user", "content": "add 2 and 3"}]
NEUTRAL = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "repetition_penalty": 1.0}


@pytest.mark.parametrize(("field", "value"), [
    ("top_p", 0.1), ("top_k", 3), ("min_p", 0.2), ("presence_penalty", 2.0), ("frequency_penalty", -1.0),
    ("repetition_penalty", 1.3), ("logit_bias", {"40": 100}), ("min_tokens", 2), ("allowed_token_ids", [40, 41]),
])
def test_a_sampling_parameter_that_is_not_neutral_is_a_400_naming_it(
    fake_gateway: LiveServer, field: str, value: Any
) -> None:
    session = open_session(fake_gateway.url)
    named = {"top_p", "presence_penalty", "frequency_penalty", "logit_bias"}  # the SDK's own arguments
    kwargs = {field: value} if field in named else {"extra_body": {field: value}}
    with pytest.raises(openai.BadRequestError) as refused:
        agent(session).chat.completions.create(model="fake", messages=USER, max_tokens=4, **kwargs)
    assert refused.value.status_code == 400
    assert refused.value.response.json()["error"].startswith(field), refused.value.response.text
    assert read(session, tokens=False)["n_calls"] == 0  # nothing stored


def test_every_call_is_sent_at_its_temperature_with_neutral_sampling_and_the_group_records_it(
    fake_gateway: LiveServer,
) -> None:
    session = open_session(fake_gateway.url)
    client = agent(session)
    bare = client.chat.completions.create(model="fake", messages=USER, max_tokens=4)  # no temperature at all
    assert bare.usage.model_extra["sampling_seen"] == {**NEUTRAL, "temperature": 1.0, "logit_bias": None}
    neutral = client.chat.completions.create(model="fake", messages=USER, max_tokens=4, top_p=1, logit_bias={},
                                             extra_body={"top_k": 0, "min_p": 0})  # neutral spellings pass
    assert neutral.usage.model_extra["sampling_seen"] == {**NEUTRAL, "temperature": 1.0, "logit_bias": None}
    finish(session)
    assert group(fake_gateway.url, session["group_id"])["sampling"] == {**NEUTRAL, "temperature": 1.0}


def test_a_groups_temperature_is_the_one_sent(fake_gateway: LiveServer) -> None:
    session = open_session(fake_gateway.url)
    answer = agent(session).chat.completions.create(model="fake", messages=USER, max_tokens=4, temperature=0.7)
    assert answer.usage.model_extra["sampling_seen"]["temperature"] == 0.7
    finish(session)
    assert group(fake_gateway.url, session["group_id"])["sampling"] == {**NEUTRAL, "temperature": 0.7}

"""The model's tool misuse through the gateway, end to end: a scripted tiny model (trained here until its
greedy answer is a given tool call) calls an unknown tool in one session and breaks the tool's schema in
another; both are the model's failures: finish_reason tool_misuse, outcome 0, and the group still trains
(it gets advantages and is leased). The sessions are opened and finished with ``CuratorClient``; the agent
is the real ``openai`` SDK."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from rollout.infer import AsciiTokenizer
from service.client import CuratorClient
from tests.conftest import LiveServer
from tests.service.sessions.upstreams import Upstream, save_scripted_model, start_infer, stop

PROMPT = {"dataset": "agents", "messages": [{"role": "user", "content": "add 2 and 3"}], "reference": {"answer": "5"}}
# one short tool (a short prompt: the scripted model trains in seconds)
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
# the agent's system line picks the scripted model's behaviour (a group shares one prompt)
SCRIPT = {
    "careful": "5",
    "hasty": '<tool_call>{"name": "search", "arguments": {"q": "2+3"}}</tool_call>',
    "sloppy": '<tool_call>{"name": "add", "arguments": {"a": "two", "b": 3}}</tool_call>',
}


def _messages(style: str) -> list[dict]:
    return [{"role": "system", "content": style}, *PROMPT["messages"]]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    tok = AsciiTokenizer()
    script = [(tok.render(_messages(style), TOOLS), text) for style, text in SCRIPT.items()]
    server = start_infer(save_scripted_model(tmp_path_factory.mktemp("scripted") / "tiny", script))
    yield server
    stop(server)


def _wait_ready(client: CuratorClient, group_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group = client.get_group(group_id)
        if group["status"] not in ("received", "scored"):
            return group
        time.sleep(0.3)
    raise AssertionError(f"group {group_id} was not curated in {timeout_s} s")


def test_unknown_tool_and_schema_breaking_arguments_score_0_and_the_group_trains(
    gateway_for: Callable[..., LiveServer], scripted: Upstream
) -> None:
    gateway = gateway_for(scripted.url, GRPO_CURATOR_EMBEDDED_WORKER="true", GRPO_CURATOR_WORKER_POLL_SECONDS="0.2")
    with CuratorClient(gateway.url) as curator:
        sessions = {style: curator.session("g-misuse", 3, 0, prompt_id="agent-add", prompt=PROMPT)
                    for style in SCRIPT}
        for style, session in sessions.items():
            agent = session.openai(max_retries=0)
            answer = agent.chat.completions.create(model="tiny", messages=_messages(style), tools=TOOLS,
                                                   temperature=0.001, max_tokens=96)
            message = answer.choices[0].message
            if style == "careful":
                assert message.content == "5" and not message.tool_calls
                done = curator.finish_session(session, final_answer="5")
            else:  # the agent passes the model's call on as is; the gateway saw the misuse
                assert message.tool_calls and answer.choices[0].finish_reason == "tool_calls"
                done = curator.finish_session(session)
            assert done["finish_reason"] == ("stop" if style == "careful" else "tool_misuse"), style
        seen = {style: curator.get_session(s)["misuse"] for style, s in sessions.items()}
        assert seen["careful"] is None
        assert "unknown tool" in seen["hasty"] and "search" in seen["hasty"]
        assert "schema" in seen["sloppy"]
        assert done["group_ingested"]
        group = _wait_ready(curator, "g-misuse")
        assert group["status"] == "ready", group
        by_session = {t["metadata"]["session_id"]: t for t in group["trajectories"]}
        careful, hasty, sloppy = (by_session[sessions[s].session_id] for s in SCRIPT)
        assert careful["outcome"] == 1.0 and hasty["outcome"] == 0.0 and sloppy["outcome"] == 0.0
        assert hasty["finish_reason"] == sloppy["finish_reason"] == "tool_misuse"
        assert careful["advantage"] > 0 > hasty["advantage"] and sloppy["advantage"] < 0
        batch = curator.lease("t0", max_groups=4)
        assert batch is not None and [g["id"] for g in batch["groups"]] == ["g-misuse"]

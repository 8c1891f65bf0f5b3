"""A multi-turn agent episode through the gateway (the `openai` SDK as the agent, our own transformers
upstream) becomes a token-exact trajectory: the last call's prompt + completion ids, mask 1 exactly on the
model's tokens, the upstream's log-probs (equal to the trainer's recomputation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import LiveServer
from tests.service.sessions.helpers import agent, finish, group, open_session, read, turn
from tests.service.sessions.upstreams import recompute_logprobs


def _episode(session: dict[str, Any], turns: int, rewrite_at: int | None = None) -> list[dict[str, Any]]:
    client = agent(session)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
    for k in range(turns):
        answer = turn(client, messages, seed=k)
        content = answer.choices[0].message.content or ""
        if k + 1 == rewrite_at:
            content = "rewritten by the agent"
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": f"tool add returned {k + 5}"}]
    return messages


def test_multi_turn_episode_is_one_trajectory_of_the_last_calls_tokens(gateway: LiveServer, model_dir: Path) -> None:
    session = open_session(gateway.url)
    _episode(session, turns=3)
    done = finish(session, rewards={"reward": 1.0})  # scored: the last completion's text
    assert done["finish_reason"] == "stop" and done["group_ingested"]
    calls = read(session)["calls"]
    assert len(calls) == 3 and all(c["error"] is None for c in calls)
    (t,) = group(gateway.url, session["group_id"])["trajectories"]
    last = calls[-1]
    assert t["token_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    expected_mask = [0] * len(t["token_ids"])
    positions = []
    for c in calls:  # each completion sits right after its own prompt
        start = len(c["prompt_token_ids"])
        assert t["token_ids"][:start] == c["prompt_token_ids"]
        for j, lp in enumerate(c["logprobs"]):
            expected_mask[start + j] = 1
            positions.append((start + j, lp))
    assert t["loss_mask"] == expected_mask
    assert all(t["logprobs"][p] == lp for p, lp in positions)
    assert all(lp == 0.0 for lp, m in zip(t["logprobs"], t["loss_mask"], strict=True) if m == 0)
    recomputed = recompute_logprobs(model_dir, t["token_ids"], temperature=1.0)
    for p, lp in positions:
        assert abs(recomputed[p - 1] - lp) < 1e-4, (p, lp, recomputed[p - 1])
    assert t["metadata"]["reward"] == 1.0 and t["metadata"]["session_id"] == session["session_id"]


def test_rewritten_history_starts_a_second_segment_with_prefix_mismatch(gateway: LiveServer) -> None:
    session = open_session(gateway.url)
    _episode(session, turns=3, rewrite_at=1)  # call 1's reply is replaced before call 2 (index 1)
    finish(session, rewards={"reward": 1.0})
    calls = read(session)["calls"]
    (t,) = group(gateway.url, session["group_id"])["trajectories"]  # one trajectory, two segments
    assert t["token_ids"] is None and t["loss_mask"] is None and t["logprobs"] is None
    first, second = t["segments"]
    assert [s["segment_index"] for s in (first, second)] == [0, 1]
    assert [s["is_last"] for s in (first, second)] == [False, True]
    assert all("advantage" in s for s in (first, second))  # set once the group is scored (no worker here)
    assert t["metadata"]["calls"] == [[0], [1, 2]]
    none, mismatch = t["metadata"]["prefix_mismatch"]
    assert none is None and mismatch["call"] == 1
    seg0 = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][: mismatch["position"]] == seg0[: mismatch["position"]]
    assert calls[1]["prompt_token_ids"][mismatch["position"]] != seg0[mismatch["position"]]
    assert first["token_ids"] == seg0 and first["seq_len"] == len(seg0)
    assert second["token_ids"] == calls[2]["prompt_token_ids"] + calls[2]["completion_token_ids"]
    for seg, held in zip((first, second), t["metadata"]["calls"], strict=True):  # nothing misaligned
        mask, generated = [0] * len(seg["token_ids"]), {}
        for i in held:  # each completion sits right after its own prompt, mask 1 exactly there
            start = len(calls[i]["prompt_token_ids"])
            assert seg["token_ids"][:start] == calls[i]["prompt_token_ids"]
            for j, lp in enumerate(calls[i]["logprobs"]):
                mask[start + j], generated[start + j] = 1, lp
        assert seg["loss_mask"] == mask
        assert all(seg["logprobs"][p] == lp for p, lp in generated.items())
    assert first["messages"][-1]["role"] == "assistant" and second["messages"][-1]["role"] == "assistant"
    assert first["messages"][0]["content"] == second["messages"][0]["content"] == "add 2 and 3"

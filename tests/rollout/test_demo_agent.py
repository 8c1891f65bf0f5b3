"""The demo's closing stage: a group of tool-using agent episodes (rollout.agent_example's loop) through
the session gateway against the demo's own ``grpo-curator infer --tiny``, with auth on and an embedded
PostgreSQL of its own; every answered call's tokens end up in the group, the completions trained."""

from __future__ import annotations

import json

import pytest

from rollout import demo


@pytest.mark.slow
def test_the_agent_stage_runs_episodes_through_the_gateway(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)  # the stage uses its own embedded PostgreSQL
    result = demo.agent_stage(tmp_path / "agent", startup_timeout=300, episodes=2)
    demo.print_agent(result)
    printed = capsys.readouterr().out
    assert json.loads((tmp_path / "agent" / "agent.json").read_text()) == result
    assert len(result["episodes"]) == 2 and len(result["trajectories"]) == 2
    assert {e["session_id"] for e in result["episodes"]} == {t["session_id"] for t in result["trajectories"]}
    for e in result["episodes"]:
        answered = [c for c in e["calls"] if c["error"] is None]
        assert answered and all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 for c in answered)
        (t,) = [t for t in result["trajectories"] if t["session_id"] == e["session_id"]]
        # the trained tokens are exactly the completions the model sampled (the prompt and tool output: mask 0)
        assert t["trained_tokens"] == sum(c["completion_tokens"] for c in answered) < t["tokens"]
        assert f"session {e['session_id']}: {len(e['calls'])} calls" in printed
    assert result["status"] in ("received", "scored", "ready", "dropped")
    assert "agent episodes through the gateway" in printed

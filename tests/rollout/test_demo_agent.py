"""`grpo-curator demo` end to end through real processes (service, producer, trainer, embedded PostgreSQL:
the policy advances), and its closing stage: a group of tool-using agent episodes (rollout.agent_example's
loop) through the session gateway against the demo's own ``grpo-curator infer --tiny``, with auth on and an
embedded PostgreSQL of its own; every answered call's tokens end up in the group, the completions trained.

One demo run checks both: the closing stage is ``rollout.demo.agent_stage`` as the demo runs it (its result
is the ``agent-episode/agent.json`` the demo writes, its lines the demo's stdout), so the stage is not run a
second time on its own (that took a third embedded PostgreSQL, service and infer server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.store.processes import processes_mentioning
from tests.conftest import ROOT


@pytest.mark.slow
def test_demo_runs_end_to_end_the_policy_advances_and_the_agent_stage_runs_through_the_gateway(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    r = subprocess.run([sys.executable, "-m", "service.cli", "demo", "--versions", "3", "--minutes", "2",
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [result] = json.loads((out / "demo.json").read_text())
    assert result["label"].startswith("curated") and len(result["rows"]) >= 2
    assert (out / "demo.png").stat().st_size > 10_000
    assert "policy v" in r.stdout
    versions = [int(row["key"]) for row in result["rows"]]
    assert max(versions) >= 1  # groups were sampled by a policy the trainer published
    logs = {p.name: p.read_text() for p in Path(result["out"]).glob("*.log")}
    assert "auth on" in logs["service.log"]  # the demo made its own keys: every process authenticated
    assert not [name for name, text in logs.items() if "gck_" in text] and "gck_" not in r.stdout + r.stderr
    assert "gcs_" not in r.stdout + r.stderr
    assert processes_mentioning(str(out)) == []  # service, workers and the embedded PostgreSQL all stopped

    # the closing stage (rollout.demo.agent_stage, then print_agent): its result is agent.json
    agent = json.loads((out / "agent-episode" / "agent.json").read_text())
    printed = r.stdout
    assert "agent episodes through the gateway" in printed, "the demo's closing agent stage did not run"
    assert len(agent["episodes"]) == 2 and len(agent["trajectories"]) == 2, "two episodes, two trajectories"
    assert {e["session_id"] for e in agent["episodes"]} == {t["session_id"] for t in agent["trajectories"]}, \
        "every episode's session is one trajectory of the group"
    for e in agent["episodes"]:
        answered = [c for c in e["calls"] if c["error"] is None]
        assert answered and all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 for c in answered), \
            f"session {e['session_id']}: an answered call without tokens: {e['calls']}"
        (t,) = [t for t in agent["trajectories"] if t["session_id"] == e["session_id"]]
        # the trained tokens are exactly the completions the model sampled (the prompt and tool output: mask 0)
        assert t["trained_tokens"] == sum(c["completion_tokens"] for c in answered) < t["tokens"], (t, e)
        assert f"session {e['session_id']}: {len(e['calls'])} calls" in printed, "print_agent's line per session"
    assert agent["status"] in ("received", "scored", "ready", "dropped")

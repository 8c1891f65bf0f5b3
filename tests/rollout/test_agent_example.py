"""docs/agents.md's agent loop runs end to end as written: `python -m rollout.agent_example --local` starts
`grpo-curator infer --tiny` and the API, runs a group of tool-using episodes with the `openai` SDK through
the gateway, and the group is posted (its trajectories carry the sessions' token ids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rollout.agent_example import run_tool
from tests.conftest import ROOT


def test_the_agent_example_runs_a_group_end_to_end(make_db, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    env["DATABASE_URL"] = make_db()
    env["TMPDIR"] = str(tmp_path)  # where its servers' logs go: a run that worked removes them
    proc = subprocess.run([sys.executable, "-m", "rollout.agent_example", "--local", "--episodes", "2"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 2
    assert all(r["status"] == "finished" for r in results)
    assert [r["group_ingested"] for r in results] == [False, True]  # the second finish completed the group
    assert not list(tmp_path.glob("agent-example-*")), "a run that worked left its logs in the temp dir"


def test_the_example_tools_tell_the_models_mistakes_apart() -> None:
    assert run_tool("add", '{"a": 2, "b": 3}') == "5"
    for name, args, error in (("search", "{}", KeyError), ("add", "{oops", ValueError), ("add", '{"a": "2"}', ValueError)):
        try:
            run_tool(name, args)
        except error:
            continue
        raise AssertionError(f"{name}({args}) was accepted")

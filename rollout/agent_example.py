"""A complete tool-using agent loop with the ``openai`` package, through the session gateway
(docs/agents.md quotes it). One episode = one session: open it with ``CuratorClient.session``, point
``openai.OpenAI`` at its ``base_url`` / ``api_key``, call the model and run its tools turn after turn, then
finish. The gateway records every call's token ids and log-probs; nothing here tokenizes anything.

    python -m rollout.agent_example --url http://127.0.0.1:8000 --group g-1 --episodes 4
    python -m rollout.agent_example --local   # starts `grpo-curator infer --tiny` and `serve` itself

Whose failure is it: a tool call the model got wrong (unknown tool, bad arguments) is answered to the
model as a tool error and the episode goes on (the gateway already recorded the misuse: a negative); a
tool that fails on valid arguments (its backend is down) ends the episode with ``error`` (the
environment's: dropped, never a negative).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import openai

from service.client import AgentSessionKey, CuratorClient, default_url, health_client, wait_healthy
from service.store.processes import spawn_tied, stop_all

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}]
PROMPT: dict[str, Any] = {
    "dataset": "agents", "messages": [{"role": "user", "content": "What is 2 + 3? Use the add tool."}],
    "reference": {"answer": "5"}}


class ToolBackendDown(Exception):
    """The environment's tool failed on valid arguments (not the model's fault)."""


def run_tool(name: str, arguments: str) -> str:
    """The environment's tools. ValueError / KeyError: the model's bad call; ToolBackendDown: ours."""
    args = json.loads(arguments)  # ValueError when the model wrote no JSON
    if name != "add":
        raise KeyError(f"unknown tool {name!r}")
    if not isinstance(args, dict) or not all(isinstance(args.get(k), int) for k in ("a", "b")):
        raise ValueError("add takes integers a and b")
    return str(args["a"] + args["b"])


def episode(curator: CuratorClient, session: AgentSessionKey, *, model: str = "tiny", max_turns: int = 4,
            max_tokens: int = 32, temperature: float = 1.0) -> dict[str, Any]:
    """One agent episode through the gateway; returns the finish answer (``finish_reason``...)."""
    agent = session.openai(max_retries=0)
    messages: list[dict[str, Any]] = list(PROMPT["messages"])
    for _ in range(max_turns):
        try:
            answer = agent.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                   max_tokens=max_tokens, temperature=temperature)
        except openai.APIStatusError as exc:  # 409: a session limit ended it; 502: the upstream failed
            return curator.finish_session(session, error=None if exc.status_code == 409 else str(exc))
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # the model answered
            return curator.finish_session(session, final_answer=message.content or "")
        for call in message.tool_calls:
            try:
                result = run_tool(call.function.name, call.function.arguments)
            except ToolBackendDown as exc:  # the environment's failure: dropped, never a negative
                return curator.finish_session(session, finish_reason="tool_failure", error=str(exc))
            except (KeyError, ValueError) as exc:  # the model's: it sees the error (the gateway saw the misuse)
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return curator.finish_session(session, finish_reason="max_turns")


def run_group(url: str, group_id: str, episodes: int, policy_version: int = 0, **kw: Any) -> list[dict[str, Any]]:
    with CuratorClient(url) as curator:
        sessions = [curator.session(group_id, episodes, policy_version, prompt_id="agent-add", prompt=PROMPT)
                    for _ in range(episodes)]
        return [episode(curator, s, **kw) for s in sessions]


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(episodes: int) -> list[dict[str, Any]]:
    """`grpo-curator infer --tiny` and `serve` on free ports (DATABASE_URL), one group, both stopped; their logs
    are removed after a run that worked and kept (the path on stderr) after one that did not."""
    procs: list[subprocess.Popen] = []
    logs = Path(tempfile.mkdtemp(prefix="agent-example-"))
    worked = False
    try:
        infer_port, api_port = _port(), _port()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with (logs / "infer.log").open("w") as sink:
            procs.append(spawn_tied([sys.executable, "-m", "service.cli", "infer", "--tiny", "--port", str(infer_port)],
                                    env=env, stdout=sink, stderr=subprocess.STDOUT))
        env["GRPO_CURATOR_INFERENCE_URL"] = f"http://127.0.0.1:{infer_port}/v1"
        with (logs / "service.log").open("w") as sink:
            procs.append(spawn_tied([sys.executable, "-m", "service.cli", "serve", "--port", str(api_port)],
                                    env=env, stdout=sink, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{api_port}"
        wait_healthy(url, procs[1], timeout_s=120)
        _wait_infer(infer_port, procs[0])
        results = run_group(url, f"agent-example-{uuid.uuid4().hex[:8]}", episodes)
        worked = True
        return results
    finally:
        try:
            stop_all(procs)
        finally:
            if worked:
                shutil.rmtree(logs, ignore_errors=True)  # a run that worked leaves nothing in the temp dir
            else:
                print(f"agent example failed: the servers' logs are in {logs}", file=sys.stderr)


def _wait_infer(port: int, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    with health_client(1) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("grpo-curator infer exited before it was healthy")
            try:
                if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise RuntimeError("grpo-curator infer did not become healthy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.agent_example", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="the curator service (default: GRPO_CURATOR_URL)")
    parser.add_argument("--local", action="store_true", help="start grpo-curator infer --tiny and serve here")
    parser.add_argument("--group", default=None, help="group id (default: a new one)")
    parser.add_argument("--episodes", type=int, default=2, help="sessions in the group (group_size)")
    parser.add_argument("--model", default="tiny", help="the model name the upstream serves")
    args = parser.parse_args(argv)
    if args.local:
        results = run_local(args.episodes)
    else:
        results = run_group(args.url or default_url(), args.group or f"agent-{uuid.uuid4().hex[:8]}",
                            args.episodes, model=args.model)
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

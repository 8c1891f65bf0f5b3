"""Small data builders for tests (no factory framework)."""

from __future__ import annotations

import random
from typing import Any


def make_trajectory(
    *,
    answer: str = "42",
    finish_reason: str = "stop",
    prompt_len: int = 4,
    response_len: int = 6,
    seed: int = 0,
    **overrides: Any,
) -> dict[str, Any]:
    rng = random.Random(seed)
    n = prompt_len + response_len
    traj = {
        "messages": [{"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}"}],
        "token_ids": [rng.randrange(1, 500) for _ in range(n)],
        "loss_mask": [0] * prompt_len + [1] * response_len,
        "logprobs": [0.0] * prompt_len + [round(-rng.random(), 4) for _ in range(response_len)],
        "finish_reason": finish_reason,
    }
    traj.update(overrides)
    return traj


def make_group(
    group_id: str = "g-1",
    *,
    prompt_id: str = "p-1",
    n: int = 4,
    answers: list[str] | None = None,
    policy_version: int = 0,
    dataset: str = "toy",
    reference: dict[str, Any] | None = None,
    inline_prompt: bool = True,
    **overrides: Any,
) -> dict[str, Any]:
    answers = answers or ["42"] * n
    group: dict[str, Any] = {
        "id": group_id,
        "prompt_id": prompt_id,
        "policy_version": policy_version,
        "sampling": {"temperature": 1.0, "max_tokens": 16},
        "trajectories": [make_trajectory(answer=a, seed=i) for i, a in enumerate(answers)],
    }
    if inline_prompt:
        group["prompt"] = {
            "dataset": dataset,
            "messages": [{"role": "user", "content": "What is 6 * 7?"}],
            "reference": reference if reference is not None else {"answer": "42"},
        }
    group.update(overrides)
    return group


def tool_episode() -> dict[str, Any]:
    """A multi-turn tool-using trajectory: assistant calls a tool, reads the result, answers."""
    return {
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7"}'}}
                ],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "assistant", "content": "The answer is 42."},
        ],
        "token_ids": [5, 6, 7, 8, 9, 10, 11, 12],
        "loss_mask": [0, 0, 1, 1, 0, 0, 1, 1],
        "logprobs": [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.5, -0.125],
        "finish_reason": "stop",
        "metadata": {"env": "calc-v1"},
    }


def restart_forkserver() -> None:
    """Stop multiprocessing's forkserver, so the next pool worker starts from a new one that sees the current
    environment (a worker inherits the forkserver's environment, fixed when it started: a test that changes
    the deployment's environment, such as the python.function allowlist, restarts it as a deployment would)."""
    import multiprocessing.forkserver as forkserver
    import os
    import signal

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        # _stop() waits for the server to see EOF on its "alive" pipe, which never comes while any process
        # forked from this one (by an earlier test) still holds the pipe's write end: kill it instead
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server._stop()  # stdlib's own hook for tests (reaps it, forgets its socket); the next worker restarts it


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for an API key."""
    return {"Authorization": f"Bearer {token}"}


def secret_of(token: str) -> str:
    """The secret part of a ``gck_<id>_<secret>`` key: everything after the id, underscores included (the
    secret is URL-safe base64, so ``token.split("_")[-1]`` can be one character that any log contains)."""
    from service.auth.service import split_token

    parts = split_token(token)
    assert parts is not None, f"not an API key: {token[:8]}..."
    return parts[1]


def register_spec(client: Any, spec: dict[str, Any]) -> None:
    """POST a reward spec; it must be stored (201)."""
    r = client.post("/v1/reward-specs", json=spec)
    assert r.status_code == 201, r.text


def assert_client_error(r: Any, field: str, statuses: tuple[int, ...] = (400, 422)) -> None:
    """A 4xx in the service's error format that names ``field`` (no 5xx, no traceback)."""
    assert r.status_code in statuses, (r.status_code, r.text[:500])
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    assert field in body["error"], body


def weighted_spec(name: str, weights: list[float]) -> dict[str, Any]:
    """A reward spec of verifier.math components with these weights (the first is the outcome)."""
    comps = [{"name": f"c{i}", "kind": "verifier.math", "weight": w, "outcome": i == 0} for i, w in enumerate(weights)]
    return {"name": name, "components": comps}


def shared_prompt_member(prompt: list[int], prompt_logprobs: list[float], *, seed: int, response_len: int = 24,
                         policy_version: int = 0, answer: str = "42") -> dict[str, Any]:
    """A trajectory that begins with ``prompt`` (its log-probs ``prompt_logprobs``, not zeros: whatever the
    rollout reported) and goes on with ``response_len`` generated tokens of its own, with per-token versions."""
    rng = random.Random(1000 + seed)
    response = [rng.randrange(1, 30000) for _ in range(response_len)]
    return make_trajectory(
        answer=answer,
        seed=seed,
        token_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * response_len,
        logprobs=prompt_logprobs + [-rng.random() * 3 for _ in range(response_len)],
        versions=[-1] * len(prompt) + [policy_version] * response_len,
    )


def make_shared_prompt_group(group_id: str, *, n: int = 4, prompt_len: int = 40, seed: int = 0,
                             policy_version: int = 3, answers: list[str] | None = None,
                             **overrides: Any) -> dict[str, Any]:
    """A group whose ``n`` members share their first ``prompt_len`` tokens (ids, mask 0, log-probs, version -1)
    byte for byte, as a rollout's do: the shape whose prompt is stored once (service.store.prefix). Prompt
    log-prob 30 is 0.0 (a test turns one member's into -0.0)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1, 30000) for _ in range(prompt_len)]
    prompt_logprobs = [-rng.random() * 7 for _ in range(prompt_len)]
    if prompt_len > 30:
        prompt_logprobs[30] = 0.0
    answers = answers or ["42"] * n
    trajectories = [shared_prompt_member(prompt, prompt_logprobs, seed=seed * 10 + i, response_len=20 + i,
                                         policy_version=policy_version, answer=a) for i, a in enumerate(answers)]
    return make_group(group_id, n=n, policy_version=policy_version, trajectories=trajectories, **overrides)


def end_the_backend_it_waits_on(db_url: str, table: str, request: Any, end: str = "pg_terminate_backend") -> Any:
    """``request()``'s answer when PostgreSQL ends its backend mid-statement (``end``: pg_terminate_backend, a
    restart or failover; pg_cancel_backend): ``table`` is locked first, so the statement that reads it waits;
    that backend is found waiting and ended, then the table unlocked."""
    import threading
    import time

    import psycopg

    from service.store.dbadmin import libpq_url

    answer: dict[str, Any] = {}
    with psycopg.connect(libpq_url(db_url), autocommit=True) as lock, \
            psycopg.connect(libpq_url(db_url), autocommit=True) as ops:
        lock.execute("BEGIN")
        lock.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        worker = threading.Thread(target=lambda: answer.update(r=request()))
        worker.start()
        deadline, waiting = time.monotonic() + 30, None
        while waiting is None and time.monotonic() < deadline:
            waiting = ops.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                                  "wait_event_type = 'Lock' AND query LIKE %s", (f"%{table}%",)).fetchone()
            time.sleep(0.02)
        assert waiting is not None, f"no statement waited on the lock of {table}"
        ops.execute(f"SELECT {end}(%s)", waiting)
        worker.join(30)
        lock.execute("ROLLBACK")
    return answer["r"]

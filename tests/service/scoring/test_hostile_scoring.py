"""Hostile answers against the embedded worker of a live server: a ReDoS JSON schema and a math power
tower are failed under the deadline (``verification_timeout``), their siblings scored, and /healthz keeps
answering while they run. Also: the built-in ``default`` spec and policy exist before any scoring.
"""

from __future__ import annotations

import time

import httpx

from tests.conftest import start_server, stop_server
from tests.helpers import make_group

EVIL = '"' + "a" * 40 + '!"'  # ^(a+)+$ on this holds Python's re for hours
SCHEMA_SPEC = {
    "name": "schema",
    "components": [
        {"name": "valid", "kind": "verifier.json_schema", "outcome": True,
         "params": {"schema": {"type": "string", "pattern": "^(a+)+$"}, "extract": "whole"}},
    ],
}


def _group(group_id: str, dataset: str, answers: list[str]) -> dict:
    group = make_group(group_id, prompt_id=f"p-{group_id}", answers=answers, dataset=dataset)
    for t, answer in zip(group["trajectories"], answers, strict=True):
        t["final_answer"] = answer
    return group


def _poll_until_scored(http: httpx.Client, ids: list[str], timeout_s: float) -> tuple[list[float], dict]:
    """/healthz every 100 ms (its latencies) until no group is 'received'; the groups as last seen."""
    latencies: list[float] = []
    deadline = time.monotonic() + timeout_s
    groups: dict = {}
    while time.monotonic() < deadline:
        start = time.monotonic()
        assert http.get("/healthz", timeout=30).status_code == 200
        latencies.append(time.monotonic() - start)
        groups = {i: http.get(f"/v1/groups/{i}").json() for i in ids}
        if all(g["status"] != "received" for g in groups.values()):
            break
        time.sleep(0.1)
    return latencies, groups


def _values(group: dict, component: str) -> list:
    return [t["rewards"][component]["value"] for t in group["trajectories"]]


def test_redos_schema_and_power_tower_fail_under_the_deadline_while_healthz_answers(make_db):
    env = {"GRPO_CURATOR_EMBEDDED_WORKER": "true", "GRPO_CURATOR_COMPONENT_TIMEOUT_S": "2",
           "GRPO_CURATOR_WORKER_POLL_SECONDS": "0.2"}
    server = start_server(make_db(), env=env)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            # item 5: the built-in default spec and policy exist before anything was scored
            assert http.put("/v1/datasets/toy", json={"reward_spec": "default", "curation_policy": "default"}).status_code == 200
            assert http.post("/v1/reward-specs", json=SCHEMA_SPEC).status_code == 201
            assert http.put("/v1/datasets/js", json={"reward_spec": "schema"}).status_code == 200
            posted = [
                _group("js-1", "js", [EVIL, '"aaaa"', '"b"', '"aa"']),
                _group("math-1", "toy", [r"$\boxed{9^{9^{9^{9}}}}$", r"$\boxed{42}$", r"$\boxed{41}$", r"$\boxed{42}$"]),
            ]
            for body in posted:
                assert http.post("/v1/groups", json=body).status_code == 201
            latencies, groups = _poll_until_scored(http, ["js-1", "math-1"], timeout_s=120)
    finally:
        stop_server(server)
    assert max(latencies) < 1.0, sorted(latencies)[-5:]  # behavioural bound, kept generous
    for gid, component in (("js-1", "valid"), ("math-1", "correct")):
        g = groups[gid]
        assert g["status"] == "ready", g
        assert _values(g, component) == [0.0, 1.0, 0.0, 1.0]
        evil = g["trajectories"][0]["rewards"][component]
        assert evil["error"] is None and evil["details"]["reason"] == "verification_timeout"
        assert [t["advantage"] for t in g["trajectories"]][1] > 0  # the siblings carry a signal

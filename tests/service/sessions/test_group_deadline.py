"""A group whose last sessions never finish is not left waiting: the worker's periodic maintenance sweeps
group deadlines (no new session has to be created for it), and the group enters scoring with the
finished sessions, the open one left out and the one never started counted as missing."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.conftest import LiveServer
from tests.service.sessions.helpers import HTTP, age, agent, finish, open_session, read, turn
from tests.service.sessions.upstreams import Upstream

USER = [{"role": "user", "content": "add 2 and 3"}]


def _wait_group(url: str, group_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = HTTP.get(f"{url}/v1/groups/{group_id}")
        if r.status_code == 200 and r.json()["status"] not in ("received", "scoring"):
            return r.json()
        time.sleep(0.3)
    raise AssertionError(f"group {group_id} was not swept and scored in {timeout_s} s")


def test_the_worker_sweeps_an_overdue_group_without_a_new_session(
    gateway_for: Callable[..., LiveServer], fake: Upstream
) -> None:
    gateway = gateway_for(fake.url, GRPO_CURATOR_EMBEDDED_WORKER="true",
                          GRPO_CURATOR_SESSION_GROUP_DEADLINE_S="60", GRPO_CURATOR_WORKER_POLL_SECONDS="0.2")
    done = open_session(gateway.url, group_size=3)
    stuck = open_session(gateway.url, group_id=done["group_id"], group_size=3)
    turn(agent(done), USER, seed=0, model="fake")
    assert finish(done)["group_ingested"] is False  # 1 of 3: the group waits
    assert HTTP.get(f"{gateway.url}/v1/groups/{done['group_id']}").status_code == 404
    age(gateway.db_url, done, stuck, seconds=61)  # the group deadline passes (the wall time, 3600 s, does not)
    group = _wait_group(gateway.url, done["group_id"])  # nothing else is called: the worker's sweep posts it
    meta = group["metadata"]
    assert meta["sessions"] == [done["session_id"]]
    assert meta["left_out_sessions"] == [stuck["session_id"]] and meta["missing_sessions"] == 1
    assert len(group["trajectories"]) == 1 and group["trajectories"][0]["metadata"]["session_id"] == done["session_id"]
    left = read(stuck, tokens=False)
    assert left["status"] == "finished" and left["finish_reason"] == "timeout" and left["ingested"]
    r = HTTP.post(stuck["base_url"] + "/chat/completions", json={"messages": USER, "max_tokens": 2},
                  headers={"Authorization": f"Bearer {stuck['api_key']}"})
    assert r.status_code == 409  # the left-out session takes no more calls

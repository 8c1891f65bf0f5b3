"""Test setup for batch delivery, and the processes the delivery tests run.

``mark_ready`` stands in for the score / curate stage (tested on its own elsewhere): it gives every
trajectory of the received groups a deterministic total reward and advantage, action 'keep', and moves
the groups to 'ready' with one SQL UPDATE. Everything else goes through the real API.

Run as ``python -m tests.service.delivery.helpers hold URL TRAINER`` it leases a batch, prints it as one
JSON line and sleeps: the kill -9 test kills it there.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from tests.helpers import make_group

_READY_TRAJECTORIES = text(
    """
    UPDATE trajectories t
       SET total_reward = (t.idx + 1) / 10.0,
           advantage = (t.idx - (g.n_trajectories - 1) / 2.0) / 3.0,
           action = 'keep'
      FROM groups g
     WHERE t.group_pk = g.pk AND g.status = 'received' AND (CAST(:ids AS text[]) IS NULL OR g.id = ANY(:ids))
    """
)
_READY_GROUPS = text(
    """
    UPDATE groups SET status = 'ready', ready_at = now()
     WHERE status = 'received' AND (CAST(:ids AS text[]) IS NULL OR id = ANY(:ids))
    RETURNING id
    """
)


def mark_ready(engine: Engine, group_ids: list[str] | None = None) -> list[str]:
    """Test setup in place of curation: received groups (all, or these ids) -> 'ready'; returns their ids."""
    with engine.begin() as conn:
        conn.execute(_READY_TRAJECTORIES, {"ids": group_ids})
        return list(conn.execute(_READY_GROUPS, {"ids": group_ids}).scalars())


def set_actions(engine: Engine, group_id: str, actions: dict[int, str]) -> None:
    """Test setup: the curation action of some trajectories of a group (e.g. 'mask', 'drop', 'penalize')."""
    with engine.begin() as conn:
        for idx, action in actions.items():
            conn.execute(
                text(
                    "UPDATE trajectories SET action = :a FROM groups g "
                    "WHERE trajectories.group_pk = g.pk AND g.id = :gid AND trajectories.idx = :idx"
                ),
                {"a": action, "gid": group_id, "idx": idx},
            )


def expire_now(engine: Engine, batch_id: str) -> None:
    """Test setup: move a lease's deadline into the past instead of sleeping until it passes."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE leases SET expires_at = clock_timestamp() - interval '1 second' WHERE id = :id"),
            {"id": batch_id},
        )


def seed_ready(
    http: Any, engine: Engine, n_groups: int, *, prefix: str = "g", **group_kwargs: Any
) -> list[str]:
    """Post ``n_groups`` groups through the API (``http``: TestClient or httpx.Client) and mark them ready."""
    ids = [f"{prefix}-{i}" for i in range(n_groups)]
    groups = [make_group(gid, prompt_id=f"{prefix}-p{i % 3}", **group_kwargs) for i, gid in enumerate(ids)]
    for start in range(0, len(groups), 64):
        r = http.post("/v1/groups", json={"groups": groups[start : start + 64]})
        assert r.status_code in (200, 201), r.text
    # the ingest route's transaction may commit just after its 201 was sent: wait until all are visible
    marked: list[str] = []
    deadline = time.monotonic() + 10
    while len(marked) < len(ids) and time.monotonic() < deadline:
        marked += mark_ready(engine, [gid for gid in ids if gid not in marked])
    assert sorted(marked) == sorted(ids), f"only {marked} of {ids} became ready"
    return ids


def group_ids(batch: dict[str, Any]) -> list[str]:
    return [g["id"] for g in batch["groups"]]


# -- processes of the exactly-once test -----------------------------------------------------------------
def producer(url: str, name: str, n_groups: int, per_post: int) -> None:
    """Posts ``n_groups`` groups over HTTP, ``per_post`` per request, with a retry on transport errors."""
    import httpx

    rng = random.Random(name)
    with httpx.Client(base_url=url, timeout=60) as http:
        for start in range(0, n_groups, per_post):
            body = {
                "groups": [
                    make_group(
                        f"{name}-{i}",
                        prompt_id=f"{name}-p{i % 5}",
                        n=rng.randint(2, 5),
                        policy_version=i // 200,
                    )
                    for i in range(start, min(start + per_post, n_groups))
                ]
            }
            r = http.post("/v1/groups", json=body)
            assert r.status_code in (200, 201), r.text


def marker(db_url: str, stop: Any) -> None:
    """Test setup in place of the curation worker: keeps marking received groups ready until ``stop``."""
    engine = create_engine(db_url)
    while not stop.is_set():
        if not mark_ready(engine):
            time.sleep(0.05)
    mark_ready(engine)
    engine.dispose()


def _lease_kwargs(rng: random.Random) -> dict[str, Any]:
    size = rng.choice(
        [
            {"max_groups": rng.randint(1, 40)},
            {"max_trajectories": rng.randint(3, 120)},
            {"max_tokens": rng.randint(40, 1200)},
        ]
    )
    return {**size, "wait_seconds": 0.5, "format": rng.choice(["json", "arrow"])}


def trainer(url: str, trainer_id: str, stop: Any, out: str, seed: int) -> None:
    """Leases until ``stop`` is set and nothing is left. Acks most batches; deterministically nacks some
    and stalls past a short lease on others (the late ack may be refused). Writes what happened to ``out``.
    """
    from service.client import CuratorClient, CuratorError

    rng = random.Random(seed)
    log: dict[str, list[Any]] = {"acked": [], "nacked": [], "refused": [], "errors": []}
    with CuratorClient(url, timeout=60) as client:
        n = 0
        while True:
            n += 1
            stall = n % 7 == 3
            batch = client.lease(
                trainer_id,
                request_id=uuid.uuid4().hex,
                lease_seconds=0.3 if stall else 30,
                **_lease_kwargs(rng),
            )
            if batch is None:
                if stop.is_set():
                    break
                continue
            ids = group_ids(batch)
            try:
                if n % 7 == 5:
                    client.nack(batch["batch_id"])
                    log["nacked"].append([batch["batch_id"], ids])
                    continue
                if stall:
                    time.sleep(0.6)
                client.ack(batch["batch_id"])
                log["acked"].append([batch["batch_id"], ids])
            except CuratorError as exc:
                (log["refused"] if exc.status_code == 409 and stall else log["errors"]).append(
                    [batch["batch_id"], str(exc)]
                )
    Path(out).write_text(json.dumps(log))


def hold(url: str, trainer_id: str) -> None:
    """Lease a small batch with a short lease, print it, then hang until killed."""
    from service.client import CuratorClient

    with CuratorClient(url) as client:
        batch = client.lease(trainer_id, max_groups=3, lease_seconds=1.0)
        print(
            json.dumps(
                {
                    "batch_id": batch["batch_id"] if batch else None,
                    "groups": group_ids(batch or {"groups": []}),
                }
            )
        )
        sys.stdout.flush()
        time.sleep(3600)


def reset(engine: Engine) -> None:
    """Empty every table the delivery tests touch (a module shares one database)."""
    with engine.begin() as conn:
        conn.execute(
            text("TRUNCATE prompts, groups, trajectories, prompt_prefixes, leases, policy_versions RESTART IDENTITY CASCADE")
        )


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold(sys.argv[2], sys.argv[3])

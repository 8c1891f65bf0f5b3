"""Lease heartbeat (``POST /v1/batches/{id}/extend``), a trainer's refusal of a batch it cannot use
(nack with ``drop``), and ready groups that went stale leaving the queue, on a real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from reward_models.scoring import Scorer
from service.app import create_app
from service.delivery.service import drop_stale, reap_expired
from service.store.db import make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from tests.service.delivery.helpers import expire_now, reset, seed_ready


@pytest.fixture(scope="module")
def url(make_db) -> str:
    return make_db()


@pytest.fixture
def db(url: str) -> Iterator[Engine]:
    engine = create_engine(url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(url: str, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(database_url=url)) as c:
        yield c


def _reap(db: Engine) -> int:
    with make_sessionmaker(db).begin() as s:
        return reap_expired(s)


def _lease(api: TestClient, seconds: float, trainer: str = "t") -> dict:
    r = api.post("/v1/batches/lease", json={"trainer_id": trainer, "max_groups": 10, "lease_seconds": seconds})
    assert r.status_code == 200, r.text
    return r.json()


class TestExtend:
    def test_heartbeat_keeps_a_long_steps_batch(self, api, db):
        seed_ready(api, db, 2)
        batch = _lease(api, 1.0)
        for _ in range(3):  # a step three times longer than lease_seconds, with a heartbeat each second
            time.sleep(0.6)
            r = api.post(f"/v1/batches/{batch['batch_id']}/extend", json={"lease_seconds": 1.0})
            assert r.status_code == 200, r.text
            assert _reap(db) == 0
        assert api.post("/v1/batches/lease", json={"trainer_id": "other", "max_groups": 10}).status_code == 204
        assert api.post(f"/v1/batches/{batch['batch_id']}/ack").json()["status"] == "acked"

    def test_without_heartbeat_the_batch_is_taken_over(self, api, db):
        seed_ready(api, db, 2)
        batch = _lease(api, 0.5)
        time.sleep(0.7)
        assert _reap(db) == 1
        assert _lease(api, 30, "other")["groups"]
        r = api.post(f"/v1/batches/{batch['batch_id']}/extend", json={"lease_seconds": 60})
        assert r.status_code == 409 and "expired" in r.json()["error"]
        assert api.post(f"/v1/batches/{batch['batch_id']}/ack").status_code == 409

    def test_overdue_lease_not_yet_reaped_can_still_extend(self, api, db):
        seed_ready(api, db, 1)
        batch = _lease(api, 30)
        expire_now(db, batch["batch_id"])
        r = api.post(f"/v1/batches/{batch['batch_id']}/extend", json={"lease_seconds": 60})
        assert r.status_code == 200 and not r.json()["deadline_passed"]
        assert _reap(db) == 0

    @pytest.mark.parametrize("body", [{}, {"lease_seconds": 0}, {"lease_seconds": -1}, {"lease_seconds": 1e9},
                                      {"lease_seconds": "x"}, {"lease_seconds": 5, "extra": 1}])
    def test_bad_body_is_422_naming_the_field(self, api, db, body):
        seed_ready(api, db, 1)
        batch = _lease(api, 30)
        r = api.post(f"/v1/batches/{batch['batch_id']}/extend", json=body)
        assert r.status_code == 422 and ("lease_seconds" in r.text or "extra" in r.text)

    def test_unknown_batch_is_404(self, api, db):
        assert api.post("/v1/batches/nope/extend", json={"lease_seconds": 5}).status_code == 404


class TestNack:
    def test_nack_with_drop_takes_the_groups_out_of_the_queue(self, api, db):
        seed_ready(api, db, 2)
        with db.begin() as c:  # really untrainable (the service re-checks a trainer's drop)
            c.execute(text("UPDATE trajectories SET loss_mask = NULL WHERE idx = 0"))
        batch = _lease(api, 30)
        r = api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"reason": "no logprobs", "drop": True})
        assert r.status_code == 200 and r.json()["status"] == "nacked"
        assert api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10}).status_code == 204
        with db.connect() as c:
            rows = c.execute(text("SELECT status, drop_reason FROM groups")).all()
            assert rows == [("dropped", "untrainable")] * 2
            reasons = c.execute(text("SELECT reason FROM decisions WHERE rule = 'untrainable'")).scalars().all()
            assert len(reasons) == 2 and all("no logprobs" in r for r in reasons)
            assert c.execute(text("SELECT reason FROM leases")).scalar_one() == "no logprobs"

    def test_plain_nack_still_redelivers(self, api, db):
        seed_ready(api, db, 2)
        batch = _lease(api, 30)
        assert api.post(f"/v1/batches/{batch['batch_id']}/nack").status_code == 200
        assert len(_lease(api, 30)["groups"]) == 2


def test_stale_ready_groups_leave_the_queue_with_a_decision(api, db):
    api.post("/v1/curation-policies", json={"name": "fresh", "max_staleness": 2})
    api.put("/v1/datasets/toy", json={"curation_policy": "fresh"})
    for v in (0, 2, 3):
        api.post("/v1/groups", json=make_group(f"v{v}", prompt_id=f"p{v}", policy_version=v,
                                               answers=["42", "41", "42", "1"]))
    with Scorer(processes=1) as scorer:
        drain(make_sessionmaker(db), scorer)
    with db.connect() as c:
        assert c.execute(text("SELECT count(*) FROM groups WHERE status = 'ready'")).scalar_one() == 3
    assert api.post("/v1/policy", json={"version": 5}).status_code in (200, 201)
    with make_sessionmaker(db).begin() as s:
        assert drop_stale(s) == 2  # 5 - 0 and 5 - 2 exceed 2; 5 - 3 does not
    with db.connect() as c:
        rows = c.execute(text("SELECT id, status, drop_reason FROM groups ORDER BY id")).all()
        assert rows == [("v0", "dropped", "stale"), ("v2", "dropped", "stale"), ("v3", "ready", None)]
        reasons = c.execute(text("SELECT reason FROM decisions WHERE rule = 'stale'")).scalars().all()
        assert sorted(reasons)[0].startswith("stale: sampled at policy version 0, trainer at 5")


def test_need_logprobs_leases_only_groups_with_behaviour_logprobs(api, db):
    seed_ready(api, db, 2)
    with db.begin() as c:
        c.execute(text("UPDATE trajectories SET logprobs = NULL WHERE idx = 1 AND group_pk ="
                       " (SELECT pk FROM groups WHERE id = 'g-0')"))
    r = api.post("/v1/batches/lease", json={"trainer_id": "picky", "max_groups": 10, "need_logprobs": True})
    assert r.status_code == 200 and [g["id"] for g in r.json()["groups"]] == ["g-1"], r.text
    r = api.post("/v1/batches/lease", json={"trainer_id": "picky", "max_groups": 10, "need_logprobs": True})
    assert r.status_code == 204  # g-0 is not for it
    r = api.post("/v1/batches/lease", json={"trainer_id": "other", "max_groups": 10})
    assert [g["id"] for g in r.json()["groups"]] == ["g-0"]
    r = api.post("/v1/batches/lease", json={"trainer_id": "x", "max_groups": 1, "need_logprobs": "yes"})
    assert r.status_code == 422 and "need_logprobs" in r.text

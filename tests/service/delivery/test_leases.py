"""POST /v1/batches/lease, ack, nack, GET /v1/batches/{id} against a real PostgreSQL, real transactions.

The module shares one migrated database (emptied before each test); the app runs in-process with its
own sessions, so every request commits for real and leases, expiry and fencing behave as in production.
Groups are made ready by ``tests.service.delivery.helpers.mark_ready`` (test setup in place of curation).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from reward_models.scoring import Scorer
from service.app import create_app
from service.client import decode_arrow
from service.delivery.schemas import ARROW_MEDIA_TYPE, BatchOut
from service.delivery.service import reap_expired
from service.store.db import make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory
from tests.service.delivery.helpers import expire_now, group_ids, mark_ready, reset, seed_ready, set_actions


@pytest.fixture(scope="module")
def delivery_url(make_db) -> str:
    return make_db()


@pytest.fixture
def db(delivery_url: str) -> Iterator[Engine]:
    engine = create_engine(delivery_url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(delivery_url: str, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(database_url=delivery_url)) as c:
        yield c


def lease(
    api: TestClient, trainer: str = "t0", *, arrow: bool = False, **body
) -> tuple[int, dict | bytes | None]:
    body = {"trainer_id": trainer, **body}
    if not any(k in body for k in ("max_groups", "max_trajectories", "max_tokens")):
        body["max_groups"] = 100
    headers = {"Accept": ARROW_MEDIA_TYPE} if arrow else {}
    r = api.post("/v1/batches/lease", json=body, headers=headers)
    if r.status_code == 204:
        return 204, None
    return r.status_code, (r.content if arrow and r.status_code == 200 else r.json())


def rows(engine: Engine, sql: str, **params) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def status_of(engine: Engine, gid: str) -> tuple:
    return rows(engine, "SELECT status, lease_id, staleness FROM groups WHERE id = :g", g=gid)[0]


class TestLease:
    def test_batch_carries_what_a_trainer_needs(self, api, db):
        ids = seed_ready(api, db, 3, prefix="a", policy_version=2)
        code, batch = lease(api, max_groups=2)
        assert code == 200
        BatchOut.model_validate(batch)
        assert group_ids(batch) == ids[:2]  # oldest first, whole groups
        sent = make_group("x", n=4)["trajectories"]
        g = batch["groups"][0]
        assert (g["prompt_id"], g["policy_version"], g["temperature"]) == ("a-p0", 2, 1.0)
        for i, t in enumerate(g["trajectories"]):
            assert t["index"] == i
            assert t["token_ids"] == sent[i]["token_ids"]
            assert t["loss_mask"] == sent[i]["loss_mask"]
            assert t["logprobs"] == np.float32(sent[i]["logprobs"]).tolist()
            assert t["advantage"] == float(np.float32((i - 1.5) / 3))
            assert t["total_reward"] == float(np.float32((i + 1) / 10))
        assert batch["stats"] | {"policy_version": None} == {
            "groups": 2,
            "trajectories": 8,
            "tokens": 80,
            "policy_version": None,
            "order": "oldest",
            "replayed": False,
            "skipped": 0,
        }
        assert [status_of(db, gid)[:2] for gid in ids] == [
            ("leased", batch["batch_id"]),
            ("leased", batch["batch_id"]),
            ("ready", None),
        ]
        state = api.get(f"/v1/batches/{batch['batch_id']}").json()
        assert state["status"] == "active" and state["groups"] == ids[:2] and state["trainer_id"] == "t0"
        assert (state["n_groups"], state["n_trajectories"], state["n_tokens"]) == (2, 8, 80)
        assert state["deadline_passed"] is False and state["expires_at"] == batch["expires_at"]

    def test_only_trajectories_with_a_gradient_are_delivered(self, api, db):
        ids = seed_ready(api, db, 3, prefix="d")
        set_actions(db, ids[0], {1: "mask", 2: "drop"})
        set_actions(db, ids[1], {0: "penalize", 3: "resample"})
        set_actions(db, ids[2], {0: "drop", 1: "drop", 2: "mask", 3: "resample"})  # nothing left
        code, batch = lease(api, max_groups=10)
        assert code == 200 and group_ids(batch) == ids[:2]
        assert [[t["index"] for t in g["trajectories"]] for g in batch["groups"]] == [[0, 3], [0, 1, 2]]
        assert batch["stats"]["trajectories"] == 5 and batch["stats"]["skipped"] == 1
        assert status_of(db, ids[2])[0] == "ready"  # skipped safely, never leased

    def test_leased_groups_are_not_delivered_again(self, api, db):
        ids = seed_ready(api, db, 4, prefix="s")
        _, first = lease(api, max_groups=3)
        _, second = lease(api, "t1", max_groups=3)
        assert group_ids(first) == ids[:3] and group_ids(second) == ids[3:]
        assert lease(api, "t2", max_groups=3) == (204, None)


class TestSizing:
    def test_max_trajectories_takes_whole_groups(self, api, db):
        ids = seed_ready(api, db, 4, prefix="mt")
        _, batch = lease(api, max_trajectories=10)
        assert group_ids(batch) == ids[:2] and batch["stats"]["trajectories"] == 8

    def test_max_tokens_counts_every_token_id(self, api, db):
        ids = seed_ready(api, db, 4, prefix="tk")  # 4 trajectories x 10 tokens per group
        _, batch = lease(api, max_tokens=100)
        assert group_ids(batch) == ids[:2] and batch["stats"]["tokens"] == 80

    def test_a_head_group_over_the_budget_is_delivered_alone_not_starved(self, api, db):
        big = seed_ready(api, db, 1, prefix="big", n=8)  # 80 tokens
        small = seed_ready(api, db, 3, prefix="small", n=2)  # 20 tokens each
        _, batch = lease(api, max_tokens=50)  # every trainer asks for 50: passing it over would starve it
        assert group_ids(batch) == big and batch["stats"]["tokens"] == 80
        _, batch = lease(api, max_tokens=50)
        assert group_ids(batch) == small[:2]
        _, batch = lease(api, max_tokens=50)
        assert group_ids(batch) == small[2:]

    def test_chunked_claim_matches_a_greedy_prefix(self, api, db):
        rng = np.random.default_rng(0)
        sizes = [int(s) for s in rng.integers(1, 7, size=60)]
        ids = []
        for i, n in enumerate(sizes):
            ids += seed_ready(api, db, 1, prefix=f"c{i:02d}", n=n)
        budget = 97
        expected, used = [], 0
        for gid, n in zip(ids, sizes, strict=True):  # the reference: whole groups in order while they fit
            if used + n > budget:
                break
            expected.append(gid)
            used += n
        _, batch = lease(api, max_trajectories=budget)
        assert group_ids(batch) == expected and batch["stats"]["trajectories"] == used

    def test_freshest_policy_first(self, api, db):
        ids = []
        for i, version in enumerate([1, 3, 2, 3]):
            ids += seed_ready(api, db, 1, prefix=f"f{i}", policy_version=version)
        _, batch = lease(api, max_groups=3, order="freshest")
        assert group_ids(batch) == [ids[1], ids[3], ids[2]]
        assert batch["stats"]["order"] == "freshest"

    def test_max_staleness_against_the_published_policy(self, api, db):
        assert api.post("/v1/policy", json={"version": 10, "metrics": {}}).status_code == 201
        ids = []
        for i, version in enumerate([5, 8, 10, 9]):
            ids += seed_ready(api, db, 1, prefix=f"st{i}", policy_version=version)
        _, batch = lease(api, max_groups=10, max_staleness=1)
        assert group_ids(batch) == [ids[2], ids[3]]
        assert batch["stats"]["policy_version"] == 10
        # the groups that lease passed over (8 and 5 are > 1 behind 10) left the queue with a decision:
        # left 'ready', they would count as the producer's backlog for ever
        with db.connect() as c:
            rows = c.execute(text(
                "SELECT g.id, g.status, g.drop_reason, d.reason FROM groups g JOIN decisions d"
                " ON d.group_pk = g.pk AND d.idx IS NULL AND d.rule = 'stale' ORDER BY g.pk"
            )).all()
        assert [(r[0], r[1], r[2]) for r in rows] == [(ids[0], "dropped", "stale"), (ids[1], "dropped", "stale")]
        assert "lease max_staleness 1" in rows[0][3]
        status, _ = lease(api, max_groups=10, max_staleness=2)
        assert status == 204  # nothing is ready any more, the 8 included

    def test_a_lease_without_max_staleness_drops_nothing(self, api, db):
        assert api.post("/v1/policy", json={"version": 10, "metrics": {}}).status_code == 201
        ids = seed_ready(api, db, 2, prefix="nost", policy_version=0)
        _, batch = lease(api, max_groups=10)
        assert sorted(group_ids(batch)) == sorted(ids)


class TestValidation:
    @pytest.mark.parametrize(
        ("body", "names"),
        [
            ({}, ["max_groups", "max_trajectories", "max_tokens"]),
            ({"max_groups": 2, "max_tokens": 10}, ["max_groups", "max_trajectories", "max_tokens"]),
            ({"max_groups": 0}, ["max_groups"]),
            ({"max_trajectories": 10**9}, ["max_trajectories"]),
            ({"max_groups": 1, "wait_seconds": 61}, ["wait_seconds"]),
            ({"max_groups": 1, "lease_seconds": 0}, ["lease_seconds"]),
            ({"max_groups": 1, "max_staleness": -1}, ["max_staleness"]),
            ({"max_groups": 1, "order": "random"}, ["order"]),
            ({"max_groups": 1, "batch": 3}, ["batch"]),
        ],
    )
    def test_bad_requests_name_the_field(self, api, db, body, names):
        r = api.post("/v1/batches/lease", json={"trainer_id": "t0", **body})
        assert r.status_code == 422
        assert all(name in r.json()["error"] for name in names), r.json()

    def test_trainer_id_is_required(self, api, db):
        r = api.post("/v1/batches/lease", json={"max_groups": 1})
        assert r.status_code == 422 and "trainer_id" in r.json()["error"]


class TestAckNack:
    def test_ack_consumes_and_records_staleness(self, api, db):
        api.post("/v1/policy", json={"version": 3, "metrics": {}})
        ids = seed_ready(api, db, 2, prefix="ack", policy_version=1)
        _, batch = lease(api, max_groups=5)
        api.post("/v1/policy", json={"version": 5, "metrics": {"loss": 0.5}})  # the trainer stepped meanwhile
        r = api.post(f"/v1/batches/{batch['batch_id']}/ack")
        assert r.status_code == 200 and r.json()["status"] == "acked" and r.json()["ended_at"]
        assert [status_of(db, gid) for gid in ids] == [("consumed", batch["batch_id"], 4)] * 2
        again = api.post(f"/v1/batches/{batch['batch_id']}/ack")  # idempotent
        assert again.status_code == 200 and again.json() == r.json()
        assert api.get(f"/v1/groups/{ids[0]}").json()["staleness"] == 4

    def test_unknown_batch_is_404(self, api, db):
        for path in ("/v1/batches/nope/ack", "/v1/batches/nope/nack"):
            r = api.post(path)
            assert r.status_code == 404 and "batch_id" in r.json()["error"]
        assert api.get("/v1/batches/nope").status_code == 404

    def test_nack_returns_groups_and_fences_a_later_ack(self, api, db):
        ids = seed_ready(api, db, 2, prefix="nk")
        _, batch = lease(api)
        assert api.post(f"/v1/batches/{batch['batch_id']}/nack").json()["status"] == "nacked"
        assert api.post(f"/v1/batches/{batch['batch_id']}/nack").status_code == 200  # idempotent
        assert [status_of(db, gid)[:2] for gid in ids] == [("ready", None)] * 2
        r = api.post(f"/v1/batches/{batch['batch_id']}/ack")
        assert r.status_code == 409 and "nacked" in r.json()["error"]
        _, again = lease(api, "t1")
        assert group_ids(again) == ids

    def test_ack_after_the_deadline_succeeds_while_nobody_took_the_groups(self, api, db):
        ids = seed_ready(api, db, 2, prefix="late")
        _, batch = lease(api)
        expire_now(db, batch["batch_id"])
        assert api.get(f"/v1/batches/{batch['batch_id']}").json()["deadline_passed"] is True
        assert api.post(f"/v1/batches/{batch['batch_id']}/ack").status_code == 200
        assert [status_of(db, gid)[0] for gid in ids] == ["consumed"] * 2

    def test_late_ack_after_release_is_409_and_nothing_is_consumed_twice(self, api, db):
        ids = seed_ready(api, db, 3, prefix="re")
        _, a = lease(api, "slow")
        expire_now(db, a["batch_id"])
        _, b = lease(api, "fast")  # reaps a, takes its groups
        assert group_ids(b) == ids
        r = api.post(f"/v1/batches/{a['batch_id']}/ack")
        assert r.status_code == 409 and "expired" in r.json()["error"]
        assert api.post(f"/v1/batches/{a['batch_id']}/nack").status_code == 409
        assert [status_of(db, gid)[:2] for gid in ids] == [("leased", b["batch_id"])] * 3  # untouched
        assert api.post(f"/v1/batches/{b['batch_id']}/ack").status_code == 200
        assert api.get(f"/v1/batches/{a['batch_id']}").json()["status"] == "expired"
        consumed = rows(
            db, "SELECT count(*) FROM groups WHERE status = 'consumed' AND lease_id = :b", b=b["batch_id"]
        )
        assert consumed == [(3,)]

    def test_reap_expired_for_the_worker(self, api, db, delivery_url):
        ids = seed_ready(api, db, 2, prefix="rp")
        _, a = lease(api)
        _, none = lease(api, "t1")
        assert none is None
        expire_now(db, a["batch_id"])
        factory = make_sessionmaker(db)
        with factory.begin() as session:
            assert reap_expired(session) == 1
        with factory.begin() as session:
            assert reap_expired(session) == 0
        assert [status_of(db, gid)[:2] for gid in ids] == [("ready", None)] * 2
        assert api.get(f"/v1/batches/{a['batch_id']}").json()["status"] == "expired"


class TestRequestId:
    def test_a_retried_request_returns_the_same_batch(self, api, db):
        seed_ready(api, db, 3, prefix="rq")
        _, first = lease(api, max_groups=2, request_id="req-1")
        _, again = lease(api, max_groups=2, request_id="req-1")
        assert again["stats"].pop("replayed") is True and first["stats"].pop("replayed") is False
        first["stats"].pop("skipped"), again["stats"].pop("skipped")
        assert again == first
        assert rows(db, "SELECT count(*) FROM leases") == [(1,)]
        api.post(f"/v1/batches/{first['batch_id']}/ack")
        code, body = lease(api, max_groups=2, request_id="req-1")
        assert code == 409 and "acked" in body["error"]

    def test_a_request_id_belongs_to_its_trainer(self, api, db):
        seed_ready(api, db, 1, prefix="own")
        lease(api, "t0", request_id="req-2")
        code, body = lease(api, "t1", request_id="req-2")
        assert code == 409 and "request_id" in body["error"]


class TestLongPoll:
    def test_204_when_nothing_is_ready_within_the_wait(self, api, db):
        assert lease(api, wait_seconds=0) == (204, None)
        assert lease(api, wait_seconds=0.3) == (204, None)
        assert rows(db, "SELECT count(*) FROM leases") == [(0,)]

    def test_a_waiting_lease_gets_a_group_that_becomes_ready(self, api, db):
        r = api.post("/v1/groups", json=make_group("wait-1"))
        assert r.status_code == 201
        result: list = []
        waiter = threading.Thread(target=lambda: result.append(lease(api, wait_seconds=20)))
        waiter.start()
        time.sleep(0.3)  # let the request start waiting (setup, not an assertion)
        mark_ready(db, ["wait-1"])
        waiter.join(timeout=30)
        code, batch = result[0]
        assert code == 200 and group_ids(batch) == ["wait-1"]


class TestFormats:
    def _seed_varied(self, api, db) -> list[str]:
        g = make_group("fmt-0", n=4)
        g["trajectories"][1] = make_trajectory(seed=9, logprobs=None)  # the sampler sent no log-probs
        g["trajectories"][2] = make_trajectory(seed=3, token_ids=None, loss_mask=None, logprobs=None)
        g["trajectories"][3] = make_trajectory(seed=4, prompt_len=0, response_len=0)  # empty arrays
        no_temp = make_group("fmt-1", n=3, policy_version=7, sampling={"max_tokens": 4})
        g["sampling"]["temperature"] = 0.7  # the trainer scores this group's tokens at 0.7
        for body in (g, no_temp):
            assert api.post("/v1/groups", json=body).status_code == 201
        mark_ready(db)
        set_actions(db, "fmt-1", {1: "mask", 2: "penalize"})
        return ["fmt-0", "fmt-1"]

    def test_arrow_and_json_decode_to_identical_numbers(self, api, db):
        ids = self._seed_varied(api, db)
        r_json = api.post(
            "/v1/batches/lease", json={"trainer_id": "t0", "max_groups": 5, "request_id": "fmt"}
        )
        r_arrow = api.post(
            "/v1/batches/lease",
            json={"trainer_id": "t0", "max_groups": 5, "request_id": "fmt"},
            headers={"Accept": ARROW_MEDIA_TYPE},
        )
        assert r_arrow.headers["content-type"] == ARROW_MEDIA_TYPE
        as_json = r_json.json()
        as_arrow = decode_arrow(r_arrow.content)
        assert r_arrow.headers["x-batch-id"] == r_json.headers["x-batch-id"] == as_json["batch_id"]
        assert as_arrow["stats"].pop("replayed") and not as_json["stats"].pop("replayed")
        as_arrow["stats"].pop("skipped"), as_json["stats"].pop("skipped")
        assert as_arrow == as_json  # every number identical, nulls where nothing was sent
        assert group_ids(as_json) == ids
        t = as_json["groups"][0]["trajectories"]
        assert t[1]["logprobs"] is None and t[1]["token_ids"] is not None
        assert t[2]["token_ids"] is None and t[3]["token_ids"] == [] and t[3]["logprobs"] == []
        assert [x["index"] for x in as_json["groups"][1]["trajectories"]] == [0, 2]
        assert [g["temperature"] for g in as_json["groups"]] == [0.7, None]
        self._check_columns(r_arrow.content, as_json)

    def _check_columns(self, data: bytes, as_json: dict) -> None:
        """pyarrow and polars read the stream to the same numbers as the JSON, one row per trajectory."""
        flat = [(g, t) for g in as_json["groups"] for t in g["trajectories"]]
        table = pa.ipc.open_stream(data).read_all()
        assert table.schema.metadata[b"batch_id"].decode() == as_json["batch_id"]
        assert table.schema.field("token_ids").type == pa.list_(pa.int32())
        assert table.schema.field("logprobs").type == pa.list_(pa.float32())
        frame = pl.read_ipc_stream(data)
        assert frame.height == table.num_rows == len(flat)
        for name in ("token_ids", "loss_mask", "logprobs", "advantage", "total_reward", "index"):
            expected = [t[name] for _, t in flat]
            assert table.column(name).to_pylist() == expected
            assert frame[name].to_list() == expected
        assert frame["group_id"].to_list() == [g["id"] for g, _ in flat]
        assert frame["policy_version"].to_list() == [g["policy_version"] for g, _ in flat]

    def test_numpy_views_for_trainers(self, api, db):
        self._seed_varied(api, db)
        r = api.post(
            "/v1/batches/lease",
            json={"trainer_id": "t0", "max_groups": 5},
            headers={"Accept": ARROW_MEDIA_TYPE},
        )
        views = decode_arrow(r.content, as_numpy=True)
        lists = decode_arrow(r.content)
        t0 = views["groups"][0]["trajectories"][0]
        assert (t0["token_ids"].dtype, t0["loss_mask"].dtype, t0["logprobs"].dtype) == (
            np.int32,
            np.uint8,
            np.float32,
        )
        assert t0["token_ids"].tolist() == lists["groups"][0]["trajectories"][0]["token_ids"]


def test_min_groups_waits_for_a_full_batch_then_returns_partial(fresh_db):
    """With min_groups the long poll does not hand out a thin batch early; at the deadline it returns
    the partial batch there is instead of failing."""
    import threading
    import time

    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine

    from service.app import create_app
    from tests.service.delivery.helpers import seed_ready

    engine = create_engine(fresh_db)
    with TestClient(create_app(database_url=fresh_db)) as c:
        seed_ready(c, engine, 1, prefix="mg0")
        later = threading.Timer(0.6, lambda: seed_ready(c, engine, 1, prefix="mg1"))
        later.start()
        t0 = time.monotonic()
        full = c.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 2, "min_groups": 2, "wait_seconds": 10})
        later.join()
        assert full.status_code == 200 and len(full.json()["groups"]) == 2
        assert time.monotonic() - t0 < 10
        seed_ready(c, engine, 1, prefix="mg2")
        partial = c.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 4, "min_groups": 4, "wait_seconds": 0.5})
        assert partial.status_code == 200 and [g["id"] for g in partial.json()["groups"]] == ["mg2-0"]
        bad = c.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 2, "min_groups": 3})
        assert bad.status_code == 422 and "min_groups" in bad.json()["error"]
    engine.dispose()


# -- 3. a trainer can destroy good data with nack(drop=True) --------------------------------------------
# Attack: nack(drop=True) dropped trainable groups for good on the trainer's word alone.
def test_nack_drop_does_not_destroy_trainable_groups(fresh_api):
    """``nack`` with ``drop`` drops the groups permanently on the trainer's word alone; the service never
    checks they really are untrainable. One trainer with a stricter need (old_from_batch without
    producer logprobs) or a bug discards groups every other trainer could use."""
    g = make_group("good-1", prompt_id="gp1", answers=["42", "41", "42", "0"])
    assert fresh_api.post("/v1/groups", json=g).status_code in (200, 201)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 1
    batch = fresh_api.post("/v1/batches/lease", json={"trainer_id": "rogue", "max_groups": 4}).json()
    r = fresh_api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"reason": "I don't like it", "drop": True})
    assert r.status_code in (200, 409, 422)
    # the group has token ids, loss mask and logprobs: it must stay deliverable to other trainers
    assert fresh_api.get("/v1/groups/good-1").json()["status"] == "ready"


# Attack: the nack-drop fix had to drop only the groups the service itself finds untrainable.
def test_nack_drop_drops_only_groups_the_service_finds_untrainable(fresh_api):
    """A batch of a trainable group and one whose token ids vanished after curation (stored by hand): the
    trainer's drop removes only the really untrainable one; the other goes back to ready, and both get a
    decision naming the trainer's reason."""
    from sqlalchemy import select, text

    from service.store.models import Decision, Group

    for gid in ("keep-1", "bad-1"):
        assert fresh_api.post("/v1/groups", json=make_group(gid, prompt_id=f"p-{gid}",
                                                     answers=["42", "41", "42", "0"])).status_code in (200, 201)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 2
    with fresh_api.factory.begin() as s:
        s.execute(text("UPDATE trajectories SET token_ids = NULL WHERE idx = 1 AND group_pk ="
                       " (SELECT pk FROM groups WHERE id = 'bad-1')"))
    batch = fresh_api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 4}).json()
    assert len(batch["groups"]) == 2
    r = fresh_api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"reason": "cannot use", "drop": True})
    assert r.status_code == 200, r.text
    assert fresh_api.get("/v1/groups/keep-1").json()["status"] == "ready"
    assert fresh_api.get("/v1/groups/bad-1").json()["status"] == "dropped"
    with fresh_api.factory() as s:
        rows = dict(s.execute(select(Group.id, Decision.action).join(Group, Group.pk == Decision.group_pk)
                              .where(Decision.rule.in_(("nack", "untrainable")))).all())
    assert rows == {"keep-1": "keep", "bad-1": "drop"}

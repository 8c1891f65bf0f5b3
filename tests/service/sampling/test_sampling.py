"""GET /v1/sampling/requests: resample, refill, new and curriculum picks in that order; claims that two
producers never share; lease expiry; done; the curriculum's SQL priority against filters.curriculum."""

from __future__ import annotations

import random
import threading

import httpx
import pytest
from sqlalchemy import func, select, text

from filters.curriculum import priority_for
from filters.types import CurriculumConfig
from service.sampling import repository as repo
from service.store.db import get_engine, make_sessionmaker
from service.store.models import SamplingRequest
from tests.helpers import make_group


def _prompts(client, ids, dataset="toy", **extra):
    body = {
        "prompts": [
            {
                "id": i,
                "dataset": dataset,
                "messages": [{"role": "user", "content": f"q {i}"}],
                "reference": {"answer": "42"},
                **extra,
            }
            for i in ids
        ]
    }
    assert client.post("/v1/prompts", json=body).status_code == 200


def _get(client, **params):
    r = client.get("/v1/sampling/requests", params=params)
    assert r.status_code == 200, r.text
    return r.json()["requests"]


def _history(session, outcomes: dict[str, list[float]]):
    """Give prompts a curated history (and a group each, so they are not 'new')."""
    for pid, means in outcomes.items():
        session.execute(
            text("UPDATE prompts SET n_groups = :n, recent_outcomes = CAST(:o AS jsonb) WHERE id = :id"),
            {"n": len(means), "o": str(means), "id": pid},
        )


def _request(session, **values) -> int:
    row = SamplingRequest(**{"n": 4, "budget": {"max_tokens": 16}, "priority": 1.0, **values})
    session.add(row)
    session.flush()
    return row.pk


class TestOrder:
    def test_nothing_to_sample(self, client):
        assert _get(client) == []

    def test_resample_then_refill_then_new_then_curriculum(self, client, session):
        _prompts(client, ["a", "b", "c", "d"])
        _history(session, {"a": [1.0, 0.0], "b": [0.5], "c": [1.0]})  # d never sampled
        rs = _request(
            session, prompt_id="a", dataset="toy", reason="resample", budget={"max_tokens": 32}, priority=2.0
        )
        rf = _request(session, prompt_id=None, dataset="toy", reason="refill", n=8)
        got = _get(client, n=10, producer_id="p1", include_reference=True)
        assert [g["reason"] for g in got] == ["resample", "refill", "curriculum", "curriculum"]
        assert got[0] | {"prompt": None, "expires_at": None} == {
            "request_id": rs,
            "prompt_id": "a",
            "dataset": "toy",
            "reason": "resample",
            "n": 4,
            "budget": {"max_tokens": 32},
            "priority": 2.0,
            "prompt": None,
            "expires_at": None,
            "group_id": None,  # a fresh-group resample (resample_wait_seconds 0) names no slot
            "index": None,
            "checkpoint": None,
        }
        # the refill takes the never-sampled prompt first (fewest groups); a is busy with its resample
        assert (got[1]["request_id"], got[1]["prompt_id"], got[1]["n"]) == (rf, "d", 8)
        assert [g["prompt_id"] for g in got[2:]] == ["b", "c"]  # both one group; b first by id
        assert got[0]["prompt"]["reference"] == {"answer": "42"} and got[0]["expires_at"]
        assert len({g["request_id"] for g in got}) == 4

    def test_new_prompts_take_their_last_group_budget_or_the_defaults(self, client):
        _prompts(client, ["x", "y"])
        got = _get(client, n=5, group_size=6)
        assert [(g["reason"], g["prompt_id"], g["n"], g["budget"], g["request_id"]) for g in got] == [
            ("new", "x", 6, {}, None),
            ("new", "y", 6, {}, None),
        ]
        assert got[0]["prompt"]["reference"] is None  # only with include_reference
        client.post("/v1/groups", json=make_group("gx", prompt_id="x", n=3, answers=["42", "1", "2"], inline_prompt=False))
        got = _get(client, n=5)
        assert [(g["reason"], g["prompt_id"], g["n"], g["budget"]) for g in got] == [
            ("new", "y", 8, {}),
            ("curriculum", "x", 3, {"temperature": 1.0, "max_tokens": 16}),
        ]

    def test_dataset_filter(self, client, session):
        _prompts(client, ["m1"], dataset="math")
        _prompts(client, ["c1"], dataset="code")
        _request(session, prompt_id=None, dataset="code", reason="refill")
        got = _get(client, dataset="math", producer_id="p")
        assert [(g["prompt_id"], g["reason"]) for g in got] == [("m1", "new")]


class TestClaims:
    def test_peek_stores_nothing_and_claims_are_not_handed_out_twice(self, client, session):
        _prompts(client, ["a", "b", "c"])
        assert len(_get(client, n=2)) == 2
        assert session.scalar(select(func.count()).select_from(SamplingRequest)) == 0
        first = _get(client, n=2, producer_id="p1")
        second = _get(client, n=2, producer_id="p2")
        assert [g["prompt_id"] for g in first] == ["a", "b"] and [g["prompt_id"] for g in second] == ["c"]
        assert _get(client, n=2, producer_id="p3") == []
        rows = session.execute(select(SamplingRequest.taken_by, SamplingRequest.status)).all()
        assert sorted(rows) == [("p1", "taken"), ("p1", "taken"), ("p2", "taken")]

    def test_expired_claim_is_handed_out_again(self, client, session):
        _prompts(client, ["a", "b"])
        _history(session, {"a": [0.5], "b": [0.5]})
        rf = _request(session, prompt_id=None, dataset="toy", reason="refill")
        first = _get(client, n=1, producer_id="p1")
        assert [g["request_id"] for g in first] == [rf]
        assert _get(client, n=1, producer_id="p2")[0]["request_id"] != rf
        session.execute(text("UPDATE sampling_requests SET taken_at = now() - interval '11 minutes'"))
        again = _get(client, n=1, producer_id="p2")
        assert [(g["request_id"], g["reason"]) for g in again] == [(rf, "refill")]
        assert session.get(SamplingRequest, rf).taken_by == "p2"

    def test_done(self, client, session):
        _prompts(client, ["a"])
        rf = _request(session, prompt_id=None, dataset="toy", reason="refill")
        got = _get(client, producer_id="p1")
        r = client.post("/v1/sampling/requests/done", json={"request_ids": [rf, 10**9]})
        assert r.status_code == 200 and r.json() == {"done": [rf], "unknown": [10**9]}
        session.execute(text("UPDATE sampling_requests SET taken_at = now() - interval '1 day'"))
        assert all(g["reason"] != "refill" for g in _get(client, producer_id="p2"))
        assert got[0]["prompt_id"] == "a"

    def test_bad_input_names_the_field(self, client):
        assert "n" in client.get("/v1/sampling/requests", params={"n": 0}).json()["error"]
        r = client.post("/v1/sampling/requests/done", json={"request_ids": []})
        assert r.status_code == 422 and "request_ids" in r.json()["error"]


class TestCurriculum:
    def test_solved_and_failed_prompts_come_last(self, client, session):
        _prompts(client, ["solved", "failed", "mixed", "young"])
        _history(
            session,
            {
                "solved": [1.0, 1.0, 1.0],
                "failed": [0.0, 0.0, 0.0, 0.0],
                "mixed": [1.0, 0.0, 1.0],
                "young": [1.0, 1.0],
            },
        )
        got = _get(client, n=4)
        assert [(g["prompt_id"], g["priority"]) for g in got] == [
            ("young", 1.0),
            ("mixed", 1.0),
            ("solved", 0.1),
            ("failed", 0.1),
        ]  # then fewest groups

    def test_policy_config_dataset_then_prompt(self, client, session):
        pol = {"name": "strict", "curriculum": {"k": 2, "low_priority": 0.0}}
        assert client.post("/v1/curation-policies", json=pol).status_code == 201
        assert (
            client.post("/v1/curation-policies", json={"name": "lenient", "curriculum": {"k": 5}}).status_code
            == 201
        )
        assert client.put("/v1/datasets/toy", json={"curation_policy": "strict"}).status_code == 200
        _prompts(client, ["young", "mixed"])
        _prompts(client, ["own"], curation_policy="lenient")
        _history(session, {"young": [1.0, 1.0], "mixed": [0.0, 1.0], "own": [1.0, 1.0, 1.0]})
        # strict: k=2 and priority 0 -> 'young' (last 2 solved) is never handed out; 'own' keeps its k=5
        assert [(g["prompt_id"], g["priority"]) for g in _get(client, n=4)] == [("mixed", 1.0), ("own", 1.0)]

    def test_sql_priority_matches_filters_curriculum(self, client, session):
        rng = random.Random(7)
        configs = [
            CurriculumConfig(),
            CurriculumConfig(k=1),
            CurriculumConfig(k=4, solved=0.75, failed=0.25, low_priority=0.3),
        ]
        cases = {
            f"p{i}": [rng.choice((0.0, 0.25, 0.5, 0.75, 1.0)) for _ in range(rng.randint(0, 16))]
            for i in range(60)
        }
        _prompts(client, list(cases))
        _history(session, cases)
        for cfg in configs:
            expr, params = repo.priority_sql([], cfg)
            got = dict(session.execute(text(f"SELECT p.id, {expr} FROM prompts p"), params).all())
            assert got == {pid: pytest.approx(priority_for(o, cfg)) for pid, o in cases.items()}


def test_refill_after_drops_with_two_producers(live_server):
    """Six all-solved groups are dropped (zero variance) by the real worker: six refills. Two producers
    claim concurrently over HTTP until nothing is left: every refill once, no prompt twice."""
    from reward_models.scoring import Scorer
    from service.worker.pipeline import drain

    url = live_server.url
    for i in range(6):
        assert (
            httpx.post(f"{url}/v1/groups", json=make_group(f"g{i}", prompt_id=f"rp-{i}")).status_code == 201
        )
    factory = make_sessionmaker(get_engine(live_server.db_url))
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(factory, scorer).dropped == 6
    with factory() as s:
        refills = set(s.scalars(select(SamplingRequest.pk).where(SamplingRequest.reason == "refill")))
    assert len(refills) == 6
    httpx.post(
        f"{url}/v1/prompts", json={"prompts": [{"id": f"fresh-{j}", "dataset": "toy", "reference": {"answer": "1"}} for j in range(4)]}
    )
    barrier = threading.Barrier(2)
    taken: dict[str, list[dict]] = {"A": [], "B": []}

    def producer(name: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            barrier.wait()
            while got := http.get("/v1/sampling/requests", params={"n": 3, "producer_id": name}).json()[
                "requests"
            ]:
                taken[name] += got

    threads = [threading.Thread(target=producer, args=(n,)) for n in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = taken["A"] + taken["B"]
    assert taken["A"] and taken["B"]
    assert {i["request_id"] for i in items if i["reason"] == "refill"} == refills
    assert (
        len({i["request_id"] for i in items}) == len(items) == 10
    )  # one item per prompt: 6 refills + 4 more
    assert sorted(i["prompt_id"] for i in items) == sorted(
        [f"rp-{i}" for i in range(6)] + [f"fresh-{j}" for j in range(4)]
    )
    done = httpx.post(
        f"{url}/v1/sampling/requests/done", json={"request_ids": [i["request_id"] for i in items]}
    )
    assert len(done.json()["done"]) == 10
    again = httpx.get(f"{url}/v1/sampling/requests", params={"n": 20, "producer_id": "A"}).json()["requests"]
    assert len(again) == 10 and all(i["reason"] in ("new", "curriculum") for i in again)

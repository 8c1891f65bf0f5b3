"""Segmented trajectories end to end on real PostgreSQL: POST /v1/groups with `segments` (and its 422s,
nothing stored), the real score + curate pipeline with each `segment_advantage`, GET /v1/groups/{id}
showing the segments, leases (JSON and Arrow) that deliver a trajectory's segments together and count
them in `max_tokens` and carry the policy's `segment_advantage` the trainer weighs them by, and the rollouts
export."""

from __future__ import annotations

import math

import orjson
import pytest

from reward_models.scoring import Scorer
from service.client import decode_arrow
from service.delivery.schemas import ARROW_MEDIA_TYPE, BatchOut
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory


def _segment(seed: int, prompt_len: int = 3, response_len: int = 4) -> dict:
    t = make_trajectory(seed=seed, prompt_len=prompt_len, response_len=response_len)
    return {k: t[k] for k in ("token_ids", "loss_mask", "logprobs")}


def _segmented(answer: str, k: int, seed: int = 0) -> dict:
    t = make_trajectory(answer=answer, seed=seed)
    for key in ("token_ids", "loss_mask", "logprobs"):
        del t[key]
    t["segments"] = [_segment(seed * 100 + j) for j in range(k)]
    t["segments"][0]["messages"] = [{"role": "assistant", "content": "summary so far"}]
    return t


def _group(gid: str, policy: str | None = None) -> dict:
    g = make_group(gid, prompt_id=f"p-{gid}", answers=["42", "41", "42", "0"])
    g["trajectories"][0] = _segmented("42", 3, 1)
    g["trajectories"][1] = _segmented("41", 1, 2)
    if policy:
        g["prompt"]["curation_policy"] = policy
    return g


BAD = [
    (lambda t: t["segments"][1].update(loss_mask=[1]), "trajectories[2].segments[1].loss_mask"),
    (lambda t: t["segments"][0].update(logprobs=[0.0]), "trajectories[2].segments[0].logprobs"),
    (lambda t: t["segments"][1].pop("logprobs"), "trajectories[2].segments[1].logprobs"),
    (lambda t: t.update(segments=[]), "trajectories[2].segments"),
    (lambda t: t.update(token_ids=[1, 2]), "trajectories[2].token_ids"),
    (lambda t: t["segments"][1].update(token_ids=[], loss_mask=[], logprobs=[]), "trajectories[2].segments[1].token_ids"),
    (lambda t: t["segments"][0].update(loss_mask=[2] * 7), "trajectories[2].segments[0].loss_mask"),
]


@pytest.mark.parametrize(("spoil", "field"), BAD)
def test_bad_segments_are_a_422_naming_the_field_and_store_nothing(fresh_api, spoil, field):
    g = make_group("bad", prompt_id="p-bad")
    g["trajectories"][2] = _segmented("42", 2)
    spoil(g["trajectories"][2])
    r = fresh_api.post("/v1/groups", json=g)
    assert r.status_code == 422, r.text
    assert field in r.text, r.text
    assert fresh_api.get("/v1/groups/bad").status_code == 404


def test_a_segment_over_the_sequence_limit_is_refused(fresh_api):
    g = make_group("long", prompt_id="p-long")
    t = _segmented("42", 2)
    t["segments"][1] = {"token_ids": [1] * 262_145, "loss_mask": [1] * 262_145}
    t["segments"][0].pop("logprobs")
    g["trajectories"][0] = t
    r = fresh_api.post("/v1/groups", json=g)
    assert r.status_code == 422 and "trajectories[0].segments[1].token_ids" in r.text, r.text


@pytest.mark.parametrize(("mode", "gamma"), [("broadcast", None), ("divide", None), ("discount", 0.5)])
def test_curated_segments_get_their_share_and_leases_deliver_them_together(fresh_api, mode, gamma):
    policy = {"name": f"seg-{mode}", "segment_advantage": mode, "min_group_size": 2}
    if gamma is not None:
        policy["segment_discount"] = gamma
    assert fresh_api.post("/v1/curation-policies", json=policy).status_code == 201
    g = _group("sg", policy["name"])
    r = fresh_api.post("/v1/groups", json=g)
    assert r.status_code in (200, 201), r.text
    assert fresh_api.post("/v1/groups", json=g).json()["created"] is False  # idempotent
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 1

    out = fresh_api.get("/v1/groups/sg", params={"include_tokens": True}).json()
    t0, t2 = out["trajectories"][0], out["trajectories"][2]
    assert t2["segments"] is None and t2["token_ids"] is not None
    assert t0["token_ids"] is None and len(t0["segments"]) == 3
    a = t0["advantage"]
    assert a != 0
    want = {"broadcast": [a, a, a], "divide": [a / 3] * 3, "discount": [a * 0.25, a * 0.5, a]}[mode]
    assert [s["advantage"] for s in t0["segments"]] == pytest.approx(want, rel=1e-12)
    assert [(s["segment_index"], s["is_last"]) for s in t0["segments"]] == [(0, False), (1, False), (2, True)]
    for j, s in enumerate(t0["segments"]):
        assert {k: s[k] for k in ("token_ids", "loss_mask")} == {k: g["trajectories"][0]["segments"][j][k]
                                                               for k in ("token_ids", "loss_mask")}
    assert [(m["role"], m["content"]) for m in t0["segments"][0]["messages"]] == [("assistant", "summary so far")]
    assert t0["segments"][1]["messages"] is None
    assert out["trajectories"][1]["segments"][0]["is_last"] is True

    # max_tokens counts a trajectory with all its segments; a budget one token short still gets the group
    # whole (a group alone over the budget is delivered entire), never some of a trajectory's segments
    total = sum(len(t.get("token_ids") or ()) + sum(len(s["token_ids"]) for s in t.get("segments") or ())
                for t in g["trajectories"])
    short = fresh_api.post("/v1/batches/lease", json={"trainer_id": "t", "max_tokens": total - 1})
    assert short.status_code == 200, short.text
    assert short.json()["stats"]["tokens"] == total
    assert [len(t.get("segments") or ()) for t in short.json()["groups"][0]["trajectories"]] == [3, 1, 0, 0]
    assert fresh_api.post(f"/v1/batches/{short.json()['batch_id']}/nack", json={}).status_code == 200
    r = fresh_api.post("/v1/batches/lease", json={"trainer_id": "t", "max_tokens": total,
                                                 "request_id": f"r-{mode}"})
    assert r.status_code == 200, r.text
    body = BatchOut.model_validate(r.json()).model_dump()
    assert body["stats"]["tokens"] == total and body["stats"]["trajectories"] == 4
    leased = body["groups"][0]["trajectories"][0]
    assert leased["token_ids"] is None and [s["segment_index"] for s in leased["segments"]] == [0, 1, 2]
    assert [s["advantage"] for s in leased["segments"]] == pytest.approx(want, rel=1e-6)
    assert [s["token_ids"] for s in leased["segments"]] == [s["token_ids"] for s in g["trajectories"][0]["segments"]]
    arrow = fresh_api.post("/v1/batches/lease", json={"trainer_id": "t", "max_tokens": total,
                                                     "request_id": f"r-{mode}"}, headers={"Accept": ARROW_MEDIA_TYPE})
    assert arrow.status_code == 200
    assert decode_arrow(arrow.content)["groups"] == orjson.loads(r.content)["groups"]

    jsonl = fresh_api.get("/v1/export", params={"format": "rollouts", "statuses": ["leased", "ready"]})
    assert jsonl.status_code == 200, jsonl.text
    records = [orjson.loads(line) for line in jsonl.content.splitlines()]
    segs = records[0]["segments"]
    assert [s["seq_len"] for s in segs] == [7, 7, 7] and records[2]["segments"] is None
    assert [s["advantage"] for s in segs] == pytest.approx(want, rel=1e-12)
    parquet = fresh_api.get("/v1/export", params={"format": "rollouts", "file_type": "parquet",
                                                  "statuses": ["leased", "ready"]})
    assert parquet.status_code == 200, parquet.text


def test_divide_counts_the_trained_segments_as_the_trainer_does(fresh_api):
    """One K for `divide`: a member of 3 segments whose middle one has no mask-1 target gives every segment
    A / 2, and the trainer trains its 2 segments at weight 1 each (the advantages already sum to A: divided
    once, not again by the per-rollout mean)."""
    from trainer.packing import sequences_from_batch

    policy = {"name": "seg-div2", "segment_advantage": "divide", "min_group_size": 2}
    assert fresh_api.post("/v1/curation-policies", json=policy).status_code == 201
    g = _group("dv", policy["name"])
    g["trajectories"][0]["segments"][1]["loss_mask"] = [0] * 7  # never trained
    assert fresh_api.post("/v1/groups", json=g).status_code == 201
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 1
    t0 = fresh_api.get("/v1/groups/dv").json()["trajectories"][0]
    a = t0["advantage"]
    assert a != 0 and [s["advantage"] for s in t0["segments"]] == pytest.approx([a / 2] * 3, rel=1e-12)
    r = fresh_api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 1})
    assert r.status_code == 200, r.text
    batch = {"groups": [{**grp, "trajectories": [t for t in grp["trajectories"] if t["index"] == 0]}
                        for grp in r.json()["groups"]]}
    seqs = sequences_from_batch(batch)
    assert [s.weight for s in seqs] == [1.0, 1.0]
    assert [s.advantage for s in seqs] == pytest.approx([a / 2] * 2, rel=1e-6)


GOLDEN = (math.sqrt(5) - 1) / 2  # gamma + gamma^2 = 1


@pytest.mark.parametrize("mode", ["discount", "divide", "broadcast"])
def test_the_trainer_weighs_segments_by_the_policy_the_lease_carries(fresh_api, mode):
    """Each segmented trajectory of a lease carries its curation policy's `segment_advantage`, in JSON and
    Arrow alike, and the trainer weighs its K trained segments by it: 1/K for discount even where the
    trained advantages sum to A (gamma (sqrt 5 - 1) / 2 and an untrained last segment: A g^2 + A g = A,
    which the sums-based guess takes for divide), 1 for divide."""
    from trainer.packing import sequences_from_batch

    policy = {"name": f"seg-w-{mode}", "segment_advantage": mode, "segment_discount": GOLDEN, "min_group_size": 2}
    assert fresh_api.post("/v1/curation-policies", json=policy).status_code == 201
    g = _group("w", policy["name"])
    g["trajectories"][0]["segments"][2]["loss_mask"] = [0] * 7  # an untrained tail: K = 2
    g["trajectories"][1] = _segmented("41", 3, 2)  # all three trained: K = 3
    assert fresh_api.post("/v1/groups", json=g).status_code == 201
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 1
    a = [t["advantage"] for t in fresh_api.get("/v1/groups/w").json()["trajectories"]]
    assert a[0] > 0 > a[1]

    lease = {"trainer_id": "t", "max_groups": 1, "request_id": f"w-{mode}"}
    r = fresh_api.post("/v1/batches/lease", json=lease)
    assert r.status_code == 200, r.text
    BatchOut.model_validate(r.json())
    arrow = fresh_api.post("/v1/batches/lease", json=lease, headers={"Accept": ARROW_MEDIA_TYPE})
    assert arrow.status_code == 200
    per_k = {"discount": lambda k: 1 / k, "broadcast": lambda k: 1 / k, "divide": lambda k: 1.0}[mode]
    for batch in (r.json(), decode_arrow(arrow.content)):
        trajs = batch["groups"][0]["trajectories"]
        assert [t.get("segment_advantage") for t in trajs] == [mode, mode, None, None]
        seqs = sequences_from_batch(batch)
        assert [s.weight for s in seqs] == [per_k(2)] * 2 + [per_k(3)] * 3 + [1.0, 1.0]
        tail = [s.advantage for s in seqs[:2]]
        if mode != "broadcast":
            assert math.fsum(tail) == pytest.approx(a[0], rel=1e-6)  # the trained shares sum to A
        guessed = sequences_from_batch({"groups": [{**batch["groups"][0], "trajectories": [
            {k: v for k, v in t.items() if k != "segment_advantage"} for t in trajs]}]})
        assert [s.weight for s in guessed[:2]] == [1.0 if mode != "broadcast" else 0.5] * 2  # what a guess gave

"""``drop_fraction`` counts every member left out of training, whole-group drops included: a group without
token ids (``untrainable`` at curation), a group that went stale in the queue (``stale``, after curation)
and a group a trainer refused with a token beyond its vocabulary (``untrainable``, at nack). Before, the
rollup only counted members whose own action was drop / resample, and such datasets showed 0.0 % dropped
on ``stats``, the Datasets page and the dashboard. Real ingest, worker, leases and nacks."""

from __future__ import annotations

from service.stats import service as stats
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory


def _post(api, gid: str, dataset: str, **kw) -> None:
    g = make_group(gid, prompt_id=f"p-{gid}", dataset=dataset, answers=["42", "41"], **kw)
    r = api.post("/v1/groups", json=g)
    assert r.status_code in (200, 201), r.text


def _drops(api) -> dict:
    r = api.get("/v1/stats", params={"by": "dataset"})
    assert r.status_code == 200, r.text
    return {row["key"]: row["drop_fraction"] for row in r.json()["rows"]}


def test_untrainable_and_stale_drops_count_in_the_drop_fraction(api, scorer):
    agent = make_group("agent-1", prompt_id="p-agent-1", dataset="agent", answers=["42", "41"])
    for t in agent["trajectories"]:  # an agent trace posted without token ids: kept by no trainer
        t.pop("token_ids"), t.pop("loss_mask"), t.pop("logprobs")
    assert api.post("/v1/groups", json=agent).status_code in (200, 201)
    _post(api, "old-1", "old", policy_version=0)
    _post(api, "fresh-1", "fresh", policy_version=10)
    vocab = make_group("vocab-1", prompt_id="p-vocab-1", dataset="vocab", answers=["42", "41"], policy_version=10)
    vocab["trajectories"][1] = make_trajectory(answer="41", seed=1, token_ids=[5, 6, 7, 900, 8, 9, 10, 11, 12, 13])
    assert api.post("/v1/groups", json=vocab).status_code in (200, 201)
    assert drain(api.factory, scorer).ready == 3
    assert _drops(api)["agent"] == {"untrainable": 1.0}

    assert api.post("/v1/policy", json={"version": 10, "metrics": {}}).status_code == 201
    batch = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "max_staleness": 1}).json()
    assert sorted(g["id"] for g in batch["groups"]) == ["fresh-1", "vocab-1"]  # old-1 went stale
    r = api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"drop": True, "vocab_size": 512, "reason": "oov"})
    assert r.status_code == 200, r.text

    drops = _drops(api)
    assert drops["old"] == {"stale": 1.0}
    assert drops["vocab"] == {"untrainable": 1.0}
    assert drops["fresh"] == {}  # went back to the queue: still trainable
    assert drops["agent"] == {"untrainable": 1.0}
    # the incremental rollup equals one rebuilt from the stored groups
    with api.factory.begin() as s:
        stats.rebuild(s)
    assert _drops(api) == drops


def test_the_upgrade_recomputes_a_rollup_written_before_group_drops_counted(api, scorer, fresh_db):
    """Migration 0009e rebuilds the rollup: cells written by older code (no whole-group drops) are replaced."""
    from service.store.migrate import downgrade, upgrade

    agent = make_group("agent-2", prompt_id="p-agent-2", dataset="agent", answers=["42", "41"])
    for t in agent["trajectories"]:
        t.pop("token_ids"), t.pop("loss_mask"), t.pop("logprobs")
    assert api.post("/v1/groups", json=agent).status_code in (200, 201)
    drain(api.factory, scorer)
    assert _drops(api)["agent"] == {"untrainable": 1.0}
    downgrade(fresh_db, "0008")  # empties the derived rollup, as an older version's cells would be stale
    assert "agent" not in _drops(api)
    upgrade(fresh_db)
    assert _drops(api)["agent"] == {"untrainable": 1.0}


def test_a_stored_policy_body_that_no_longer_reads_counts_as_the_defaults_both_ways():
    """A body an older release stored that this one refuses must not raise out of the rollup (a group
    curated with it could then never be retracted), and must give the same rule at every call, so a
    retraction removes exactly what the addition added."""
    from service.stats.service import _baseline_rule

    default = _baseline_rule(None)
    for body in ({"name": "old", "finish_reason_actions": {"length": "truncate_and_pray"}},
                 {"name": "old", "retired_field": 1}, {"finish_reason_actions": []}):
        assert _baseline_rule(body) == default == _baseline_rule(body)
    masked_in = _baseline_rule({"name": "in", "masked_in_baseline": True})
    assert "mask" in masked_in[1] and "mask" not in default[1]

"""A lease carries each trajectory's stored ``finish_reason`` and its reward components (``rewards``), in
JSON and Arrow alike: groups go through the real pipeline (scoring with the real scorer, curation), then a
real lease; the expected values are read back from the ``rewards`` table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from sqlalchemy import select

from reward_models.scoring import Scorer
from service.client import decode_arrow
from service.delivery.schemas import ARROW_MEDIA_TYPE, BatchOut
from service.store.models import Group, Reward
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory


def _stored(factory) -> dict[tuple[str, int], dict[str, float | None]]:
    with factory() as s:
        rows = s.execute(select(Group.id, Reward.idx, Reward.component, Reward.value, Reward.spec_version,
                                Group.reward_spec_version)
                         .join(Group, Group.pk == Reward.group_pk)).all()
    out: dict[tuple[str, int], dict[str, float | None]] = {}
    for gid, idx, component, value, version, scored_with in rows:
        if version == scored_with:
            out.setdefault((gid, idx), {})[component] = None if value is None else float(np.float32(value))
    return out


def keep_cut_members(api, dataset: str = "toy") -> None:
    """The dataset's curation keeps members cut at ``length`` (the default masks them: never delivered)."""
    r = api.post("/v1/curation-policies", json={"name": "keep-cut", "finish_reason_actions": {"length": "keep"}})
    assert r.status_code == 201, r.text
    r = api.put(f"/v1/datasets/{dataset}", json={"curation_policy": "keep-cut"})
    assert r.status_code in (200, 201), r.text


def test_a_real_lease_carries_finish_reason_and_reward_components_in_json_and_arrow(fresh_api):
    keep_cut_members(fresh_api)
    g = make_group("rw-0", prompt_id="rw-p0", answers=["42", "41", "42", "0"])
    g["trajectories"][1] = make_trajectory(answer="41", seed=1, finish_reason="length")
    assert fresh_api.post("/v1/groups", json=g).status_code in (200, 201)
    assert fresh_api.post("/v1/groups", json=make_group("rw-1", prompt_id="rw-p1",
                                                        answers=["0", "42", "42", "1"])).status_code in (200, 201)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(fresh_api.factory, scorer).ready == 2
    stored = _stored(fresh_api.factory)
    assert stored, "the pipeline stored no reward components"
    body = {"trainer_id": "t", "max_groups": 4, "request_id": "rw"}
    as_json = fresh_api.post("/v1/batches/lease", json=body).json()
    raw = fresh_api.post("/v1/batches/lease", json=body, headers={"Accept": ARROW_MEDIA_TYPE}).content
    BatchOut.model_validate(as_json)
    as_arrow = decode_arrow(raw)
    for batch in (as_json, as_arrow):
        batch["stats"].pop("replayed")
    assert as_arrow == as_json
    seen = []
    for group in as_json["groups"]:
        for t in group["trajectories"]:
            want_reason = "length" if (group["id"], t["index"]) == ("rw-0", 1) else "stop"
            assert t["finish_reason"] == want_reason
            assert t["rewards"] == stored[(group["id"], t["index"])]
            seen.append((group["id"], t["index"]))
    assert ("rw-0", 1) in seen  # the cut-off member was delivered with its reason
    table = pa.ipc.open_stream(raw).read_all()
    assert table.schema.field("rewards").type == pa.map_(pa.string(), pa.float32())
    assert table.column("finish_reason").to_pylist() == [
        t["finish_reason"] for g in as_json["groups"] for t in g["trajectories"]]


def test_a_trajectory_without_stored_components_has_null_rewards(fresh_api, fresh_db):
    """Made ready by hand (no scoring): nothing in ``rewards`` -> null in both formats, not {}."""
    from service.store.db import get_engine
    from tests.service.delivery.helpers import mark_ready

    assert fresh_api.post("/v1/groups", json=make_group("bare-0", prompt_id="bare-p")).status_code in (200, 201)
    mark_ready(get_engine(fresh_db), ["bare-0"])
    body = {"trainer_id": "t", "max_groups": 1, "request_id": "bare"}
    as_json = fresh_api.post("/v1/batches/lease", json=body).json()
    as_arrow = decode_arrow(fresh_api.post("/v1/batches/lease", json=body,
                                           headers={"Accept": ARROW_MEDIA_TYPE}).content)
    for batch in (as_json, as_arrow):
        assert [t["rewards"] for t in batch["groups"][0]["trajectories"]] == [None] * 4
        assert [t["finish_reason"] for t in batch["groups"][0]["trajectories"]] == ["stop"] * 4

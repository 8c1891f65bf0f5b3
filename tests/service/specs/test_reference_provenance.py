"""References carry their provenance, and the rule "only an admin-loaded reference runs as code" holds where
the code would run: the worker's scoring stage and POST /v1/rescore, not only at ingest.

Attack (round 2, /tmp/attack-svc/a_rescore.py): a producer's inline prompt stored under a spec without
verifier.code kept ``reference.tests``; an admin's ``POST /v1/rescore`` with a code spec then ran the
producer's tests, and they decided the reward. Now each prompt records ``reference_from_admin``: the
rescore is refused (403 naming the rule, nothing requeued) and a group that reaches the scoring stage under
a code spec anyway (its dataset switched to one) ends in ``reward_error`` naming the rule, never a 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from service.auth.keys import provision
from service.scoring import stage
from service.store.models import Group, Prompt, Trajectory
from service.worker.pipeline import PipelineConfig, score_pass
from tests.conftest import committing_client
from tests.helpers import bearer, make_group

CODE_SPEC = {"name": "code", "components": [{"name": "tests", "kind": "verifier.code", "outcome": True}]}
PLAIN_SPEC = {"name": "plain", "components": [{"name": "em", "kind": "verifier.exact_match", "outcome": True}]}
# tests that pass whatever the program does: if they ran, a wrong answer would be rewarded
RIDES_ALONG = {"answer": "42", "tests": "assert f(1) == f(1)", "entry_point": "f"}


@pytest.fixture
def svc(fresh_db: str) -> Iterator:
    tokens = provision(fresh_db, {"admin": "admin", "producer": "producer"})
    with committing_client(fresh_db) as c:
        c.admin, c.producer = bearer(tokens["admin"]), bearer(tokens["producer"])
        for spec in (CODE_SPEC, PLAIN_SPEC):
            assert c.post("/v1/reward-specs", json=spec, headers=c.admin).status_code == 201
        assert c.put("/v1/datasets/ds", json={"reward_spec": "plain"}, headers=c.admin).status_code == 200
        yield c


def _prompt(c, prompt_id: str) -> Prompt:
    with c.factory() as s:
        return s.get(Prompt, prompt_id)


def _group(c, group_id: str) -> tuple[Group, list[Trajectory]]:
    with c.factory() as s:
        g = s.execute(select(Group).where(Group.id == group_id)).scalar_one()
        return g, list(s.execute(select(Trajectory).where(Trajectory.group_pk == g.pk)).scalars())


def test_each_prompt_records_whether_an_admin_key_wrote_its_reference(svc) -> None:
    c = svc
    assert c.post("/v1/groups", json=make_group("g-prod", prompt_id="p-prod", dataset="ds", reference=RIDES_ALONG),
                  headers=c.producer).status_code == 201
    assert c.post("/v1/groups", json=make_group("g-adm", prompt_id="p-adm", dataset="ds", reference=RIDES_ALONG),
                  headers=c.admin).status_code == 201
    assert _prompt(c, "p-prod").reference_from_admin is False
    assert _prompt(c, "p-adm").reference_from_admin is True
    # an admin re-loading the producer's prompt (after review) vouches for it
    body = {"prompts": [{"id": "p-prod", "dataset": "ds", "messages": [{"role": "user", "content": "What is 6 * 7?"}],
                         "reference": RIDES_ALONG}]}
    assert c.post("/v1/prompts", json=body, headers=c.admin).status_code == 200
    assert _prompt(c, "p-prod").reference_from_admin is True


def test_a_rescore_with_a_code_spec_refuses_a_producers_reference_and_requeues_nothing(svc) -> None:
    c = svc
    assert c.post("/v1/groups", json=make_group("g-1", prompt_id="p-1", dataset="ds", reference=RIDES_ALONG),
                  headers=c.producer).status_code == 201
    r = c.post("/v1/rescore", json={"reward_spec": "code", "dataset": "ds"}, headers=c.admin)
    assert r.status_code == 403, r.text
    assert "only a reference an admin key loaded runs as code" in r.json()["error"]
    assert r.json()["detail"]["prompt_ids"] == ["p-1"] and r.json()["detail"]["groups"] == 1
    g, _ = _group(c, "g-1")
    assert g.reward_spec_name is None  # not requeued under the code spec
    # a spec without verifier.code may still rescore it; once an admin vouches, the code spec may too
    assert c.post("/v1/rescore", json={"reward_spec": "plain", "dataset": "ds"}, headers=c.admin).status_code == 200
    body = {"prompts": [{"id": "p-1", "dataset": "ds", "messages": [{"role": "user", "content": "What is 6 * 7?"}],
                         "reference": RIDES_ALONG}]}
    assert c.post("/v1/prompts", json=body, headers=c.admin).status_code == 200
    assert c.post("/v1/rescore", json={"reward_spec": "code", "dataset": "ds"}, headers=c.admin).status_code == 200


def test_the_scoring_stage_refuses_to_run_a_producers_reference_under_a_code_spec(svc, scorer) -> None:
    c = svc
    assert c.post("/v1/groups", json=make_group("g-2", prompt_id="p-2", dataset="ds", reference=RIDES_ALONG),
                  headers=c.producer).status_code == 201
    # the dataset is switched to the code spec after the reference was accepted under the plain one
    assert c.put("/v1/datasets/ds", json={"reward_spec": "code"}, headers=c.admin).status_code == 200
    score_pass(c.factory, scorer, PipelineConfig())
    g, trajectories = _group(c, "g-2")
    assert g.status == "reward_error", (g.status, g.score_error)
    assert "only a reference an admin key loaded runs as code" in g.score_error
    assert "p-2" in g.score_error and "reference.tests" in g.score_error
    assert all(t.total_reward is None and t.outcome is None for t in trajectories)  # never a 0


def test_the_scoring_stage_runs_an_admin_loaded_reference_and_an_opted_in_spec(svc) -> None:
    c = svc
    assert c.put("/v1/datasets/ds", json={"reward_spec": "code"}, headers=c.admin).status_code == 200
    assert c.post("/v1/groups", json=make_group("g-3", prompt_id="p-3", dataset="ds", reference=RIDES_ALONG),
                  headers=c.admin).status_code == 201
    with c.factory() as s:
        pks = list(s.execute(select(Group.pk).order_by(Group.pk)).scalars())
        job = stage.prepare(s, "t", pks)
        assert not job.spec_error and len(job.spec_of) == 1
    with c.factory.begin() as s:  # a producer-written reference under an opted-in spec
        s.execute(Prompt.__table__.update().values(reference_from_admin=False))
    with c.factory() as s:
        assert stage.prepare(s, "t", pks).spec_error  # refused by default
        job = stage.prepare(s, "t", pks, caller_specs=frozenset({"code"}))
        assert not job.spec_error and len(job.spec_of) == 1

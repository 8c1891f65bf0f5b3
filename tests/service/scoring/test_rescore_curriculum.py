"""A rescore / recurate takes back out of its prompt's curriculum exactly what the group's curation put in: a
group dropped below_min_group_size stores an outcome_mean but added nothing to its prompt's recent outcomes,
so sending it back removes nothing (never another group's equal outcome). Real HTTP, real PostgreSQL, the
real worker."""

from __future__ import annotations

from sqlalchemy import text

from service.worker.pipeline import drain
from tests.helpers import make_group, register_spec

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _prompt(api) -> tuple:
    with api.factory() as s:
        return tuple(s.execute(text("SELECT n_groups, recent_outcomes, pass_rate FROM prompts WHERE id = 'p'")).one())


def _post(api, scorer, gid: str, answers: list[str], cut: int = 0) -> dict:
    g = make_group(gid, prompt_id="p", dataset="cu", answers=answers, inline_prompt=gid == "A")
    for t in g["trajectories"][len(answers) - cut:]:
        t["finish_reason"] = "length"
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    return api.get(f"/v1/groups/{gid}").json()


def test_sending_back_a_group_that_added_no_outcome_takes_none_away(api, scorer):
    register_spec(api, SPEC)
    assert api.put("/v1/datasets/cu", json={"reward_spec": "math"}).status_code == 200
    _post(api, scorer, "A", ["42", "41", "42", "41"])  # outcome 0.5
    small = _post(api, scorer, "small", ["41", "7", "7", "7"], cut=3)  # one completer: outcome 0.0, too few
    assert (small["status"], small["drop_reason"]) == ("dropped", "below_min_group_size")
    _post(api, scorer, "Z", ["41", "41", "41", "41"])  # outcome 0.0, recorded
    assert _prompt(api) == (2, [0.5, 0.0], 0.25)
    r = api.post("/v1/rescore", json={"reward_spec": "math", "group_ids": ["small"]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    drain(api.factory, scorer, timeout_s=60)
    assert _prompt(api) == (2, [0.5, 0.0], 0.25)
    r = api.post("/v1/recurate", json={"curation_policy": "default", "group_ids": ["small"]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text
    drain(api.factory, scorer, timeout_s=60)
    assert _prompt(api) == (2, [0.5, 0.0], 0.25)
    # a group that did add its outcome is taken out and put back: counted once
    assert api.post("/v1/recurate", json={"curation_policy": "default", "group_ids": ["Z"]}).json()["groups"] == 1
    drain(api.factory, scorer, timeout_s=60)
    assert _prompt(api) == (2, [0.5, 0.0], 0.25)

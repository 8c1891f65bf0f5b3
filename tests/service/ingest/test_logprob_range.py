"""The one rule for behaviour log-probs, on every way in (a posted trajectory, its segments, a slot fill): a
log-probability is <= 0 up to a sampler's rounding and not absurdly negative; anything else is a 422 naming
the field, and nothing is stored (-3.4e38 used to be stored and made the trainer's metrics infinite)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service.ingest.schemas import LOGPROB_FLOOR, LOGPROB_SLACK
from service.store.models import Group
from tests.helpers import make_group

REFUSED = [-3.4e38, -1e30, LOGPROB_FLOOR * 1.0001, 3e38, 1.0, LOGPROB_SLACK * 1.01]
TAKEN = [0.0, LOGPROB_SLACK, -9999.0, LOGPROB_FLOOR]


def _with_logprob(value: float, *, segments: bool = False) -> dict:
    g = make_group("lp", prompt_id="p-lp")
    t = g["trajectories"][1]
    t["logprobs"][5] = value  # a generated token (mask 1)
    if segments:
        t["segments"] = [{k: t.pop(k) for k in ("token_ids", "loss_mask", "logprobs")}]
    return g


@pytest.mark.parametrize("value", REFUSED)
@pytest.mark.parametrize("segments", [False, True])
def test_a_value_that_is_no_log_probability_is_a_422_naming_it(client, session, value, segments):
    r = client.post("/v1/groups", json=_with_logprob(value, segments=segments))
    field = "trajectories[1].segments[0].logprobs[5]" if segments else "trajectories[1].logprobs[5]"
    assert r.status_code == 422 and field in r.json()["error"], r.text
    assert "not a log-probability" in r.json()["error"]
    assert session.scalar(select(func.count()).select_from(Group)) == 0


@pytest.mark.parametrize("value", TAKEN)
def test_extreme_but_legal_log_probabilities_are_stored(client, value):
    r = client.post("/v1/groups", json=_with_logprob(value))
    assert r.status_code == 201, r.text
    stored = client.get("/v1/groups/lp", params={"include_tokens": True}).json()["trajectories"][1]["logprobs"][5]
    assert stored == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize("value", [-3.4e38, 3e38])
def test_a_slot_fill_is_held_to_the_same_rule(client, value):
    t = _with_logprob(value)["trajectories"][1]
    r = client.post("/v1/groups/any/trajectories/1", json={"policy_version": 1, "trajectory": t})
    assert r.status_code == 422 and "trajectory.logprobs[5]" in r.json()["error"], r.text

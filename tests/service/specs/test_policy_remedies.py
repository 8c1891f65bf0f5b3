"""Policy creation for the remedies: `resume` only for a budget's cut (length, max_turns), a 422 naming
`finish_reason_actions` elsewhere with nothing stored; the wait and the resume bound are bounded fields."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from filters.types import FINISH_REASONS, RESUME_REASONS
from service.store.models import CurationPolicyRow


@pytest.mark.parametrize("reason", sorted(set(FINISH_REASONS) - RESUME_REASONS))
def test_resume_outside_a_budget_cut_is_a_422(client, session, reason):
    r = client.post("/v1/curation-policies", json={"name": "res", "finish_reason_actions": {reason: "resume"}})
    assert r.status_code == 422, r.text
    assert "finish_reason_actions" in r.json()["error"]
    count = select(func.count()).select_from(CurationPolicyRow).where(CurationPolicyRow.name == "res")
    assert session.scalar(count) == 0


@pytest.mark.parametrize("reason", sorted(RESUME_REASONS))
def test_resume_for_a_budget_cut_is_stored(client, reason):
    body = {"name": "res", "finish_reason_actions": {reason: "resume"}, "max_resumes": 3, "resample_wait_seconds": 60}
    assert client.post("/v1/curation-policies", json=body).status_code == 201
    stored = client.get("/v1/curation-policies/res").json()["body"]
    assert stored["finish_reason_actions"][reason] == "resume"
    assert (stored["max_resumes"], stored["resample_wait_seconds"]) == (3, 60)


@pytest.mark.parametrize(("field", "value"), [
    ("resample_wait_seconds", -1), ("resample_wait_seconds", 7 * 86_400 + 1), ("resample_wait_seconds", "5"),
    ("max_resumes", -1), ("max_resumes", 17), ("max_resumes", 1.5),
])
def test_bad_remedy_bounds_name_the_field(client, field, value):
    r = client.post("/v1/curation-policies", json={"name": "bnd", field: value})
    assert r.status_code == 422 and field in r.json()["error"], r.text

"""POST /v1/rescore and /v1/recurate: which groups they select, and the limits of a request."""

from __future__ import annotations

from tests.helpers import assert_client_error, make_group

# ---------------------------------------------------------------------------------------------------
# 3. A request the database can never run was reported as "database unavailable, retry" (503 +
#    Retry-After): rescore took 100_000 ids as one bind parameter each; PostgreSQL takes 65_535.
#    Now: the ids travel as one array parameter, at most MAX_RESCORE_IDS of them (422 beyond), and
#    only a connection failure is a 503.
# ---------------------------------------------------------------------------------------------------
# Attack: 100k rescore ids (one bind parameter each) were answered 503 'retry' although PostgreSQL can never run it.


def test_too_many_rescore_ids_is_a_422_naming_the_field(lenient_api):
    from service.api.schemas import MAX_RESCORE_IDS

    assert lenient_api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    r = lenient_api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": [f"g{i}" for i in range(70_000)]})
    assert_client_error(r, "group_ids", statuses=(422,))
    assert "retry-after" not in r.headers
    r = lenient_api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": [f"g{i}" for i in range(MAX_RESCORE_IDS + 1)]})
    assert_client_error(r, "group_ids", statuses=(422,))


# Attack: the id-list fix had to keep selecting exactly the listed groups at the limit.
def test_rescore_at_the_id_limit_selects_exactly_the_listed_groups(lenient_api):
    from service.api.schemas import MAX_RESCORE_IDS

    assert lenient_api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    for gid in ("keep-a", "keep-b"):
        assert lenient_api.post("/v1/groups", json=make_group(gid, prompt_id=f"p-{gid}")).status_code == 201
    ids = ["keep-a", *(f"absent-{i}" for i in range(MAX_RESCORE_IDS - 1))]
    r = lenient_api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": ids})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["groups"] == 1, r.json()


# A rescore is a new start: a group whose worker died under it (score_deaths, the solo-death cap of the
# worker's crash recovery) gets its whole allowance back, as it gets its attempts back.
def test_rescore_resets_the_worker_death_count_with_the_attempts(lenient_api):
    from sqlalchemy import text

    assert lenient_api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    assert lenient_api.post("/v1/groups", json=make_group("died", prompt_id="p-died")).status_code == 201
    with lenient_api.factory.begin() as s:
        s.execute(text("UPDATE groups SET status = 'reward_error', score_attempts = 3, score_deaths = 2"
                       " WHERE id = 'died'"))
    r = lenient_api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": ["died"]})
    assert r.status_code == 200 and r.json()["groups"] == 1, r.text[:300]
    with lenient_api.factory() as s:
        row = s.execute(text("SELECT status, score_attempts, score_deaths FROM groups WHERE id = 'died'")).one()
    assert tuple(row) == ("received", 0, 0)

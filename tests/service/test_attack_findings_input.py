"""Attack findings against the hostile-input work (issue 16 item 1; issue 15 items 2-3).

Each test FAILS on the code it was written against and passes once the problem is fixed. Real app,
real PostgreSQL, real scorer processes; nothing mocked. See /work/notes/attack-i16a.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Group, Prompt, Trajectory
from tests.helpers import make_group

JSON = {"content-type": "application/json"}


def stored(session: Session) -> tuple[int, ...]:
    return tuple(session.scalar(select(func.count()).select_from(m)) for m in (Prompt, Group, Trajectory))  # type: ignore[misc]


def assert_client_error(r: Any, field: str, statuses: tuple[int, ...] = (400, 422)) -> None:
    """A 4xx in the service's error format that names ``field`` (no 5xx, no traceback)."""
    assert r.status_code in statuses, (r.status_code, r.text[:500])
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    assert field in body["error"], body


@pytest.fixture
def client(session: Session, db_url: str) -> Iterator:
    """As conftest's, but a 500 comes back as a response (so the test reports the status it got)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.deps import get_session

    app = create_app(database_url=db_url)

    def joined_session() -> Iterator[Session]:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

    app.dependency_overrides[get_session] = joined_session
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def api(fresh_db: str) -> Iterator:
    """TestClient over a fresh database whose requests really commit (scorer / real DB errors)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.db import get_engine, make_sessionmaker

    app = create_app(database_url=fresh_db)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.factory = make_sessionmaker(get_engine(fresh_db))
        yield c
    app.state.engine.dispose()


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# ---------------------------------------------------------------------------------------------------
# 1. Deep nesting that the wire guard lets through (orjson accepts up to 1024 levels) crashes later
#    code (pydantic's serializer at ~255 levels, SQLAlchemy's JSON encoder) -> 500.
# ---------------------------------------------------------------------------------------------------


class TestDeepNesting:
    def test_deep_group_metadata_is_a_4xx_not_500(self, client, session):
        head = make_group("deep-1")
        raw = '{"id": "deep-1", "prompt_id": "p-1", "policy_version": 0, "prompt": %s, "trajectories": %s,' \
              ' "metadata": {"d": %s}}'
        import json

        body = raw % (json.dumps(head["prompt"]), json.dumps(head["trajectories"]), _nested(300))
        r = client.post("/v1/groups", content=body, headers=JSON)
        assert_client_error(r, "metadata")
        assert stored(session) == (0, 0, 0)

    def test_deep_prompt_reference_is_a_4xx_not_500(self, client, session):
        body = '{"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": "1", "d": %s}}]}' % _nested(600)
        r = client.post("/v1/prompts", content=body, headers=JSON)
        assert_client_error(r, "prompts[0].reference")
        assert stored(session) == (0, 0, 0)

    def test_deep_policy_metrics_is_a_4xx_not_500(self, client):
        body = '{"version": 1, "metrics": {"d": %s}}' % _nested(600)
        r = client.post("/v1/policy", content=body, headers=JSON)
        assert_client_error(r, "metrics")


# ---------------------------------------------------------------------------------------------------
# 2. Query parameters the guard does not bound: ``cursor`` (str.isdigit() accepts '²'; 20 digits
#    overflow bigint) and ``since`` (a datetime near year 1 / 9999 with an offset overflows) -> 500.
# ---------------------------------------------------------------------------------------------------


class TestQueryParams:
    @pytest.mark.parametrize("cursor", ["%C2%B2", "99999999999999999999", "%D9%A1" * 25])
    def test_bad_cursor_is_a_422(self, client, cursor):
        r = client.get(f"/v1/groups?cursor={cursor}")
        assert_client_error(r, "cursor", statuses=(422,))

    @pytest.mark.parametrize("since", ["0001-01-01T00:00:00%2B01:00", "9999-12-31T23:59:59-01:00"])
    def test_since_at_the_edge_of_datetime_is_a_422(self, client, since):
        r = client.get(f"/v1/stats?since={since}")
        assert_client_error(r, "since", statuses=(422,))


# ---------------------------------------------------------------------------------------------------
# 3. A request the database can never run is reported as "database unavailable, retry" (503 +
#    Retry-After): rescore accepts 100_000 group ids, PostgreSQL takes at most 65_535 parameters.
# ---------------------------------------------------------------------------------------------------


def test_too_many_rescore_ids_is_a_4xx_not_a_retryable_503(api):
    assert api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    r = api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": [f"g{i}" for i in range(70_000)]})
    assert r.status_code < 500 and "retry-after" not in r.headers, (r.status_code, r.text[:300])


# ---------------------------------------------------------------------------------------------------
# 4. Names: a reward spec may be named 'n@1' or 'a@b' (the name pattern allows '@'), but every
#    reference parses '@' as a version: GET /v1/reward-specs/n@1 answers spec 'n' version 1, and
#    'a@b' can never be read or attached. Either reject '@' in names, or make the name round-trip.
# ---------------------------------------------------------------------------------------------------


class TestSpecNamesRoundTrip:
    @pytest.mark.parametrize("name", ["n@1", "a@b"])
    def test_a_stored_name_reads_back_as_itself(self, client, name):
        client.post("/v1/reward-specs", json={"name": "n", "components": [{"name": "c", "kind": "verifier.exact_match"}]})
        r = client.post("/v1/reward-specs", json={"name": name, "components": [{"name": "c", "kind": "verifier.math"}]})
        if r.status_code in (400, 422):  # fixed by refusing '@' in names: the field is named
            assert_client_error(r, "name")
            return
        assert r.status_code == 201, r.text
        got = client.get(f"/v1/reward-specs/{name.replace('@', '%40')}")
        assert got.status_code == 200, got.text
        assert got.json()["name"] == name and got.json()["body"]["components"][0]["kind"] == "verifier.math", got.json()


# ---------------------------------------------------------------------------------------------------
# 5. The reference-field check only tests ``is None``: an empty answer ([] or "") passes ingest and
#    the group ends as reward_error ("could not parse the reference answer") after its attempts.
# ---------------------------------------------------------------------------------------------------


class TestReferenceFieldBypass:
    @pytest.mark.parametrize("answer", [[], ""], ids=["empty-list", "empty-string"])
    def test_empty_answer_is_refused_at_group_ingest(self, client, session, answer):
        r = client.post("/v1/groups", json=make_group("ref-1", reference={"answer": answer}))
        assert_client_error(r, "prompt.reference.answer", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize("answer", [[], ""], ids=["empty-list", "empty-string"])
    def test_empty_answer_is_refused_at_prompt_ingest(self, client, session, answer):
        body = {"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": answer}}]}
        assert_client_error(client.post("/v1/prompts", json=body), "prompts[0].reference.answer", statuses=(422,))
        assert stored(session) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------------
# 6. Strict types: a JSON boolean is coerced into the int literal of ``loss_mask`` (no bool->int was
#    the promise; "1" is refused but true is taken).
# ---------------------------------------------------------------------------------------------------


def test_loss_mask_booleans_are_not_coerced(client, session):
    g = make_group("lm-1")
    g["trajectories"][0]["loss_mask"] = [True] * len(g["trajectories"][0]["token_ids"])
    assert_client_error(client.post("/v1/groups", json=g), "trajectories[0].loss_mask", statuses=(422,))
    assert stored(session) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------------
# 7. "Finite" is not enough for weights: two components of weight 1e308 make math.fsum overflow in the
#    score pass, which raises and rolls back the WHOLE batch (innocent groups stay 'received' forever);
#    one weight of 1e308 makes the group 'ready' with null (NaN) advantages handed to the trainer.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scorer():
    from reward_models.scoring import Scorer

    with Scorer(processes=1, timeout_s=20) as s:
        yield s


def _post_spec(api, name: str, weights: list[float]) -> bool:
    comps = [{"name": f"c{i}", "kind": "verifier.math", "weight": w, "outcome": i == 0} for i, w in enumerate(weights)]
    r = api.post("/v1/reward-specs", json={"name": name, "components": comps})
    if r.status_code in (400, 422):  # fixed at the API: weights bounded, the field named
        assert_client_error(r, "weight")
        return False
    assert r.status_code == 201, r.text
    assert api.put(f"/v1/datasets/{name}", json={"reward_spec": name}).status_code == 200
    return True


class TestHugeWeights:
    def test_overflowing_weights_do_not_stall_other_groups(self, api, scorer):
        from service.workers.pipeline import run_once

        if not _post_spec(api, "huge2", [1e308, 1e308]):
            return
        answers = ["42", "41", "42", "7"]
        assert api.post("/v1/groups", json=make_group("innocent", prompt_id="pi", answers=answers)).status_code == 201
        assert api.post("/v1/groups", json=make_group("poison", prompt_id="pp", dataset="huge2", answers=answers)).status_code == 201
        try:
            run_once(api.factory, scorer)
        except OverflowError as exc:
            pytest.fail(f"the score pass raised {exc!r}: the whole batch rolled back")
        assert api.get("/v1/groups/innocent").json()["status"] != "received"

    def test_a_huge_weight_never_delivers_nan_advantages(self, api, scorer):
        from service.workers.pipeline import drain

        if not _post_spec(api, "huge1", [1e308]):
            return
        api.post("/v1/groups", json=make_group("big", prompt_id="pb", dataset="huge1", answers=["42", "41", "42", "7"]))
        drain(api.factory, scorer, timeout_s=60)
        g = api.get("/v1/groups/big").json()
        if g["status"] == "ready":
            for t in g["trajectories"]:
                assert t["advantage"] is not None and math.isfinite(t["advantage"]), g["trajectories"]


# ---------------------------------------------------------------------------------------------------
# 8. Same for the curation policy: resample_budget_multiplier has no upper bound, 1e308 is "finite",
#    and math.ceil(max_tokens * 1e308) raises OverflowError in the pipeline pass: the poison group and
#    an innocent group in the same pass both stay 'received'.
# ---------------------------------------------------------------------------------------------------


def test_huge_resample_multiplier_does_not_stall_the_pipeline(api, scorer):
    from service.workers.pipeline import run_once

    r = api.post("/v1/curation-policies", json={
        "name": "rb", "finish_reason_actions": {"length": "resample"}, "resample_budget_multiplier": 1e308,
    })
    if r.status_code in (400, 422):  # fixed at the API: the multiplier bounded, the field named
        assert_client_error(r, "resample_budget_multiplier")
        return
    assert r.status_code == 201, r.text
    assert api.put("/v1/datasets/rb", json={"curation_policy": "rb"}).status_code == 200
    poison = make_group("rb-1", prompt_id="rb-p", dataset="rb", answers=["42", "41", "42", "7"])
    poison["trajectories"][1]["finish_reason"] = "length"
    assert api.post("/v1/groups", json=poison).status_code == 201
    assert api.post("/v1/groups", json=make_group("inn", prompt_id="inn-p", answers=["42", "41", "42", "7"])).status_code == 201
    try:
        run_once(api.factory, scorer)
        run_once(api.factory, scorer)
    except OverflowError as exc:
        pytest.fail(f"the pipeline pass raised {exc!r}")
    assert api.get("/v1/groups/inn").json()["status"] not in ("received", "scored")

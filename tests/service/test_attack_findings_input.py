"""Attack findings against the hostile-input work (issue 16 item 1; issue 15 items 2-3).

Each finding's tests failed on the code they were written against (commit 5f8290f) and are kept as
regression tests, with the edges of each fix swept (the largest value accepted, the first refused).
Real app, real PostgreSQL, real scorer processes; nothing mocked. See docs/errors.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, Trajectory
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

    from service.api.deps import get_session
    from service.app import create_app

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
    from service.store.db import get_engine, make_sessionmaker

    app = create_app(database_url=fresh_db)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.factory = make_sessionmaker(get_engine(fresh_db))
        yield c
    app.state.engine.dispose()


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# ---------------------------------------------------------------------------------------------------
# 1. Deep nesting that the JSON parsers accept (~1000 levels) crashed later code (pydantic's serializer
#    at ~255 levels, the JSONB encoder) -> 500. Now: more than MAX_DEPTH levels is a 422 naming the field.
# ---------------------------------------------------------------------------------------------------


class TestDeepNesting:
    def test_deep_group_metadata_is_a_4xx_not_500(self, client, session):
        head = make_group("deep-1")
        raw = '{"id": "deep-1", "prompt_id": "p-1", "policy_version": 0, "prompt": %s, "trajectories": %s,' \
              ' "metadata": {"d": %s}}'
        body = raw % (json.dumps(head["prompt"]), json.dumps(head["trajectories"]), _nested(300))
        r = client.post("/v1/groups", content=body, headers=JSON)
        assert_client_error(r, "metadata.d[0]", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    def test_deep_prompt_reference_is_a_4xx_not_500(self, client, session):
        body = '{"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": "1", "d": ' + _nested(600) + "}}]}"
        r = client.post("/v1/prompts", content=body, headers=JSON)
        assert_client_error(r, "prompts[0].reference.d", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    def test_deep_policy_metrics_is_a_4xx_not_500(self, client):
        body = '{"version": 1, "metrics": {"d": ' + _nested(600) + "}}"
        assert_client_error(client.post("/v1/policy", content=body, headers=JSON), "metrics.d", statuses=(422,))

    @pytest.mark.parametrize("duplicate", [False, True], ids=["fast-path", "exact-path"])
    def test_the_depth_limit_edge(self, client, session, duplicate):
        """The document root is level 1: metadata (2) + {"d": (3) ... holds MAX_DEPTH - 3 more arrays."""
        from service.api.wire_checks import MAX_DEPTH

        def post(extra: int):
            g = make_group("edge-1")
            g["metadata"] = {"d": json.loads(_nested(extra))}
            text = json.dumps(g)
            if duplicate:  # a repeated key sends the body down the stdlib parser's path
                text = text.replace('"metadata": {', '"metadata": {"k": 1, "k": 2, ', 1)
            return client.post("/v1/groups", content=text, headers=JSON)

        deepest = post(MAX_DEPTH - 2)  # the innermost array is at level MAX_DEPTH
        if duplicate:
            assert deepest.status_code == 400 and "metadata.k" in deepest.json()["error"], deepest.text
        else:
            assert deepest.status_code == 201, deepest.text
        r = post(MAX_DEPTH - 1)
        assert_client_error(r, "metadata.d" + "[0]" * (MAX_DEPTH - 2) + ":", statuses=(422,))
        assert f"more than {MAX_DEPTH} levels" in r.json()["error"]

    def test_beyond_the_parsers_is_a_400(self, client):
        r = client.post("/v1/policy", content='{"version": 1, "metrics": ' + _nested(5000) + "}", headers=JSON)
        assert_client_error(r, "body", statuses=(400,))


# ---------------------------------------------------------------------------------------------------
# 2. Query parameters: ``cursor`` (str.isdigit() accepted '²'; 20 digits overflowed bigint) and
#    ``since`` (a datetime near year 1 / 9999 with an offset overflowed in astimezone) -> 500.
# ---------------------------------------------------------------------------------------------------


class TestQueryParams:
    @pytest.mark.parametrize(
        "cursor", ["%C2%B2", "99999999999999999999", "%D9%A1" * 25, "9223372036854775808", "-1", "+1", " 1", "1.0"]
    )
    def test_bad_cursor_is_a_422(self, client, cursor):
        r = client.get(f"/v1/groups?cursor={cursor}")
        assert_client_error(r, "query.cursor", statuses=(422,))

    @pytest.mark.parametrize("cursor", ["0", "9223372036854775807", "0000000000000000001"])
    def test_cursors_in_range_are_answered(self, client, cursor):
        r = client.get(f"/v1/groups?cursor={cursor}")
        assert r.status_code == 200, r.text

    @pytest.mark.parametrize("since", ["0001-01-01T00:00:00%2B01:00", "9999-12-31T23:59:59-01:00"])
    def test_since_at_the_edge_of_datetime_is_a_422(self, client, since):
        r = client.get(f"/v1/stats?since={since}")
        assert_client_error(r, "query.since", statuses=(422,))

    @pytest.mark.parametrize("since", ["0001-01-01T00:00:00", "0001-01-01T01:00:00%2B01:00", "9999-12-31T23:59:59"])
    def test_since_just_inside_the_edge_is_answered(self, client, since):
        assert client.get(f"/v1/stats?since={since}").status_code == 200


# ---------------------------------------------------------------------------------------------------
# 3. A request the database can never run was reported as "database unavailable, retry" (503 +
#    Retry-After): rescore took 100_000 ids as one bind parameter each; PostgreSQL takes 65_535.
#    Now: the ids travel as one array parameter, at most MAX_RESCORE_IDS of them (422 beyond), and
#    only a connection failure is a 503.
# ---------------------------------------------------------------------------------------------------


def test_too_many_rescore_ids_is_a_422_naming_the_field(api):
    from service.api.schemas import MAX_RESCORE_IDS

    assert api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    r = api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": [f"g{i}" for i in range(70_000)]})
    assert_client_error(r, "group_ids", statuses=(422,))
    assert "retry-after" not in r.headers
    r = api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": [f"g{i}" for i in range(MAX_RESCORE_IDS + 1)]})
    assert_client_error(r, "group_ids", statuses=(422,))


def test_rescore_at_the_id_limit_selects_exactly_the_listed_groups(api):
    from service.api.schemas import MAX_RESCORE_IDS

    assert api.post("/v1/reward-specs", json={"name": "s", "components": [{"name": "c", "kind": "verifier.math"}]}).status_code == 201
    for gid in ("keep-a", "keep-b"):
        assert api.post("/v1/groups", json=make_group(gid, prompt_id=f"p-{gid}")).status_code == 201
    ids = ["keep-a", *(f"absent-{i}" for i in range(MAX_RESCORE_IDS - 1))]
    r = api.post("/v1/rescore", json={"reward_spec": "s", "group_ids": ids})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["groups"] == 1, r.json()


def test_only_connection_failures_count_as_unavailable(engine):
    """Real exceptions: a statement PostgreSQL refuses (too many parameters) is not "unavailable";
    a connection refused is."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    from service.api.errors import _is_db_unavailable
    from tests.conftest import free_port

    params = {f"p{i}": i for i in range(70_000)}
    sql = text("SELECT 1 WHERE 1 IN (" + ", ".join(f":p{i}" for i in range(70_000)) + ")")
    with pytest.raises(DBAPIError) as too_many, engine.connect() as conn:
        conn.execute(sql, params)
    assert not _is_db_unavailable(too_many.value), too_many.value
    with pytest.raises(DBAPIError) as refused:
        create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x").connect()
    assert _is_db_unavailable(refused.value), refused.value


# ---------------------------------------------------------------------------------------------------
# 4. Names: a reward spec could be named 'n@1' or 'a@b', but every reference parses '@' as a version:
#    GET /v1/reward-specs/n@1 answered spec 'n' version 1, and 'a@b' could never be read or attached.
# ---------------------------------------------------------------------------------------------------


class TestSpecNames:
    @pytest.mark.parametrize("name", ["n@1", "a@b", "@", "x@"])
    def test_at_sign_in_a_spec_name_is_refused(self, client, session, name):
        client.post("/v1/reward-specs", json={"name": "n", "components": [{"name": "c", "kind": "verifier.exact_match"}]})
        r = client.post("/v1/reward-specs", json={"name": name, "components": [{"name": "c", "kind": "verifier.math"}]})
        assert_client_error(r, "name", statuses=(422,))
        assert "'@'" in r.json()["error"], r.json()  # said in words
        got = client.get("/v1/reward-specs/n").json()
        assert got["body"]["components"][0]["kind"] == "verifier.exact_match"

    @pytest.mark.parametrize("name", ["a@b", "x@1"])
    def test_at_sign_in_a_policy_name_is_refused(self, client, name):
        assert_client_error(client.post("/v1/curation-policies", json={"name": name}), "name", statuses=(422,))

    def test_a_version_ref_still_attaches(self, client):
        client.post("/v1/reward-specs", json={"name": "n/x y", "components": [{"name": "c", "kind": "verifier.math"}]})
        assert client.put("/v1/datasets/d", json={"reward_spec": "n/x y@1"}).status_code == 200


# ---------------------------------------------------------------------------------------------------
# 5. The reference check only tested ``is None``: an empty answer ([] or "") passed ingest and the group
#    ended as reward_error after its attempts. Now each component kind checks its own reference values.
# ---------------------------------------------------------------------------------------------------

BAD_ANSWERS = {
    "empty-list": [], "empty-string": "", "blank": "  \n", "list-with-blank": ["4", " "],
    "bool": True, "object": {"x": 1}, "nested-list": [["4"]], "null-item": ["4", None],
}


class TestReferenceValues:
    @pytest.mark.parametrize("answer", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
    def test_bad_answer_is_refused_at_group_ingest(self, client, session, answer):
        r = client.post("/v1/groups", json=make_group("ref-1", reference={"answer": answer}))
        assert_client_error(r, "prompt.reference.answer", statuses=(422,))
        assert "verifier" in r.json()["error"] or "component" in r.json()["error"]
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize("answer", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
    def test_bad_answer_is_refused_at_prompt_ingest(self, client, session, answer):
        body = {"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": answer}}]}
        assert_client_error(client.post("/v1/prompts", json=body), "prompts[0].reference.answer", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize("answer", ["42", 42, 0, -1.5, ["41", 42], "\\frac{1}{2}"])
    def test_usable_answers_are_accepted(self, client, answer):
        body = {"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": answer}}]}
        assert client.post("/v1/prompts", json=body).status_code == 200

    @pytest.mark.parametrize("tests", ["", "   ", 3, ["assert True"]])
    def test_code_tests_must_be_python_source(self, client, session, tests):
        spec = {"name": "code", "components": [{"name": "c", "kind": "verifier.code"}]}
        assert client.post("/v1/reward-specs", json=spec).status_code == 201
        assert client.put("/v1/datasets/py", json={"reward_spec": "code"}).status_code == 200
        body = {"prompts": [{"id": "pp", "dataset": "py", "reference": {"tests": tests}}]}
        assert_client_error(client.post("/v1/prompts", json=body), "prompts[0].reference.tests", statuses=(422,))
        body["prompts"][0]["reference"]["tests"] = "assert True"
        assert client.post("/v1/prompts", json=body).status_code == 200


# ---------------------------------------------------------------------------------------------------
# 6. Strict types: a JSON boolean was coerced into the int literal of ``loss_mask``.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [True, False, 2, -1, 1.0], ids=["true", "false", "two", "minus-one", "float"])
def test_loss_mask_takes_only_integers_0_and_1(client, session, mask):
    g = make_group("lm-1")
    n = len(g["trajectories"][0]["token_ids"])
    g["trajectories"][0]["loss_mask"] = [1] * (n - 1) + [mask]
    assert_client_error(client.post("/v1/groups", json=g), "trajectories[0].loss_mask", statuses=(422,))
    assert stored(session) == (0, 0, 0)
    g["trajectories"][0]["loss_mask"] = [0, 1] * (n // 2) + [1] * (n % 2)
    assert client.post("/v1/groups", json=g).status_code == 201


# ---------------------------------------------------------------------------------------------------
# 7-9. "Finite" was not enough: weights of 1e308 made math.fsum overflow in the score pass (the whole
#    batch rolled back, innocent groups stayed 'received') or gave NaN advantages on a 'ready' group;
#    resample_budget_multiplier 1e308 made math.ceil raise in the curate pass. Closed at the API:
#    every number that scales a reward or a budget is bounded (422 naming the field), and the largest
#    accepted values go through the real pipeline to finite advantages.
# ---------------------------------------------------------------------------------------------------


def _spec(name: str, weights: list[float]) -> dict[str, Any]:
    comps = [{"name": f"c{i}", "kind": "verifier.math", "weight": w, "outcome": i == 0} for i, w in enumerate(weights)]
    return {"name": name, "components": comps}


class TestBoundedWeights:
    @pytest.mark.parametrize("weights", [[1e308, 1e308], [1e308], [1.0, -1e308], [1e6 * (1 + 1e-15)]])
    def test_a_weight_beyond_1e6_is_refused(self, client, weights):
        r = client.post("/v1/reward-specs", json=_spec("huge", weights))
        bad = next(i for i, w in enumerate(weights) if abs(w) > 1e6)
        assert_client_error(r, f"components[{bad}].weight", statuses=(422,))

    @pytest.mark.parametrize("params", [
        {"kind": "rule.tool_calls", "params": {"no_calls_value": 1e308}, "field": "no_calls_value"},
        {"kind": "judge.llm", "params": {"endpoint": "local", "model": "m", "min_score": -1e308,
                                         "max_score": 1e308}, "field": "min_score"},
    ], ids=["no_calls_value", "judge-score-range"])
    def test_component_params_that_scale_a_reward_are_bounded(self, client, params):
        from reward_models.registry import KINDS

        if params["kind"] not in KINDS:
            pytest.skip(f"{params['kind']} is not a registered kind here")
        comp = {"name": "c", "kind": params["kind"], "params": params["params"]}
        r = client.post("/v1/reward-specs", json={"name": "p", "components": [comp]})
        assert_client_error(r, params["field"], statuses=(422,))


POLICY_BOUNDS = {
    "resample_budget_multiplier": ({"resample_budget_multiplier": 1e308}, {"resample_budget_multiplier": 16.0}),
    "multiplier-just-over": ({"resample_budget_multiplier": 16.000001}, {"resample_budget_multiplier": 1.0}),
    "penalty": ({"penalty": -1e308}, {"penalty": -1e6}),
    "overlong_buffer": ({"overlong_buffer": 1e308}, {"overlong_buffer": 2.0**31 - 1}),
    "zero_variance.eps": ({"zero_variance": {"eps": 1e308}}, {"zero_variance": {"eps": 1e6}}),
    "advantage.eps": ({"advantage": {"eps": 1e308}}, {"advantage": {"eps": 1e6}}),
    "curriculum.solved": ({"curriculum": {"solved": 1e308}}, {"curriculum": {"solved": 1e6}}),
    "curriculum.failed": ({"curriculum": {"failed": -1e308}}, {"curriculum": {"failed": -1e6}}),
    "zero_variance.pass_rate_band": ({"zero_variance": {"pass_rate_band": [0, 1e308]}},
                                     {"zero_variance": {"pass_rate_band": [0, 1]}}),
}


@pytest.mark.parametrize("case", POLICY_BOUNDS.values(), ids=POLICY_BOUNDS.keys())
def test_every_policy_float_is_bounded(client, case):
    bad, edge = case
    field = next(iter(bad)) if not isinstance(next(iter(bad.values())), dict) else \
        f"{next(iter(bad))}.{next(iter(next(iter(bad.values()))))}"
    assert_client_error(client.post("/v1/curation-policies", json={"name": "b", **bad}), field, statuses=(422,))
    r = client.post("/v1/curation-policies", json={"name": "e", **edge})
    assert r.status_code == 201, r.text


def test_the_largest_accepted_values_give_finite_advantages(api, scorer):
    """Weights of +-1e6 on several components, the largest multiplier and penalty: the real pipeline
    scores and curates every group, with finite totals and advantages (no overflow anywhere)."""
    from service.worker.pipeline import drain

    spec = _spec("edge", [1e6, 1e6, -1e6, 1e6])
    assert api.post("/v1/reward-specs", json=spec).status_code == 201
    policy = {"name": "edge", "finish_reason_actions": {"length": "resample"}, "resample_budget_multiplier": 16.0,
              "penalty": -1e6, "advantage": {"eps": 1e6}}
    assert api.post("/v1/curation-policies", json=policy).status_code == 201
    assert api.put("/v1/datasets/edge", json={"reward_spec": "edge", "curation_policy": "edge"}).status_code == 200
    answers = ["42", "41", "42", "7"]
    edge = make_group("edge-g", prompt_id="edge-p", dataset="edge", answers=answers)
    edge["sampling"]["max_tokens"] = 2**31 - 1
    edge["trajectories"][1]["finish_reason"] = "length"
    assert api.post("/v1/groups", json=edge).status_code == 201
    assert api.post("/v1/groups", json=make_group("inn", prompt_id="inn-p", answers=answers)).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    for gid in ("edge-g", "inn"):
        g = api.get(f"/v1/groups/{gid}").json()
        assert g["status"] in ("ready", "dropped"), g["status"]
        for t in g["trajectories"]:
            assert t["total_reward"] is not None and math.isfinite(t["total_reward"]), t
            if t["advantage"] is not None:
                assert math.isfinite(t["advantage"]), t
    totals = sorted(t["total_reward"] for t in api.get("/v1/groups/edge-g").json()["trajectories"])
    assert totals[-1] == pytest.approx(2e6), totals  # 42 is right: 1e6 + 1e6 - 1e6 + 1e6

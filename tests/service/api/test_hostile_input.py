"""Every bad input is a 4xx in the service's error format that names the field, and stores nothing
(issues 15 and 16). Real app, real PostgreSQL; each test's writes are rolled back."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, RewardSpecRow, Trajectory
from tests.helpers import assert_client_error, make_group

BIG = 2**70


def stored(session: Session) -> tuple[int, ...]:
    return tuple(session.scalar(select(func.count()).select_from(m)) for m in (Prompt, Group, Trajectory))  # type: ignore[misc]


def assert_error(r: Any, status: int, field: str) -> None:
    """The one error format: ``error`` names the field, ``detail`` lists it."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"].startswith(f"{field}: ") or f"; {field}: " in body["error"], body
    if isinstance(body["detail"], list):
        assert field in [d["field"] for d in body["detail"]], body


def with_path(group: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(group)
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    return out


GROUP_CASES = [
    # integers beyond their column, or beyond 64 bits inside free-form JSON
    (("policy_version",), 2**31, 422, "policy_version"),
    (("policy_version",), -1, 422, "policy_version"),
    (("trajectories", 0, "num_tokens"), BIG, 422, "trajectories[0].num_tokens"),
    (("trajectories", 0, "num_tokens"), 2**31, 422, "trajectories[0].num_tokens"),
    (("trajectories", 0, "token_ids"), [1] * 9 + [2**31], 422, "trajectories[0].token_ids[9]"),
    (("metadata", "x"), BIG, 422, "metadata.x"),
    (("metadata", "x"), [1, {"y": -BIG}], 422, "metadata.x[1].y"),
    (("prompt", "reference", "n"), BIG, 422, "prompt.reference.n"),
    (("sampling", "max_tokens"), 2**40, 422, "sampling.max_tokens"),
    (("trajectories", 1, "metadata", "k"), BIG, 422, "trajectories[1].metadata.k"),
    # NUL and unpaired surrogates PostgreSQL text cannot hold, anywhere
    (("id",), "g\x00", 422, "id"),
    (("prompt_id",), "p\x00", 422, "prompt_id"),
    (("prompt", "dataset"), "toy\x00", 422, "prompt.dataset"),
    (("prompt", "messages", 0, "content"), "6*7\x00?", 422, "prompt.messages[0].content"),
    (("trajectories", 2, "final_answer"), "42\x00", 422, "trajectories[2].final_answer"),
    (("trajectories", 0, "messages", 0, "content"), "\ud800", 422, "trajectories[0].messages[0].content"),
    (("metadata", "tags"), ["a", "b\x00"], 422, "metadata.tags[1]"),
    # floats: finite, and within float32 where stored as float32
    (("trajectories", 0, "logprobs", 3), 1e300, 422, "trajectories[0].logprobs[3]"),
    (("trajectories", 0, "logprobs", 3), -1e39, 422, "trajectories[0].logprobs[3]"),
    # strict types: no string-for-int, no float-for-int, no int-for-string
    (("policy_version",), "3", 422, "policy_version"),
    (("policy_version",), 3.0, 422, "policy_version"),
    (("policy_version",), True, 422, "policy_version"),
    (("trajectories", 0, "num_tokens"), "6", 422, "trajectories[0].num_tokens"),
    (("id",), 17, 422, "id"),
    (("trajectories", 0, "loss_mask", 0), "1", 422, "trajectories[0].loss_mask[0]"),
    # ids: control characters are not allowed, said in words
    (("id",), "line\nbreak", 422, "id"),
    (("id",), "x" * 513, 422, "id"),
]


class TestGroupFields:
    @pytest.mark.parametrize(("path", "value", "status", "field"), GROUP_CASES, ids=lambda v: str(v)[:40])
    def test_single_group(self, client, session, path, value, status, field):
        body = _dumps(with_path(make_group("h-1"), path, value))
        r = client.post("/v1/groups", content=body, headers={"content-type": "application/json"})
        assert_error(r, status, field)
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize(("path", "value", "status", "field"), GROUP_CASES[:12], ids=lambda v: str(v)[:40])
    def test_in_a_batch_the_path_starts_at_groups(self, client, session, path, value, status, field):
        body = {"groups": [make_group("ok-1", prompt_id="ok-p"), with_path(make_group("h-2"), path, value)]}
        r = client.post("/v1/groups", content=_dumps(body), headers={"content-type": "application/json"})
        assert_error(r, status, f"groups[1].{field}")
        assert "single." not in r.text and "batch." not in r.text
        assert stored(session) == (0, 0, 0)

    def test_control_characters_are_explained_in_words(self, client):
        r = client.post("/v1/groups", json=make_group("tab\there"))
        assert_error(r, 422, "id")
        assert "control characters" in r.json()["error"] and "^[" not in r.json()["error"]

    def test_messages_per_trajectory_are_bounded(self, client, session):
        many = [{"role": "assistant", "content": "x"}] * 16_385
        r = client.post("/v1/groups", json=with_path(make_group("turns"), ("trajectories", 0, "messages"), many))
        assert_error(r, 422, "trajectories[0].messages")
        assert stored(session) == (0, 0, 0)


def _dumps(value: Any) -> bytes:
    """JSON the way a careless producer writes it: Python's json, big ints and lone surrogates included."""
    import json

    return json.dumps(value).encode()


class TestWire:
    def test_more_groups_than_allowed_in_one_request(self, client, session):
        body = {"groups": [make_group(f"many-{i}", prompt_id=f"many-p-{i}", n=2) for i in range(257)]}
        assert_error(client.post("/v1/groups", json=body), 422, "groups")
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            (b'{"id": "a", "id": "b"}', "id"),
            (b'{"groups": [{"id": "a", "metadata": {"k": 1, "k": 2}}]}', "groups[0].metadata.k"),
        ],
    )
    def test_duplicate_keys_are_rejected(self, client, session, raw, field):
        r = client.post("/v1/groups", content=raw, headers={"content-type": "application/json"})
        assert_error(r, 400, field)
        assert "duplicate key" in r.json()["error"]

    @pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "json"])
    @pytest.mark.parametrize("route", ["/v1/groups", "/v1/policy", "/v1/reward-specs", "/v1/batches/lease"])
    def test_only_application_json_bodies(self, client, session, content_type, route):
        headers = {"content-type": content_type} if content_type else {}
        r = client.post(route, content=orjson.dumps(make_group("ct")), headers=headers)
        assert_error(r, 415, "content-type")
        assert stored(session) == (0, 0, 0)

    def test_json_with_charset_is_json(self, client):
        r = client.post("/v1/groups", content=orjson.dumps(make_group("cs")),
                        headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 201, r.text

    @pytest.mark.parametrize(
        ("url", "field"),
        [
            ("/v1/groups/a%00b", "path"),
            ("/v1/groups?dataset=toy%00", "query.dataset"),
            ("/v1/groups?cursor=%00", "query.cursor"),
            ("/v1/sampling/requests?producer_id=p%00", "query.producer_id"),
            ("/v1/datasets/x%01y", "path"),
        ],
    )
    def test_control_characters_in_path_and_query(self, client, url, field):
        assert_error(client.get(url), 422, field)

    @pytest.mark.parametrize(
        ("url", "field"),
        [
            ("/v1/groups/g?spec_version=1099511627776", "query.spec_version"),
            ("/v1/groups/g?spec_version=3.5", "query.spec_version"),
            ("/v1/reward-specs/default?version=1099511627776", "query.version"),
            ("/v1/curation-policies/default?version=2147483648", "query.version"),
            ("/v1/groups?policy_version=2147483648", "query.policy_version"),
        ],
    )
    def test_integer_query_parameters_are_bounded(self, client, url, field):
        assert_error(client.get(url), 422, field)

    @pytest.mark.parametrize(
        ("route", "body", "field"),
        [
            ("/v1/batches/lease", {"trainer_id": "t", "max_groups": 1, "max_staleness": 2**62}, "max_staleness"),
            ("/v1/batches/lease", {"trainer_id": "t", "max_groups": "1"}, "max_groups"),
            ("/v1/batches/lease", {"trainer_id": "t\x00", "max_groups": 1}, "trainer_id"),
            ("/v1/batches/lease", {"trainer_id": "t", "max_groups": 1, "request_id": "r\x00"}, "request_id"),
            ("/v1/sampling/requests/done", {"request_ids": [1, BIG]}, "request_ids[1]"),
            ("/v1/sampling/requests/done", {"request_ids": [2**63]}, "request_ids[0]"),
            ("/v1/policy", {"version": 2**31}, "version"),
            ("/v1/policy", {"version": "4"}, "version"),
            ("/v1/policy", {"version": 4, "metrics": {"loss": BIG}}, "metrics.loss"),
            ("/v1/curation-policies", {"name": "p", "curriculum": {"k": BIG}}, "curriculum.k"),
            ("/v1/curation-policies", {"name": "p", "min_group_size": "2"}, "min_group_size"),
            ("/v1/reward-specs", {"name": "s", "components": [{"name": "c", "kind": "rule.length",
                                                                "params": {"max_tokens": BIG}}]},
             "components[0].params.max_tokens"),
            ("/v1/rescore", {"reward_spec": "default", "policy_version": 2**31}, "policy_version"),
            ("/v1/rescore", {"reward_spec": "default", "group_ids": ["a\x00"]}, "group_ids[0]"),
        ],
    )
    def test_other_bodies(self, client, route, body, field):
        r = client.post(route, content=_dumps(body), headers={"content-type": "application/json"})
        assert_error(r, 422, field)

    def test_spec_reference_with_a_huge_version(self, client):
        r = client.put("/v1/datasets/d", json={"reward_spec": "default@1099511627776"})
        assert_error(r, 422, "reward_spec")


class TestErrorFormat:
    @pytest.mark.parametrize(
        ("method", "url", "status"),
        [
            ("GET", "/no/such/route", 404),
            ("GET", "/v1/groups/missing", 404),
            ("GET", "/v1/datasets/never-configured", 404),
            ("DELETE", "/v1/groups", 405),
            ("PUT", "/v1/policy", 405),
        ],
    )
    def test_every_error_has_the_one_format(self, client, method, url, status):
        r = client.request(method, url)
        assert r.status_code == status and r.headers["content-type"] == "application/json"
        body = r.json()
        assert set(body) == {"error", "detail"} and isinstance(body["error"], str) and body["error"], body

    def test_405_says_what_is_allowed(self, client):
        r = client.delete("/v1/policy")
        assert "(allowed: GET, POST)" in r.json()["error"] and r.headers["allow"] == "GET, POST"

    def test_spec_errors_are_not_prefixed_twice(self, client):
        body = {"name": "s", "components": [{"name": "a", "kind": "verifier.f1"}, {"name": "b", "kind": "nope"}]}
        r = client.post("/v1/reward-specs", json=body)
        assert_error(r, 422, "components[1].kind")
        assert "components.components" not in r.text


class TestIds:
    # (a literal '%2F' inside an id is checked against uvicorn in test_wire_live: TestClient decodes twice)
    IDS = ["HumanEval/0", "gsm8k/test/12", "a#b", "q?x=1", "100%", "sp ace", "/lead", "trail/", "é/日本"]

    @pytest.mark.parametrize("gid", IDS)
    def test_any_printable_id_round_trips(self, client, gid):
        from service.client import segment

        r = client.post("/v1/groups", json=make_group(gid, prompt_id=f"p:{gid}"))
        assert r.status_code == 201, r.text
        got = client.get(f"/v1/groups/{segment(gid)}")
        assert got.status_code == 200, got.text
        assert got.json()["id"] == gid and got.json()["prompt_id"] == f"p:{gid}"

    @pytest.mark.parametrize("url", ["/v1/datasets/openai/gsm8k", "/v1/datasets/openai%2Fgsm8k"])
    def test_dataset_names_with_slashes(self, client, url):
        spec = {"name": "exact", "components": [{"name": "m", "kind": "verifier.exact_match"}]}
        assert client.post("/v1/reward-specs", json=spec).status_code in (200, 201)
        r = client.put(url, json={"reward_spec": "exact"})
        assert r.status_code == 200, r.text
        assert r.json()["name"] == "openai/gsm8k"
        assert client.get("/v1/datasets/openai%2Fgsm8k").json()["reward_spec"] == "exact"
        assert client.get("/v1/datasets/openai/gsm8k").json()["reward_spec"] == "exact"
        assert client.get("/v1/datasets/openai").status_code == 404


class TestReferenceFields:
    def _spec(self, client, name: str, kind: str) -> None:
        r = client.post("/v1/reward-specs", json={"name": name, "components": [{"name": "c", "kind": kind}]})
        assert r.status_code in (200, 201), r.text

    def test_default_math_spec_needs_an_answer(self, client, session):
        r = client.post("/v1/groups", json=make_group("noans", reference={"solution": "42"}))
        assert_error(r, 422, "prompt.reference.answer")
        assert "verifier.math" not in r.json()["error"] or "'default'" in r.json()["error"]
        r = client.post("/v1/groups", json={"groups": [make_group("noans2", reference={"answer": None})]})
        assert_error(r, 422, "groups[0].prompt.reference.answer")
        assert stored(session) == (0, 0, 0)

    def test_prompts_endpoint_checks_too(self, client, session):
        prompts = [{"id": "ok", "reference": {"answer": "1"}}, {"id": "bad", "dataset": "d2", "reference": {}}]
        assert_error(client.post("/v1/prompts", json={"prompts": prompts}), 422, "prompts[1].reference.answer")
        assert stored(session) == (0, 0, 0)

    def test_the_dataset_spec_decides(self, client, session):
        self._spec(client, "code", "verifier.code")
        self._spec(client, "lengths", "verifier.json_schema")
        client.put("/v1/datasets/code-ds", json={"reward_spec": "code"})
        client.put("/v1/datasets/free-ds", json={"reward_spec": "lengths"})
        r = client.post("/v1/groups", json=make_group("c1", dataset="code-ds", reference={"answer": "42"}))
        assert_error(r, 422, "prompt.reference.tests")
        r = client.post("/v1/groups", json=make_group("c2", prompt_id="p2", dataset="code-ds",
                                                      reference={"tests": "assert True"}))
        assert r.status_code == 201, r.text
        r = client.post("/v1/groups", json=make_group("f1", prompt_id="p3", dataset="free-ds", reference={}))
        assert r.status_code == 201, r.text


class TestIdenticalRepost:
    def test_reward_spec(self, client, session):
        spec = {"name": "same", "components": [{"name": "c", "kind": "verifier.math"}]}
        first, again = client.post("/v1/reward-specs", json=spec), client.post("/v1/reward-specs", json=spec)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json() == again.json() == {"name": "same", "version": 1}
        spec["components"][0]["weight"] = 2.0
        changed = client.post("/v1/reward-specs", json=spec)
        assert changed.status_code == 201 and changed.json()["version"] == 2
        assert session.scalar(select(func.count()).select_from(RewardSpecRow).where(RewardSpecRow.name == "same")) == 2

    def test_curation_policy(self, client):
        policy = {"name": "same-p", "max_staleness": 4}
        codes = [client.post("/v1/curation-policies", json=policy).status_code for _ in range(2)]
        assert codes == [201, 200]


JSON = {"content-type": "application/json"}


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# ---------------------------------------------------------------------------------------------------
# 1. Deep nesting that the JSON parsers accept (~1000 levels) crashed later code (pydantic's serializer
#    at ~255 levels, the JSONB encoder) -> 500. Now: more than MAX_DEPTH levels is a 422 naming the field.
# ---------------------------------------------------------------------------------------------------
# Attack: bodies nested ~1000 levels deep (accepted by the JSON parsers) crashed the serializer / JSONB encoder -> 500.


class TestDeepNesting:
    def test_deep_group_metadata_is_a_4xx_not_500(self, lenient_client, session):
        head = make_group("deep-1")
        raw = '{"id": "deep-1", "prompt_id": "p-1", "policy_version": 0, "prompt": %s, "trajectories": %s,' \
              ' "metadata": {"d": %s}}'
        body = raw % (json.dumps(head["prompt"]), json.dumps(head["trajectories"]), _nested(300))
        r = lenient_client.post("/v1/groups", content=body, headers=JSON)
        assert_client_error(r, "metadata.d[0]", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    def test_deep_prompt_reference_is_a_4xx_not_500(self, lenient_client, session):
        body = '{"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": "1", "d": ' + _nested(600) + "}}]}"
        r = lenient_client.post("/v1/prompts", content=body, headers=JSON)
        assert_client_error(r, "prompts[0].reference.d", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    def test_deep_policy_metrics_is_a_4xx_not_500(self, lenient_client):
        body = '{"version": 1, "metrics": {"d": ' + _nested(600) + "}}"
        assert_client_error(lenient_client.post("/v1/policy", content=body, headers=JSON), "metrics.d", statuses=(422,))

    @pytest.mark.parametrize("duplicate", [False, True], ids=["fast-path", "exact-path"])
    def test_the_depth_limit_edge(self, lenient_client, session, duplicate):
        """The document root is level 1: metadata (2) + {"d": (3) ... holds MAX_DEPTH - 3 more arrays."""
        from service.api.wire_checks import MAX_DEPTH

        def post(extra: int):
            g = make_group("edge-1")
            g["metadata"] = {"d": json.loads(_nested(extra))}
            text = json.dumps(g)
            if duplicate:  # a repeated key sends the body down the stdlib parser's path
                text = text.replace('"metadata": {', '"metadata": {"k": 1, "k": 2, ', 1)
            return lenient_client.post("/v1/groups", content=text, headers=JSON)

        deepest = post(MAX_DEPTH - 2)  # the innermost array is at level MAX_DEPTH
        if duplicate:
            assert deepest.status_code == 400 and "metadata.k" in deepest.json()["error"], deepest.text
        else:
            assert deepest.status_code == 201, deepest.text
        r = post(MAX_DEPTH - 1)
        assert_client_error(r, "metadata.d" + "[0]" * (MAX_DEPTH - 2) + ":", statuses=(422,))
        assert f"more than {MAX_DEPTH} levels" in r.json()["error"]

    def test_beyond_the_parsers_is_a_400(self, lenient_client):
        r = lenient_client.post("/v1/policy", content='{"version": 1, "metrics": ' + _nested(5000) + "}", headers=JSON)
        assert_client_error(r, "body", statuses=(400,))


# ---------------------------------------------------------------------------------------------------
# 2. Query parameters: ``cursor`` (str.isdigit() accepted '²'; 20 digits overflowed bigint) and
#    ``since`` (a datetime near year 1 / 9999 with an offset overflowed in astimezone) -> 500.
# ---------------------------------------------------------------------------------------------------
# Attack: a cursor of '²' or 20 digits, or a since near year 1 / 9999, overflowed -> 500.


class TestQueryParams:
    @pytest.mark.parametrize(
        "cursor", ["%C2%B2", "99999999999999999999", "%D9%A1" * 25, "9223372036854775808", "-1", "+1", " 1", "1.0"]
    )
    def test_bad_cursor_is_a_422(self, lenient_client, cursor):
        r = lenient_client.get(f"/v1/groups?cursor={cursor}")
        assert_client_error(r, "query.cursor", statuses=(422,))

    @pytest.mark.parametrize("cursor", ["0", "9223372036854775807", "0000000000000000001"])
    def test_cursors_in_range_are_answered(self, lenient_client, cursor):
        r = lenient_client.get(f"/v1/groups?cursor={cursor}")
        assert r.status_code == 200, r.text

    @pytest.mark.parametrize("since", ["0001-01-01T00:00:00%2B01:00", "9999-12-31T23:59:59-01:00"])
    def test_since_at_the_edge_of_datetime_is_a_422(self, lenient_client, since):
        r = lenient_client.get(f"/v1/stats?since={since}")
        assert_client_error(r, "query.since", statuses=(422,))

    @pytest.mark.parametrize("since", ["0001-01-01T00:00:00", "0001-01-01T01:00:00%2B01:00", "9999-12-31T23:59:59"])
    def test_since_just_inside_the_edge_is_answered(self, lenient_client, since):
        assert lenient_client.get(f"/v1/stats?since={since}").status_code == 200


# ---------------------------------------------------------------------------------------------------
# 5. The reference check only tested ``is None``: an empty answer ([] or "") passed ingest and the group
#    ended as reward_error after its attempts. Now each component kind checks its own reference values.
# ---------------------------------------------------------------------------------------------------

BAD_ANSWERS = {
    "empty-list": [], "empty-string": "", "blank": "  \n", "list-with-blank": ["4", " "],
    "bool": True, "object": {"x": 1}, "nested-list": [["4"]], "null-item": ["4", None],
}


# Attack: an empty reference answer ([] or '') passed ingest and the group ended as reward_error.
class TestReferenceValues:
    @pytest.mark.parametrize("answer", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
    def test_bad_answer_is_refused_at_group_ingest(self, lenient_client, session, answer):
        r = lenient_client.post("/v1/groups", json=make_group("ref-1", reference={"answer": answer}))
        assert_client_error(r, "prompt.reference.answer", statuses=(422,))
        assert "verifier" in r.json()["error"] or "component" in r.json()["error"]
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize("answer", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
    def test_bad_answer_is_refused_at_prompt_ingest(self, lenient_client, session, answer):
        body = {"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": answer}}]}
        assert_client_error(lenient_client.post("/v1/prompts", json=body), "prompts[0].reference.answer", statuses=(422,))
        assert stored(session) == (0, 0, 0)

    @pytest.mark.parametrize("answer", ["42", 42, 0, -1.5, ["41", 42], "\\frac{1}{2}"])
    def test_usable_answers_are_accepted(self, lenient_client, answer):
        body = {"prompts": [{"id": "pp", "dataset": "toy", "reference": {"answer": answer}}]}
        assert lenient_client.post("/v1/prompts", json=body).status_code == 200

    @pytest.mark.parametrize("tests", ["", "   ", 3, ["assert True"]])
    def test_code_tests_must_be_python_source(self, lenient_client, session, tests):
        spec = {"name": "code", "components": [{"name": "c", "kind": "verifier.code"}]}
        assert lenient_client.post("/v1/reward-specs", json=spec).status_code == 201
        assert lenient_client.put("/v1/datasets/py", json={"reward_spec": "code"}).status_code == 200
        body = {"prompts": [{"id": "pp", "dataset": "py", "reference": {"tests": tests}}]}
        assert_client_error(lenient_client.post("/v1/prompts", json=body), "prompts[0].reference.tests", statuses=(422,))
        body["prompts"][0]["reference"]["tests"] = "assert True"
        assert lenient_client.post("/v1/prompts", json=body).status_code == 200


# ---------------------------------------------------------------------------------------------------
# 6. Strict types: a JSON boolean was coerced into the int literal of ``loss_mask``.
# ---------------------------------------------------------------------------------------------------
# Attack: a JSON boolean was coerced into the 0 / 1 integers of loss_mask.


@pytest.mark.parametrize("mask", [True, False, 2, -1, 1.0], ids=["true", "false", "two", "minus-one", "float"])
def test_loss_mask_takes_only_integers_0_and_1(lenient_client, session, mask):
    g = make_group("lm-1")
    n = len(g["trajectories"][0]["token_ids"])
    g["trajectories"][0]["loss_mask"] = [1] * (n - 1) + [mask]
    assert_client_error(lenient_client.post("/v1/groups", json=g), "trajectories[0].loss_mask", statuses=(422,))
    assert stored(session) == (0, 0, 0)
    g["trajectories"][0]["loss_mask"] = [0, 1] * (n // 2) + [1] * (n % 2)
    assert lenient_client.post("/v1/groups", json=g).status_code == 201

"""The OpenAPI document is complete, its examples are accepted, and /docs works offline."""

from __future__ import annotations

import re

import pytest

from service.api.examples import EXAMPLE_PATHS, EXTRA_EXAMPLES, REQUEST_EXAMPLES
from service.api.openapi import missing_refs


@pytest.fixture
def doc(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def test_every_referenced_schema_is_defined(doc):
    assert missing_refs(doc) == set()
    assert {"GroupIn", "GroupsIn", "TrajectoryIn", "Message"} <= set(doc["components"]["schemas"])


def test_missing_refs_finds_a_dangling_reference(doc):
    broken = {**doc, "paths": {"/x": {"post": {"requestBody": {"$ref": "#/components/schemas/Nope"}}}}}
    assert missing_refs(broken) == {"Nope"}


def test_every_json_request_body_has_an_example(doc):
    bodies = [
        (method, path)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    assert bodies, "no request bodies found"
    for method, path in bodies:
        media = doc["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert media.get("examples"), f"{method.upper()} {path} has no example"
    assert set(REQUEST_EXAMPLES) <= set(bodies), "an example names a route that does not exist"


def test_the_group_body_offers_one_group_or_a_batch(doc):
    schema = doc["paths"]["/v1/groups"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in schema["oneOf"]} == {"GroupIn", "GroupsIn"}
    assert "trajectories" in doc["components"]["schemas"]["GroupIn"]["required"]


def test_every_example_is_accepted_in_order(client):
    """The examples, sent as a new user would (spec, policy, dataset, prompts, groups, ...), all succeed."""
    for (method, path), (summary, body) in REQUEST_EXAMPLES.items():
        for _name, (_s, extra) in EXTRA_EXAMPLES.get((method, path), {}).items():
            r = client.request(method, EXAMPLE_PATHS.get(path, path), json=extra)
            assert 200 <= r.status_code < 300, (path, summary, r.text)
        r = client.request(method, EXAMPLE_PATHS.get(path, path), json=body)
        assert 200 <= r.status_code < 300, (path, summary, r.text)
    group = client.get("/v1/groups/run7-step12-gsm8k-17").json()
    assert len(group["trajectories"]) == 4 and group["dataset"] == "gsm8k"
    agent = client.get("/v1/groups/run7-step12-calc-3", params={"include_tokens": True}).json()
    assert agent["trajectories"][0]["final_answer"] == "84"


def test_docs_page_is_served_without_outside_assets(client):
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", r.text), "loads something from another host"
    assert "cdn" not in r.text.lower()
    assert client.get("/redoc").status_code == 404


def test_the_stateful_examples_are_valid_bodies():
    """Examples of routes that need a live lease or score synchronously are not replayed above; each one
    still validates against the request schema its route declares (a drifted example fails here)."""
    from service.api.examples import STATEFUL_EXAMPLES
    from service.curation.schemas import SlotFillIn
    from service.delivery.schemas import ExtendIn, NackIn
    from service.scoring.schemas import OpenRLHFIn, ScoreIn
    from service.sessions.schemas import FinishIn, SessionIn

    models = {"/v1/score": ScoreIn, "/compat/openrlhf/{spec}/get_reward": OpenRLHFIn,
              "/v1/batches/{batch_id}/nack": NackIn, "/v1/batches/{batch_id}/extend": ExtendIn,
              "/v1/sessions": SessionIn, "/v1/sessions/{session_id}/finish": FinishIn,
              "/v1/groups/{group_id}/trajectories/{index}": SlotFillIn}
    assert {path for _, path in STATEFUL_EXAMPLES} == set(models)
    for (_method, path), (_summary, body) in STATEFUL_EXAMPLES.items():
        models[path].model_validate(body, strict=False)

"""Schemathesis over the app's own ``/openapi.json`` (issue 16): valid and invalid requests generated
from the schema, a fixed seed and a few examples per operation. Required: no 5xx, every status
documented, every answer matching its documented schema and content type.

The app runs in-process (ASGI) on its own migrated database with data in it, so reads hit real rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import make_group

EXAMPLES = 12  # per operation and mode: about 400 requests in all, a few seconds on 2 cores
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_app(make_db) -> Any:
    from fastapi.testclient import TestClient

    from service.app import create_app

    app = create_app(database_url=make_db())
    # a deployment with an inference upstream configured (creating a session does not call it; no route the
    # fuzzer can reach without a session key forwards anything): POST /v1/sessions is then a real route
    app.state.settings = app.state.settings.model_copy(update={"inference_url": "http://127.0.0.1:9/v1"})
    with TestClient(app) as c:  # a little real data: a prompt, groups, a published policy
        assert c.post("/v1/groups", json=make_group("fuzz/g-1", prompt_id="fuzz/p-1")).status_code == 201
        assert c.post("/v1/policy", json={"version": 1, "metrics": {}}).status_code == 201
    return app


@pytest.fixture(scope="module")
def api_schema(fuzz_app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


def _operations(api_schema: Any) -> list[Any]:
    return [result.ok() for result in api_schema.get_all_operations()]


def _run(operation: Any, mode: GenerationMode, failures: list[str]) -> None:
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if isinstance(case.body, dict) and "wait_seconds" in case.body:
            case.body["wait_seconds"] = 0  # a long poll would only make the run slow
        try:
            case.call_and_validate(checks=CHECKS)
        except Exception as exc:  # noqa: BLE001 - collected, reported together below
            failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:600]}")

    try:
        run()
    except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
        assert mode is GenerationMode.NEGATIVE, operation.label


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_api_never_5xx_and_matches_its_schema(api_schema: Any, mode: GenerationMode) -> None:
    operations = _operations(api_schema)
    assert len(operations) >= 15
    failures: list[str] = []
    for operation in operations:
        _run(operation, mode, failures)
    assert not failures, "\n\n".join(failures[:20])

"""The fuzzed app (test_fuzz_api.py, test_fuzz_api_negative.py): in-process (ASGI) on its own migrated
database with data in it, so reads hit real rows; one per test module."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis

from tests.helpers import make_group


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

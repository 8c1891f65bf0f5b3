"""Schemathesis over the app's own ``/openapi.json`` (issue 16), invalid requests (valid ones:
test_fuzz_api.py): no 5xx, every status documented, every answer matching its documented schema."""

from __future__ import annotations

from typing import Any

from schemathesis.generation import GenerationMode

from tests.service.api.fuzz import check_mode


def test_api_never_5xx_and_matches_its_schema_negative(api_schema: Any) -> None:
    check_mode(api_schema, GenerationMode.NEGATIVE)

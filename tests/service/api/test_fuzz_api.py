"""Schemathesis over the app's own ``/openapi.json`` (issue 16): valid and invalid requests generated
from the schema, a fixed seed and a few examples per operation. Required: no 5xx, every status
documented, every answer matching its documented schema and content type.

The app runs in-process (ASGI) on its own migrated database with data in it, so reads hit real rows.

Valid requests here, invalid ones in test_fuzz_api_negative.py (two files: two xdist workers run them at once).
"""

from __future__ import annotations

from typing import Any

from schemathesis.generation import GenerationMode

from tests.service.api.fuzz import check_mode


def test_api_never_5xx_and_matches_its_schema_positive(api_schema: Any) -> None:
    check_mode(api_schema, GenerationMode.POSITIVE)

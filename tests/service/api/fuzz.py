"""The schemathesis run shared by test_fuzz_api.py (valid requests) and test_fuzz_api_negative.py (invalid
ones): two files so that ``--dist loadfile`` runs the two modes on two workers at once (their app and schema:
conftest.py's ``api_schema``)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 12  # per operation and mode: about 400 requests in all
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def operations(api_schema: Any) -> list[Any]:
    return [result.ok() for result in api_schema.get_all_operations()]


def run_mode(operation: Any, mode: GenerationMode, failures: list[str]) -> None:
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


def check_mode(api_schema: Any, mode: GenerationMode) -> None:
    """Every operation in ``mode``: no 5xx, every status documented, every answer matching its schema."""
    ops = operations(api_schema)
    assert len(ops) >= 15
    failures: list[str] = []
    for operation in ops:
        run_mode(operation, mode, failures)
    assert not failures, "\n\n".join(failures[:20])

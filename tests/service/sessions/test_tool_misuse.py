"""The model's tool misuse, seen in a completion's tool_calls against the request's tools."""

from __future__ import annotations

import pytest

from service.sessions.misuse import tool_misuse
from tests.service.sessions.helpers import TOOLS


def _call(name: str, arguments: str) -> list[dict]:
    return [{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]


@pytest.mark.parametrize(("name", "arguments", "expected"), [
    ("search", '{"q": 1}', "unknown tool"),
    ("add", "{not json", "not JSON"),
    ("add", "[1, 2]", "not a JSON object"),
    ("add", '{"a": 1}', "schema"),
    ("add", '{"a": 1, "b": "two"}', "schema"),
])
def test_a_bad_tool_call_is_named(name: str, arguments: str, expected: str) -> None:
    assert expected in (tool_misuse(TOOLS, _call(name, arguments)) or "")


def test_a_valid_call_or_no_call_is_no_misuse() -> None:
    assert tool_misuse(TOOLS, _call("add", '{"a": 1, "b": 2}')) is None
    assert tool_misuse(TOOLS, None) is None


def test_a_tool_with_a_broken_schema_does_not_hide_a_later_misuse() -> None:
    """Attack: a call of a tool whose own schema is invalid ended the check, so a following call of an
    unknown tool with non-JSON arguments passed as no misuse."""
    from service.sessions.misuse import tool_misuse

    tools = [{"type": "function", "function": {"name": "broken", "parameters": {"type": 12}}}]
    calls = [{"function": {"name": "broken", "arguments": "{}"}},
             {"function": {"name": "no_such_tool", "arguments": "not json"}}]
    assert tool_misuse(tools, calls) is not None and "no_such_tool" in tool_misuse(tools, calls)
    assert tool_misuse(tools, calls[:1]) is None  # the broken schema alone is not the model's mistake

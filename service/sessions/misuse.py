"""The model's tool misuse, seen in a completion's ``tool_calls`` against the request's ``tools``: a name
not offered, arguments that are not a JSON object, or arguments that break the tool's JSON schema."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import orjson


def _offered(tools: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters")
    return out


def tool_misuse(tools: Any, tool_calls: Any) -> str | None:
    """One line naming the first misuse, or None when every call is a valid call of an offered tool."""
    if not tool_calls:
        return None
    if not isinstance(tool_calls, list):  # a dict or a string is no list of calls: never a silent pass
        return f"tool_calls: a {type(tool_calls).__name__}, not a list of calls"
    offered = _offered(tools)
    for i, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in offered:
            return f"tool_calls[{i}]: unknown tool {name!r} (offered: {sorted(offered)})"
        raw = fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return f"tool_calls[{i}].arguments: not JSON"
        if not isinstance(args, dict):
            return f"tool_calls[{i}].arguments: not a JSON object"
        schema = offered[name]
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)) if isinstance(schema, dict) else None
        if validator is None:
            continue  # no schema, or this tool's own schema is broken (not the model's mistake): the next calls
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))  # as jsonschema.validate reports it
        if error is not None:
            return f"tool_calls[{i}].arguments: against {name!r}'s schema: {error.message[:200]}"
    return None


@functools.lru_cache(maxsize=1024)
def _validator(schema: bytes) -> Any:
    """The validator of a tool's JSON schema (None when the schema itself is broken), built once per schema:
    an agent sends the same tools with every call (checking a schema costs more than a call's arguments)."""
    parsed = orjson.loads(schema)
    cls = jsonschema.validators.validator_for(parsed)
    try:
        cls.check_schema(parsed)
    except jsonschema.SchemaError:
        return None
    return cls(parsed)

"""The model's tool misuse, seen in a completion's ``tool_calls`` against the request's ``tools``: a name
not offered, arguments that are not a JSON object, or arguments that break the tool's JSON schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema


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
        if isinstance(schema, dict):
            try:
                jsonschema.validate(args, schema)
            except jsonschema.ValidationError as exc:
                return f"tool_calls[{i}].arguments: against {name!r}'s schema: {exc.message[:200]}"
            except jsonschema.SchemaError:
                continue  # this tool's own schema is broken (not the model's mistake): check the next calls
    return None

"""Episode tools and whose failure a tool call is (``rollout.episodes``).

A tool call is the model's mistake (``tool_misuse``) when its arguments are wrong, and that is decided by
the arguments, never by whatever a running tool happens to raise:

- before the tool runs: a name not offered; for a ``Tool`` with ``parameters``, arguments that are not
  JSON, not a JSON object, break the JSON schema, or do not bind to ``run``'s signature;
- the tool's explicit refusal: it raises ``ToolArgumentError`` (a calculator given ``2+``, or ``1//0``).

Any other exception while the tool runs on arguments that passed is the environment's (``tool_failure``):
a search backend that answers an HTML error page (``json.loads`` raising ``ValueError``) or JSON without
the expected key (``KeyError``) is not the model's fault.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema


class ToolArgumentError(ValueError):
    """A tool's explicit refusal of the arguments the model gave it: the model's mistake."""


@dataclass(frozen=True)
class Tool:
    """A tool whose arguments are a JSON object checked against ``parameters`` (a JSON schema) and bound to
    ``run``'s signature before it runs; ``run`` takes them as keywords."""

    run: Callable[..., str]
    parameters: dict[str, Any] | None = None


ToolLike = Tool | Callable[[str], str]  # a plain callable takes the call's raw argument text


def prepare(tool: ToolLike, raw: str) -> Callable[[], str]:
    """The tool's run on ``raw`` arguments, ready to call; ``ToolArgumentError`` naming what is wrong when the
    arguments are (the model's mistake, decided before anything runs)."""
    if not isinstance(tool, Tool):
        return lambda: tool(raw)
    try:
        args = json.loads(raw)
    except ValueError:
        raise ToolArgumentError("arguments: not JSON") from None
    if not isinstance(args, dict):
        raise ToolArgumentError("arguments: not a JSON object")
    if tool.parameters is not None:
        try:
            jsonschema.validate(args, tool.parameters)
        except jsonschema.ValidationError as exc:
            raise ToolArgumentError(f"arguments: {exc.message[:200]}") from None
    try:
        inspect.signature(tool.run).bind(**args)
    except TypeError as exc:
        raise ToolArgumentError(f"arguments: {exc}") from None
    return lambda: tool.run(**args)

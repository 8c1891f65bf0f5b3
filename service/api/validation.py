"""pydantic's validation errors as the service words them: one line naming each field, and the per-field
list (``{"field": "groups[0].loss_mask", "message": ...}``) that ``ErrorOut.detail`` carries."""

from __future__ import annotations

from typing import Any

from service.api.schemas import PATTERN_WORDS


def format_loc(loc: tuple[Any, ...]) -> str:
    """('body', 'groups', 0, 'loss_mask') -> 'groups[0].loss_mask'; ('query', 'version') -> 'query.version'."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.startswith(("function-", "tagged-union", "union[")):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _join(loc: str, head: str) -> str:
    """A validator's message that names its own field ('components[1].kind' raised on 'components')
    replaces the last part of loc instead of repeating it."""
    if not loc:
        return head
    parent, _, last = loc.rpartition(".")
    if head == last or head.startswith((f"{last}[", f"{last}.")):
        return f"{parent}.{head}" if parent else head
    return f"{loc}.{head}"


def _message(e: dict[str, Any]) -> str:
    msg = str(e.get("msg", "invalid"))
    if e.get("type") == "string_pattern_mismatch":
        pattern = (e.get("ctx") or {}).get("pattern")
        if isinstance(pattern, str) and pattern in PATTERN_WORDS:
            return f"must be {PATTERN_WORDS[pattern]}"
        return f"must be text matching {pattern}"
    return msg


def format_errors(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """pydantic errors -> one message naming each field, and the per-field list."""
    items = []
    for e in errors:
        loc = format_loc(tuple(e.get("loc", ())))
        msg = _message(e)
        if msg.startswith(("Value error, ", "Assertion failed, ")):
            msg = msg.split(", ", 1)[1]
            head, sep, rest = msg.partition(": ")
            if sep and head.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum():
                loc, msg = _join(loc, head), rest
        items.append({"field": loc or "body", "message": msg})
    return "; ".join(f"{i['field']}: {i['message']}" for i in items[:10]), items

"""FastAPI dependencies: the transaction-owning session, settings, and request-body parsers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import Discriminator, Tag, TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from reward_models.scoring import Scorer
from service.db import session_scope
from service.errors import BadRequest
from service.schemas import GroupIn, GroupsIn
from service.settings import Settings


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: commit on success, roll back on any error."""
    yield from session_scope(request.app.state.sessionmaker)


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


# scope="function": the transaction commits before the response is sent, so a 2xx means durable
def get_scorer(request: Request) -> Scorer:
    """The in-process worker's Scorer when ``serve`` runs one (one pool, one judge cache for both), else
    the app's own, built on first use."""
    state = request.app.state
    worker = getattr(state, "worker", None)
    if worker is not None and worker.scorer is not None:
        return worker.scorer
    with state.scorer_lock:
        if state.scorer is None:
            s: Settings = state.settings
            state.scorer = Scorer(processes=s.worker_processes, timeout_s=s.component_timeout_s,
                                  memory_mb=s.component_memory_mb)
        return state.scorer


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
ScorerDep = Annotated[Scorer, Depends(get_scorer)]


def format_loc(loc: tuple[Any, ...]) -> str:
    """('body', 'groups', 0, 'loss_mask') -> 'groups[0].loss_mask'."""
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


def format_errors(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """pydantic errors -> one message naming each field, and the per-field list."""
    items = []
    for e in errors:
        loc = format_loc(tuple(e.get("loc", ())))
        msg = str(e.get("msg", "invalid"))
        if msg.startswith(("Value error, ", "Assertion failed, ")):
            msg = msg.split(", ", 1)[1]
            head, sep, rest = msg.partition(": ")
            if sep and head.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum():
                loc, msg = (f"{loc}.{head}" if loc else head), rest
        items.append({"field": loc or "body", "message": msg})
    return "; ".join(f"{i['field']}: {i['message']}" for i in items[:10]), items


def _which(v: Any) -> str:
    return "batch" if isinstance(v, dict) and "groups" in v else "single"


_GROUP_BODY: TypeAdapter[GroupsIn | GroupIn] = TypeAdapter(
    Annotated[Annotated[GroupsIn, Tag("batch")] | Annotated[GroupIn, Tag("single")], Discriminator(_which)]
)


async def group_body(request: Request) -> GroupsIn | GroupIn:
    """Parse ``POST /v1/groups``: one group, or ``{"groups": [...]}``, straight from bytes (pydantic-core)."""
    body = await request.body()
    if not body:
        raise BadRequest("body: empty; expected a group or {\"groups\": [...]}", status_code=400)
    try:
        return _GROUP_BODY.validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise BadRequest(f"body: invalid JSON ({errors[0]['msg']})", status_code=400) from None
        message, items = format_errors(errors)
        raise BadRequest(message, detail=items) from None


GroupBody = Annotated[GroupsIn | GroupIn, Depends(group_body)]

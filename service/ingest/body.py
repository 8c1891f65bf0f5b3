"""The body of ``POST /v1/groups``: one group or a batch, parsed in a worker thread from the document the
request guard already checked, or from an Arrow body (``service.ingest.arrow_body``), which is checked here (a
dependency: the route receives a validated ``GroupIn`` / ``GroupsIn``)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.errors import BadRequest
from service.api.validation import format_errors
from service.api.wire_checks import ARROW_MEDIA_TYPE, WireError, check_content_type, parse_json_body
from service.ingest.arrow_body import decode_groups
from service.ingest.schemas import GroupIn, GroupsIn


def _validate(doc: Any) -> GroupsIn | GroupIn:
    """A body with a ``groups`` key is a batch, anything else one group (no union prefix in errors)."""
    if isinstance(doc, dict) and "groups" in doc:
        return GroupsIn.model_validate(doc, strict=True)
    return GroupIn.model_validate(doc, strict=True)


async def group_body(request: Request) -> GroupsIn | GroupIn:
    """Parse ``POST /v1/groups``: one group, or ``{"groups": [...]}``, from the document the request
    guard already parsed and checked (``service.api.middleware``)."""
    doc = request.scope.get("state", {}).get("json_body", _MISSING)
    if doc is _MISSING:
        body = await request.body()
        if not body:
            raise BadRequest("body: empty; expected a group or {\"groups\": [...]}", status_code=400)
        try:
            if _media(request) == ARROW_MEDIA_TYPE:
                limit = getattr(request.app.state.settings, "max_body_containers", None)
                doc = await run_in_threadpool(decode_groups, body, limit)
            else:
                doc = parse_json_body(body)
        except WireError as exc:
            raise BadRequest(str(exc), status_code=exc.status, detail=[{"field": exc.field, "message": exc.message}]) from None
    try:
        parsed = await run_in_threadpool(_validate, doc)
    except ValidationError as exc:
        message, items = format_errors(exc.errors(include_url=False))
        raise BadRequest(message, detail=items) from None
    limit = getattr(request.app.state.settings, "max_metadata_bytes", None)
    if limit is not None:
        await run_in_threadpool(check_metadata_size, parsed, limit)
    return parsed


def _media(request: Request) -> str:
    try:
        return check_content_type(request.headers.get("content-type"), ("application/json", ARROW_MEDIA_TYPE))
    except WireError as exc:
        raise BadRequest(str(exc), status_code=exc.status) from None


def check_metadata_size(body: GroupsIn | GroupIn, limit: int) -> None:
    """422 naming the first group's or trajectory's ``metadata`` whose JSON is longer than ``limit`` bytes
    (``max_metadata_bytes``): free-form metadata rides along with every read of the group."""
    batched = isinstance(body, GroupsIn)
    for i, g in enumerate(body.groups if batched else [body]):
        where = f"groups[{i}]." if batched else ""
        fields = [(f"{where}metadata", g.metadata)]
        fields += [(f"{where}trajectories[{j}].metadata", t.metadata) for j, t in enumerate(g.trajectories)]
        for field, value in fields:
            if value and len(size := orjson.dumps(value)) > limit:
                raise BadRequest(f"{field}: {len(size)} bytes of JSON, above the limit of {limit} "
                                 "(max_metadata_bytes)", detail=[{"field": field, "message": "too large"}])


_MISSING = object()
GroupBody = Annotated[GroupsIn | GroupIn, Depends(group_body)]

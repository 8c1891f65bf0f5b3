"""Prompts and groups: ingest and read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from filters.types import FinishReason
from service.api.deps import SessionDep, SettingsDep
from service.api.schemas import GROUP_STATUSES, NameQuery, PathId, PolicyVersionQuery, VersionQuery
from service.api.wire_checks import ARROW_MEDIA_TYPE
from service.auth.service import ADMIN, PRODUCER, SERVICE, VIEWER, KeyDep, allow
from service.ingest import groups as group_service
from service.ingest import service as ingest
from service.ingest.body import GroupBody
from service.ingest.schemas import (
    GroupAck,
    GroupIn,
    GroupOut,
    GroupPage,
    GroupsAck,
    GroupsIn,
    PromptsIn,
    UpsertedOut,
)

router = APIRouter(prefix="/v1", tags=["ingest"])

_GROUP_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"oneOf": [{"$ref": "#/components/schemas/GroupIn"}, {"$ref": "#/components/schemas/GroupsIn"}]}
            },
            ARROW_MEDIA_TYPE: {
                "schema": {"type": "string", "format": "binary",
                           "description": "Arrow IPC stream: the JSON body without the trajectories' token arrays in "
                                          "the schema metadata 'grpo_curator.body', the arrays as columns token_ids, "
                                          "loss_mask, logprobs, versions (one row per trajectory); docs/api.md"}
            },
        },
    }
}


@router.post("/prompts", response_model=UpsertedOut, dependencies=[allow(ADMIN)])
def post_prompts(body: PromptsIn, session: SessionDep) -> UpsertedOut:
    return UpsertedOut(upserted=ingest.upsert_prompts(session, body.prompts))


@router.post(
    "/groups",
    response_model=GroupAck | GroupsAck,
    status_code=201,
    openapi_extra=_GROUP_BODY_DOC,
    responses={200: {"description": "already stored with the same body"}, 409: {"description": "id conflict"}},
    dependencies=[allow(PRODUCER, dataset=SERVICE)],
)
def post_groups(
    body: GroupBody, session: SessionDep, settings: SettingsDep, key: KeyDep, response: Response
) -> GroupAck | GroupsAck:
    batched = isinstance(body, GroupsIn)
    groups: list[GroupIn] = body.groups if isinstance(body, GroupsIn) else [body]
    acks = ingest.ingest_groups(
        session,
        groups,
        max_group_size=settings.max_group_size,
        max_sequence_tokens=settings.max_sequence_tokens,
        max_groups=settings.max_groups_per_request,
        batched=batched,
        key=key,
        caller_specs=frozenset(settings.caller_reference_specs),
    )
    if not any(a.created for a in acks):
        response.status_code = 200
    return GroupsAck(groups=acks) if batched else acks[0]


@router.get("/groups/{group_id:path}", response_model=GroupOut, dependencies=[allow(VIEWER, dataset=SERVICE)])
def get_group(
    group_id: PathId,
    session: SessionDep,
    key: KeyDep,
    include_tokens: bool = False,
    spec_version: VersionQuery = None,
) -> GroupOut:
    return group_service.get_group(
        session, group_id, include_tokens=include_tokens, spec_version=spec_version, key=key
    )


@router.get("/groups", response_model=GroupPage, dependencies=[allow(VIEWER, dataset="dataset")])
def list_groups(
    session: SessionDep,
    dataset: NameQuery = None,
    status: Annotated[str | None, Query(pattern="^(" + "|".join(GROUP_STATUSES) + ")$")] = None,
    policy_version: PolicyVersionQuery = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    drop_reason: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    finish_reason: Annotated[FinishReason | None, Query(description="a member ended this way")] = None,
    min_reward: Annotated[float | None, Query(allow_inf_nan=False, description="a member's total >= this")] = None,
    max_reward: Annotated[float | None, Query(allow_inf_nan=False, description="a member's total <= this")] = None,
) -> GroupPage:
    return group_service.list_groups(
        session, dataset=dataset, status=status, policy_version=policy_version, cursor=cursor, limit=limit,
        drop_reason=drop_reason, finish_reason=finish_reason, min_reward=min_reward, max_reward=max_reward,
    )

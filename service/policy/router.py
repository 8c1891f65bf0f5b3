"""Policy versions: the trainer publishes (POST /v1/policy); producers and curation read (GET /v1/policy)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import SessionDep
from service.auth.service import ANY, PRODUCER, TRAINER, VIEWER, KeyDep, allow
from service.policy import service as policy
from service.policy.schemas import PolicyHistory, PolicyIn, PolicyOut

router = APIRouter(prefix="/v1/policy", tags=["policy"])



@router.post(
    "",
    response_model=PolicyOut,
    status_code=201,
    responses={
        200: {"description": "the same version and metrics again"},
        409: {"description": "not the current version + 1 (a trainer key; an admin key may set any higher "
                              "version), or the same version with other metrics"},
    },
    dependencies=[allow(TRAINER)],
)
def publish_policy(body: PolicyIn, session: SessionDep, key: KeyDep, response: Response) -> PolicyOut:
    out, created = policy.publish(session, body, key.name, any_version=key.is_admin)
    if not created:
        response.status_code = 200
    return out


@router.get("", response_model=PolicyOut, dependencies=[allow(PRODUCER, TRAINER, VIEWER, dataset=ANY)])
def get_policy(session: SessionDep) -> PolicyOut:
    return policy.current(session)


@router.get("/history", response_model=PolicyHistory, dependencies=[allow(TRAINER, VIEWER, dataset=ANY)])
def policy_history(session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> PolicyHistory:
    return policy.history(session, limit)

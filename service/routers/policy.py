"""Policy versions: the trainer publishes (POST /v1/policy); producers and curation read (GET /v1/policy)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy.orm import Session

from service.delivery_schemas import PolicyHistory, PolicyIn, PolicyOut
from service.deps import get_session
from service.services import policy

router = APIRouter(prefix="/v1/policy", tags=["policy"])

TxSession = Annotated[Session, Depends(get_session, scope="function")]


@router.post(
    "",
    response_model=PolicyOut,
    status_code=201,
    responses={
        200: {"description": "the same version and metrics again"},
        409: {"description": "not increasing"},
    },
)
def publish_policy(body: PolicyIn, session: TxSession, response: Response) -> PolicyOut:
    out, created = policy.publish(session, body)
    if not created:
        response.status_code = 200
    return out


@router.get("", response_model=PolicyOut)
def get_policy(session: TxSession) -> PolicyOut:
    return policy.current(session)


@router.get("/history", response_model=PolicyHistory)
def policy_history(session: TxSession, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> PolicyHistory:
    return policy.history(session, limit)

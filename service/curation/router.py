"""POST /v1/groups/{group_id}/trajectories/{index}: a producer fills a remedy slot of a waiting group
(resample / resume in place; ``service.curation.remedies``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from service.api.deps import SessionDep, SettingsDep
from service.api.schemas import PathId
from service.auth.service import PRODUCER, SERVICE, KeyDep, allow
from service.curation import service as curation
from service.curation.schemas import SlotFillIn, SlotFillOut

router = APIRouter(prefix="/v1", tags=["curation"])


@router.post(
    "/groups/{group_id:path}/trajectories/{index}",
    response_model=SlotFillOut,
    status_code=201,
    responses={
        200: {"description": "the same replacement again (idempotent): nothing stored twice"},
        404: {"description": "no such group (or outside the key's datasets)"},
        409: {"description": "the slot is not awaiting a replacement, was filled with a different one, or "
                              "request_id names another request"},
        422: {"description": "bad input (naming the field): an index outside the group, a trajectory without "
                              "token arrays, prompt tokens other than its group's, one that does not extend its "
                              "resume checkpoint, token arrays of different lengths"},
    },
    dependencies=[allow(PRODUCER, dataset=SERVICE)],
)
def fill_slot(
    group_id: PathId,
    index: Annotated[str, Path(pattern=r"^(0|[1-9][0-9]{0,4})$", description="the slot: a trajectory index, "
                                "in plain decimal (no sign, leading zero, space or fraction)")],
    body: SlotFillIn,
    session: SessionDep,
    settings: SettingsDep,
    key: KeyDep,
    response: Response,
) -> SlotFillOut:
    out, created = curation.fill_slot(session, group_id, int(index), body.policy_version, body.trajectory,
                                      max_sequence_tokens=settings.max_sequence_tokens, key=key,
                                      request_id=body.request_id)
    if not created:
        response.status_code = 200
    return SlotFillOut(**out)

"""Wire types of the curation domain: a remedy slot's fill (``POST /v1/groups/{group_id}/trajectories/{index}``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from service.api.schemas import INT8_MAX, Int4, Strict
from service.ingest.schemas import TrajectoryIn

Int8Id = Annotated[int, Field(ge=1, le=INT8_MAX)]


class SlotFillIn(Strict):
    """The replacement of one trajectory of a waiting group (a resample / resume request's answer)."""

    policy_version: Int4 = Field(description="the policy version that sampled the replacement (its new tokens)")
    trajectory: TrajectoryIn
    request_id: Int8Id | None = Field(default=None, description="the sampling request this answers (its "
                                      "request_id): a 409 unless it is this slot's open request")


class SlotFillOut(BaseModel):
    group_id: str
    index: int
    reason: str = Field(description="the remedy the slot was asked for: resample | resume")
    request_id: int
    group_status: str = Field(description="received once no slot is left open (scored and curated again)")
    open_slots: int = Field(description="slots of the group still awaited")

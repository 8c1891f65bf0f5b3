"""Wire types of the curation domain: a remedy slot's fill (``POST /v1/groups/{group_id}/trajectories/{index}``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.api.schemas import Int4, Strict
from service.ingest.schemas import TrajectoryIn


class SlotFillIn(Strict):
    """The replacement of one trajectory of a waiting group (a resample / resume request's answer)."""

    policy_version: Int4 = Field(description="the policy version that sampled the replacement (its new tokens)")
    trajectory: TrajectoryIn


class SlotFillOut(BaseModel):
    group_id: str
    index: int
    reason: str = Field(description="the remedy the slot was asked for: resample | resume")
    request_id: int
    group_status: str = Field(description="received once no slot is left open (scored and curated again)")
    open_slots: int = Field(description="slots of the group still awaited")

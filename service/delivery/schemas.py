"""API schemas for batch delivery (DESIGN.md "API v1": /v1/batches).

The lease answer itself is serialised straight from the stored bytes (orjson or Arrow IPC, see
``service.delivery.service``); ``BatchOut`` documents that wire format in OpenAPI and lets tests check it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from filters.segments import SegmentAdvantage
from service.api.schemas import ID_PATTERN, INT4_MAX, MAX_NAME_LENGTH, Strict
from service.api.wire_checks import (
    ARROW_MEDIA_TYPE as ARROW_MEDIA_TYPE,  # the lease's Accept (defined once there)
)

LeaseOrder = Literal["oldest", "freshest"]
LeaseStatus = Literal["active", "acked", "nacked", "expired"]
SizingField = Literal["max_groups", "max_trajectories", "max_tokens"]
SIZING_FIELDS: tuple[SizingField, ...] = ("max_groups", "max_trajectories", "max_tokens")

MAX_LEASE_GROUPS = 8192
MAX_LEASE_TRAJECTORIES = 65_536
# Arrow list<...> offsets are int32: every token of one batch must fit in one column
MAX_LEASE_TOKENS = 2**28
MAX_WAIT_SECONDS = 60.0
MAX_LEASE_SECONDS = 86_400.0


class LeaseIn(Strict):
    """``POST /v1/batches/lease``: exactly one of ``max_groups`` / ``max_trajectories`` / ``max_tokens``.

    ``max_tokens`` counts every token id (prompt and response) of the delivered trajectories.
    """

    trainer_id: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)
    max_groups: int | None = Field(default=None, ge=1, le=MAX_LEASE_GROUPS)
    max_trajectories: int | None = Field(default=None, ge=1, le=MAX_LEASE_TRAJECTORIES)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_LEASE_TOKENS)
    max_staleness: int | None = Field(default=None, ge=0, le=INT4_MAX)
    lease_seconds: float | None = Field(default=None, gt=0, le=MAX_LEASE_SECONDS)
    wait_seconds: float = Field(default=0.0, ge=0, le=MAX_WAIT_SECONDS)
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)
    order: LeaseOrder = "oldest"
    min_groups: int | None = Field(default=None, ge=1, le=MAX_LEASE_GROUPS)
    # only groups every trajectory of which has behaviour log-probs (a trainer that needs them, e.g. one
    # recomputing pi_old from the batch); the others stay in the queue for other trainers
    need_logprobs: bool = False

    @model_validator(mode="after")
    def _one_size(self) -> LeaseIn:
        given = [name for name in SIZING_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"{' | '.join(SIZING_FIELDS)}: exactly one is required (got {got})")
        if self.min_groups is not None and self.max_groups is not None and self.min_groups > self.max_groups:
            raise ValueError(f"min_groups: {self.min_groups} is more than max_groups {self.max_groups}")
        return self

    def sizing(self) -> tuple[SizingField, int]:
        """('max_groups' | 'max_trajectories' | 'max_tokens', limit)."""
        name = next(n for n in SIZING_FIELDS if getattr(self, n) is not None)
        return name, int(getattr(self, name))


class ExtendIn(Strict):
    """``POST /v1/batches/{batch_id}/extend``: the lease's new deadline, counted from now."""

    lease_seconds: float = Field(gt=0, le=MAX_LEASE_SECONDS)


class NackIn(Strict):
    """``POST /v1/batches/{batch_id}/nack`` (body optional): why, and whether the groups are unusable."""

    reason: str | None = Field(default=None, max_length=2000)
    drop: bool = Field(default=False, description="the groups cannot be trained on: drop them, do not redeliver")
    vocab_size: int | None = Field(
        default=None, ge=1, le=2**31 - 1,
        description="with drop: the trainer's vocabulary size; a group with a stored token id >= vocab_size is"
                    " dropped as untrainable (the service checks it; other groups go back to the queue)")


class LeasedSegment(BaseModel):
    segment_index: int
    is_last: bool
    token_ids: list[int] | None
    loss_mask: list[int] | None
    logprobs: list[float] | None
    advantage: float | None = Field(description="this segment's share of the trajectory's advantage")


class LeasedTrajectory(BaseModel):
    index: int
    token_ids: list[int] | None
    loss_mask: list[int] | None
    logprobs: list[float] | None
    versions: list[int] | None = Field(None, description="per-token policy versions (-1: not generated); null: not given")
    advantage: float | None
    total_reward: float | None
    finish_reason: str | None = Field(None, description="the stored finish_reason: stop, length, max_turns, ...")
    rewards: dict[str, float | None] | None = Field(
        None, description="{component: value} of the spec version that scored the group (null value: the"
                          " component errored); null when no component is stored")
    segments: list[LeasedSegment] | None = Field(
        None, description="a segmented trajectory's segments, all in this batch (then null top-level arrays)")
    segment_advantage: SegmentAdvantage | None = Field(
        None, description="a segmented trajectory's curation policy segment_advantage (broadcast, divide,"
                          " discount): the trainer weighs each of its K trained segments 1 for divide (already"
                          " A / K), else 1/K (filters.segments.segment_weight); absent when not segmented")


class LeasedGroup(BaseModel):
    id: str
    prompt_id: str
    policy_version: int
    temperature: float | None = Field(None, description="the group's sampling.temperature; null when not given")
    trajectories: list[LeasedTrajectory]


class BatchStats(BaseModel):
    groups: int
    trajectories: int
    tokens: int
    policy_version: int = Field(description="the trainer's current policy version when the batch was leased")
    order: LeaseOrder
    replayed: bool = Field(description="true when a retried request_id returned an existing lease")
    skipped: int = Field(
        0, description="ready groups passed over: nothing deliverable, or alone over the budget"
    )


class BatchOut(BaseModel):
    """The 200 answer of ``POST /v1/batches/lease`` as JSON (Arrow carries the same in columns)."""

    batch_id: str
    trainer_id: str
    expires_at: str
    groups: list[LeasedGroup]
    stats: BatchStats


class LeaseState(BaseModel):
    """``GET /v1/batches/{batch_id}``, and the answer of ack / nack."""

    batch_id: str
    trainer_id: str
    request_id: str | None
    status: LeaseStatus
    deadline_passed: bool
    groups: list[str]
    n_groups: int
    n_trajectories: int
    n_tokens: int
    policy_version: int | None
    created_at: str
    expires_at: str
    ended_at: str | None

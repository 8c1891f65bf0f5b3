"""Ingest's wire types (pydantic v2): prompts and groups in, groups read back (DESIGN.md's API v1).
Separate from the ORM models; the types every domain shares are in ``service.api.schemas``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from service.api.schemas import (
    FLOAT32_MAX,
    INT4_MAX,
    MAX_MESSAGES,
    FinishReason,
    FreeJson,
    Int4,
    Key,
    Message,
    Name,
    Strict,
)


class PromptIn(FreeJson):
    dataset: Name = "default"
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)
    reference: dict[str, Any] = Field(default_factory=dict)
    reward_spec: Name | None = None
    curation_policy: Name | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class PromptUpsert(PromptIn):
    id: Key


class PromptsIn(Strict):
    prompts: list[PromptUpsert] = Field(min_length=1, max_length=100_000)


class UpsertedOut(BaseModel):
    upserted: int


class TrajectoryIn(FreeJson):
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)
    final_answer: str | None = None
    token_ids: list[Int4] | None = None
    loss_mask: list[Annotated[StrictInt, Field(ge=0, le=1)]] | None = None  # StrictInt: no true/false
    # stored as float32: a finite double beyond its range would become infinity
    logprobs: list[Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]] | None = None
    finish_reason: FinishReason
    num_tokens: Int4 | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lengths(self) -> TrajectoryIn:
        given = {k: len(v) for k in ("token_ids", "loss_mask", "logprobs") if (v := getattr(self, k)) is not None}
        if len(set(given.values())) > 1:
            ref, n = next(iter(given.items()))
            bad = next(k for k, v in given.items() if v != n)
            raise ValueError(f"{bad}: length {given[bad]} differs from {ref} length {n}")
        if self.token_ids is None and (self.loss_mask is not None or self.logprobs is not None):
            raise ValueError("token_ids: required when loss_mask or logprobs is given")
        if self.final_answer is None and not any(m.role == "assistant" for m in self.messages):
            raise ValueError("final_answer: required when there is no assistant message")
        return self

    def resolved_final_answer(self) -> str:
        if self.final_answer is not None:
            return self.final_answer
        for m in reversed(self.messages):
            if m.role == "assistant":
                return m.content if isinstance(m.content, str) else ""
        return ""

    def response_tokens(self) -> int:
        if self.num_tokens is not None:
            return self.num_tokens
        if self.loss_mask is not None:
            return sum(self.loss_mask)
        return len(self.token_ids) if self.token_ids is not None else 0


class GroupIn(FreeJson):
    id: Key
    prompt_id: Key
    policy_version: Int4
    prompt: PromptIn | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    trajectories: list[TrajectoryIn] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("sampling")
    @classmethod
    def _max_tokens(cls, v: dict[str, Any]) -> dict[str, Any]:
        mt = v.get("max_tokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or not 0 < mt <= INT4_MAX):
            raise ValueError(f"sampling.max_tokens: must be an integer from 1 to {INT4_MAX}")
        temp = v.get("temperature")  # the trainer computes log-probs at this temperature
        if temp is not None and not _temperature_ok(temp):
            raise ValueError(
                f"sampling.temperature: must be a number from {TEMPERATURE_MIN:g} to {TEMPERATURE_MAX:g}"
                " (greedy decoding is not a temperature: send the temperature the log-probs were taken at)"
            )
        return v


# The trainer divides fp32 logits by the temperature: 1/T and logits/T must stay finite normal fp32
# numbers (a subnormal T makes 1/T inf and the loss NaN; T below ~1e-38 rounds to 0).
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-4, 1e4


def _temperature_ok(temp: object) -> bool:
    """A JSON number (not a bool) in [TEMPERATURE_MIN, TEMPERATURE_MAX]; an integer of any size compares
    exactly, so 10**400 is refused here instead of reaching the JSON encoder or the ::float8 cast."""
    if isinstance(temp, bool) or not isinstance(temp, int | float):
        return False
    return TEMPERATURE_MIN <= temp <= TEMPERATURE_MAX


class GroupsIn(Strict):
    groups: list[GroupIn] = Field(min_length=1)


class GroupAck(BaseModel):
    id: str
    status: str
    trajectories: int
    created: bool


class GroupsAck(BaseModel):
    groups: list[GroupAck]


class ComponentOut(BaseModel):
    value: float | None
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    latency_ms: float | None = None


class TrajectoryOut(BaseModel):
    index: int
    finish_reason: str
    final_answer: str
    num_tokens: int
    num_turns: int
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    logprobs: list[float] | None = None
    rewards: dict[str, ComponentOut] = Field(default_factory=dict)
    total_reward: float | None = None
    outcome: float | None = None
    advantage: float | None = None
    action: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class DecisionOut(BaseModel):
    index: int | None
    action: str
    rule: str
    reason: str
    policy: str | None
    created_at: str


class GroupOut(BaseModel):
    id: str
    prompt_id: str
    dataset: str
    policy_version: int
    status: str
    drop_reason: str | None
    sampling: dict[str, Any]
    metadata: dict[str, Any]
    reward_spec: str | None
    curation_policy: str | None
    score_error: str | None
    created_at: str
    lease_id: str | None = None
    staleness: int | None = None
    trajectories: list[TrajectoryOut]
    decisions: list[DecisionOut] = Field(default_factory=list)
    prompt_messages: list[dict[str, Any]] | None = Field(
        default=None, description="the prompt's messages (its reference is not shown); None: prompt unknown")


class GroupSummary(BaseModel):
    id: str
    prompt_id: str
    dataset: str
    policy_version: int
    status: str
    drop_reason: str | None
    n_trajectories: int
    n_tokens: int
    created_at: str
    mean_reward: float | None = Field(default=None, description="mean total reward of its scored members")


class GroupPage(BaseModel):
    groups: list[GroupSummary]
    next_cursor: str | None



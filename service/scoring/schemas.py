"""Wire schemas of the scoring routes: synchronous scoring and OpenRLHF's remote reward protocol."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from service.api.schemas import FinishReason, FreeJson, Message, Strict


class ScoreItem(FreeJson):
    """One prompt + completion to score. Strings become one user / one assistant message."""

    prompt: str | list[Message]
    completion: str | list[Message]
    reference: dict[str, Any] = Field(default_factory=dict)
    dataset: str = Field(default="default", min_length=1, max_length=256)
    finish_reason: FinishReason = "stop"
    num_tokens: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreIn(Strict):
    reward_spec: str = Field(min_length=1, max_length=300)
    items: list[ScoreItem] = Field(min_length=1)
    store: bool = False
    policy_version: int = Field(default=0, ge=0)


class ComponentScore(BaseModel):
    value: float | None
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class ScoreResult(BaseModel):
    total: float | None
    outcome: float | None
    rewards: dict[str, ComponentScore]


class ScoreOut(BaseModel):
    spec_name: str
    spec_version: int
    results: list[ScoreResult]
    stored_groups: list[str] | None = None


class OpenRLHFIn(BaseModel):
    """OpenRLHF's remote reward-model request (extra keys it may add are ignored)."""

    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None


class OpenRLHFOut(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]]

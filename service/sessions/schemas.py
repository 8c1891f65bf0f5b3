"""Sessions' wire types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from service.api.schemas import FinishReason, FreeJson, Int4, Key, Strict
from service.ingest.schemas import PromptIn


class SessionIn(FreeJson):
    group_id: Key
    group_size: Int4 = Field(ge=1)
    policy_version: Int4
    prompt_id: Key | None = None
    prompt: PromptIn | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _prompt(self) -> SessionIn:
        if self.prompt_id is None:
            raise ValueError("prompt_id: required (with an inline 'prompt' to create it)")
        return self


class SessionCreated(BaseModel):
    session_id: str
    base_url: str = Field(description="point an OpenAI client here: POST {base_url}/chat/completions")
    api_key: str = Field(description="valid for this session only; shown once")


class FinishIn(Strict):
    finish_reason: FinishReason | None = None
    final_answer: str | None = Field(default=None, max_length=1_000_000)
    rewards: dict[str, float] = Field(default_factory=dict, max_length=64)
    error: str | None = Field(default=None, max_length=10_000)


class CallOut(BaseModel):
    index: int
    kind: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int
    policy_version: int | None
    error: str | None
    misuse: str | None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    created_at: str


class SessionOut(BaseModel):
    session_id: str
    group_id: str
    group_size: int
    prompt_id: str
    policy_version: int
    status: str
    finish_reason: str | None
    final_answer: str | None
    error: str | None
    misuse: str | None
    n_calls: int
    n_tokens: int
    created_at: str
    finished_at: str | None
    ingested: bool
    calls: list[CallOut]


class FinishOut(BaseModel):
    session_id: str
    status: str
    finish_reason: str
    group_ingested: bool = Field(description="this finish completed the group, which was posted for scoring")

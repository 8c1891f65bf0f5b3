"""Sessions' wire types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from service.api.schemas import FinishReason, FreeJson, Int4, Key, Strict
from service.ingest.schemas import PromptIn


class ResumeIn(Strict):
    """The resume slot a session continues (``GET /v1/sampling/requests`` -> ``reason: "resume"``)."""

    group_id: Key
    index: Int4 = Field(le=32_767)


class SessionIn(FreeJson):
    group_id: Key | None = None
    group_size: Int4 | None = Field(default=None, ge=1)
    policy_version: Int4
    prompt_id: Key | None = None
    prompt: PromptIn | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    resume: ResumeIn | None = Field(default=None, description="continue a cut member from its checkpoint; its "
                                                              "group fixes group_id, group_size and the prompt")

    @model_validator(mode="after")
    def _prompt(self) -> SessionIn:
        if self.resume is not None:
            given = [f for f in ("group_id", "group_size", "prompt_id", "prompt") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{given[0]}: leave it out of a resume session (the slot's group fixes it)")
            return self
        if self.group_id is None:
            raise ValueError("group_id: required (or 'resume' to continue a cut member)")
        if self.group_size is None:
            raise ValueError("group_size: required (or 'resume' to continue a cut member)")
        if self.prompt_id is None:
            raise ValueError("prompt_id: required (with an inline 'prompt' to create it)")
        return self


class SessionCreated(BaseModel):
    session_id: str
    base_url: str = Field(description="point an OpenAI client here: POST {base_url}/chat/completions")
    api_key: str = Field(description="valid for this session only; shown once")
    checkpoint: dict[str, Any] | None = Field(
        default=None, description="a resume session: the state it continues (messages, token_ids, loss_mask, "
                                  "logprobs, versions); the first call's prompt ids must extend token_ids")


class FinishIn(Strict):
    finish_reason: FinishReason | None = Field(
        default=None, description="checked against the session's record: a cut (length, max_turns) or an "
                                  "environment failure it contradicts is a 422 naming finish_reason (docs/agents.md)")
    final_answer: str | None = Field(default=None, max_length=1_000_000)
    rewards: dict[str, float] = Field(default_factory=dict, max_length=64)
    error: str | None = Field(default=None, max_length=10_000)


class SegmentOut(BaseModel):
    session_id: str
    marks: int = Field(description="the session's segment marks so far (its trajectory has at least marks + 1 "
                                   "segments once a call follows the last)")
    marked: bool = Field(description="false: no call was answered since the last mark (or the start), nothing "
                                     "changed")


class CallOut(BaseModel):
    index: int
    kind: str = Field(description="chat | completions | segment (the agent's segment mark: no tokens)")
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
    group_ingested: bool = Field(description="this finish completed the group, which was posted for scoring "
                                             "(a resume session: its slot was filled)")

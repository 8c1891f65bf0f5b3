"""Wire schemas of the scoring routes: synchronous scoring and OpenRLHF's remote reward protocol."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from reward_models.agent_rules import tool_schemas
from reward_models.text import json_depth_exceeds
from service.api.schemas import FinishReason, FreeJson, Message, Strict, check_finite

MAX_TOOLS = 128  # tool definitions per item
MAX_TOOL_DEPTH = 32  # nesting of one item's tool definitions


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
    # the prompt's tool definitions (OpenAI format): what rule.tool_calls reads as prompt.metadata.tools
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if tools is not None:
            check_finite(tools, "tools")
            if json_depth_exceeds(tools, MAX_TOOL_DEPTH):
                raise ValueError(f"tools: nested deeper than {MAX_TOOL_DEPTH} levels")
            tool_schemas(tools)  # ValueError naming tools[i]: a function name and a valid parameters schema
        return tools


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
    extra_logs: dict[str, list[float]] | None = None  # left out with openrlhf_extra_logs=omit (OpenRLHF 0.8)
    # the queries (indices into this request) whose reward is the substitute (openrlhf_on_error=value), in
    # every mode, omit included: OpenRLHF reads only the three keys above, the reward-function file reads this
    substituted: list[int] = Field(default_factory=list)

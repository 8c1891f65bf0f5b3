"""Wire schemas of export (``GET /v1/export``) and of what ``grpo-curator import`` reports."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from service.api.schemas import Strict

ExportFormat = Literal["sft", "dpo", "kto", "rollouts", "verl"]
EXPORT_FORMATS: tuple[str, ...] = ("sft", "dpo", "kto", "rollouts", "verl")
FileType = Literal["jsonl", "parquet"]
# tool-call arguments: JSON objects (what TRL's qwen2_5 / llama3_1 chat templates need), or the stored text
ToolArguments = Literal["object", "string"]


class ExportQuery(Strict):
    """Which rows an export takes. ``statuses`` default: every group that was scored."""

    format: ExportFormat
    dataset: str | None = None
    min_policy_version: int | None = Field(default=None, ge=0, le=2**31 - 1)  # policy versions are int4
    max_policy_version: int | None = Field(default=None, ge=0, le=2**31 - 1)
    statuses: list[str] | None = None
    min_reward: float | None = Field(default=None, allow_inf_nan=False)
    correct_threshold: float = Field(default=1.0, allow_inf_nan=False)
    limit: int | None = Field(default=None, ge=1)
    tool_arguments: ToolArguments = "object"
    include_archived: bool = False  # also the archived groups' rows (service.archive), after the hot ones


class ImportSummary(BaseModel):
    taken: int
    rejected: int
    reasons: dict[str, int]
    examples: list[str]



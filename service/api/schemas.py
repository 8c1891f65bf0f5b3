"""Wire types every domain shares (pydantic v2): the limits of the wire, ids and names, strict bodies,
chat messages, and the one error body. Each domain's own request / response types are in its ``schemas.py``."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from filters.types import DEPRECATED_FINISH_REASONS, normalize_finish_reason
from filters.types import FinishReason as CurationFinishReason
from reward_models.spec import NAME_PATTERN as SPEC_NAME_PATTERN

# the one list of finish reasons (filters.types); deprecated names (tool_error) are read as their new one
# on the wire the deprecated names are listed too (a client generated from the OpenAPI document may still send
# them) and read as their new one
if TYPE_CHECKING:  # a Literal built at run time is no static type; a validated field holds a current name
    FinishReason = CurationFinishReason
else:
    _WireFinishReason = Literal[(*get_args(CurationFinishReason), *DEPRECATED_FINISH_REASONS)]
    FinishReason = Annotated[_WireFinishReason, AfterValidator(normalize_finish_reason)]
Role = Literal["system", "user", "assistant", "tool", "developer"]
GROUP_STATUSES = ("received", "scored", "ready", "dropped", "leased", "consumed", "reward_error", "curation_error",
                  "waiting")

# Limits of the wire (docs/errors.md). Integers that reach an int4 column are bounded by INT4_MAX; any
# integer anywhere in a body must fit int64 and any string must be storable (service.api.wire_checks).
INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
MAX_ID_LENGTH = 512
MAX_NAME_LENGTH = 256
MAX_MESSAGES = 16_384  # per trajectory; turns are counted in a smallint
MAX_RESCORE_IDS = 10_000  # group_ids of one rescore/recurate (sent as one array parameter)
# ids and names: any characters except control characters (slashes, spaces, '#', '%' ... included)
ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
PATTERN_WORDS = {
    ID_PATTERN: "any characters except control characters (U+0000-U+001F, U+007F-U+009F)",
    SPEC_NAME_PATTERN: "any characters except '@' and control characters (U+0000-U+001F, U+007F-U+009F)",
}

Key = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)]
Int4 = Annotated[int, Field(ge=0, le=INT4_MAX)]
# path and query parameters (a path id may contain '/', sent percent-encoded or as is)
PathId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]
PathName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)]
VersionQuery = Annotated[int | None, Query(ge=1, le=INT4_MAX)]
PolicyVersionQuery = Annotated[int | None, Query(ge=0, le=INT4_MAX)]
NameQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH, pattern=ID_PATTERN)]


def check_finite(value: Any, path: str = "") -> None:
    """Reject NaN / inf anywhere inside free-form JSON (metadata, reference, details)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path or 'value'}: NaN and infinity are not allowed")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite(v, f"{path}[{i}]")


class Strict(BaseModel):
    """Request bodies: unknown fields rejected, no NaN / inf, no coercion ("3" is not an integer)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class FreeJson(Strict):
    """Base for models with free-form dict fields that must still be finite JSON."""

    @model_validator(mode="after")
    def _finite(self) -> FreeJson:
        # only the fields this model has: getattr(self, absent, None) goes through pydantic's __getattr__ and an
        # AttributeError each time (7 % of an ingest worker's CPU, a few per trajectory)
        for name in _free_fields(type(self)):
            value = getattr(self, name)
            if value is not None:
                check_finite(value, name)
        return self


@functools.cache
def _free_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The free-form fields ``FreeJson`` checks that ``model`` declares."""
    return tuple(n for n in ("metadata", "reference", "sampling", "metrics", "params") if n in model.model_fields)


class ToolFunction(Strict):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(Strict):
    id: str | None = None
    type: str = "function"
    function: ToolFunction


class Message(Strict):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    role: Role
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class ErrorItem(BaseModel):
    field: str = Field(description="where, as the request wrote it: 'groups[0].policy_version', 'query.version'")
    message: str


class ErrorOut(BaseModel):
    """Every 4xx / 5xx answer: ``error`` is one line naming each field; ``detail`` is per field (or
    route-specific, e.g. the conflicting id), or null."""

    error: str
    detail: list[ErrorItem] | dict[str, Any] | None = None

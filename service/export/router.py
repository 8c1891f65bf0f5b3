"""GET /v1/export: stored trajectories as SFT / DPO / KTO / rollout datasets, streamed (JSONL or Parquet)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from service.api.deps import SettingsDep
from service.api.errors import BadRequest
from service.api.validation import format_errors
from service.auth.service import VIEWER, allow
from service.export import service as export
from service.export.schemas import ExportFormat, ExportQuery, FileType, ToolArguments

router = APIRouter(prefix="/v1", tags=["export"])


class ExportResponse(StreamingResponse):
    """A streamed export that gives its slot back the moment the response ends, however it ends (done, the
    client gone, the server shutting down): not whenever the garbage collector gets to it."""

    def __init__(self, chunks: Iterator[bytes], **kwargs: Any) -> None:
        super().__init__(chunks, **kwargs)
        self.chunks = chunks  # the guarded iterator (the body iterator wraps it for the threadpool)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()


def export_query(
    format: ExportFormat,
    dataset: str | None = None,
    min_policy_version: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,  # policy versions are int4
    max_policy_version: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    status: Annotated[list[str] | None, Query(description="group statuses (repeat); default: every scored one")] = None,
    min_reward: float | None = None,
    correct_threshold: float = 1.0,
    limit: Annotated[int | None, Query(ge=1)] = None,
    tool_arguments: Annotated[ToolArguments, Query(
        description="tool-call arguments as JSON objects (TRL's chat templates need them) or as the stored "
                    "JSON text")] = "object",
    include_archived: Annotated[bool, Query(
        description="also the archived groups (grpo-curator archive), read back from their Parquet files")] = False,
) -> ExportQuery:
    try:
        return ExportQuery(format=format, dataset=dataset, min_policy_version=min_policy_version,
                           max_policy_version=max_policy_version, statuses=status, min_reward=min_reward,
                           correct_threshold=correct_threshold, limit=limit, tool_arguments=tool_arguments,
                           include_archived=include_archived)
    except ValidationError as exc:
        message, items = format_errors(exc.errors(include_url=False))
        raise BadRequest(message, detail=items) from None


@router.get("/export", response_class=StreamingResponse, dependencies=[allow(VIEWER, dataset="dataset")],
            responses={200: {"content": {"application/x-ndjson": {}, "application/vnd.apache.parquet": {}}},
                       429: {"description": "export_max_concurrent exports are streaming; retry after Retry-After "
                                            "seconds"}})
def get_export(request: Request, q: Annotated[ExportQuery, Depends(export_query)], settings: SettingsDep,
               filetype: FileType = "jsonl") -> StreamingResponse:
    chunks = export.stream(request.app.state.sessionmaker, q, filetype, settings.export_batch_rows,
                           settings.export_batch_bytes)
    chunks = request.app.state.export_slots.guard(chunks)  # 429 + Retry-After beyond export_max_concurrent
    name = f"{q.format}.{filetype}"
    return ExportResponse(chunks, media_type=export.MEDIA_TYPES[filetype],
                          headers={"content-disposition": f'attachment; filename="{name}"'})

"""GET /v1/sampling/requests (what producers should sample next) and POST /v1/sampling/requests/done.

The session is function-scoped: a claim is committed before the answer is sent, so a producer never
works on requests that another producer could still take.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import SessionDep
from service.api.schemas import INT8_MAX, NameQuery
from service.auth.service import PRODUCER, SERVICE, KeyDep, allow
from service.sampling import service as sampling

router = APIRouter(prefix="/v1/sampling", tags=["sampling"])



class PromptBody(BaseModel):
    messages: list[Any]
    metadata: dict[str, Any]
    reference: dict[str, Any] | None = None


class SamplingRequestOut(BaseModel):
    request_id: int | None = Field(description="null in a peek of a new / curriculum pick")
    prompt_id: str
    dataset: str
    reason: Literal["resample", "resume", "refill", "new", "curriculum"]
    n: int = Field(description="group size to sample")
    budget: dict[str, Any] = Field(description="sampling params (max_tokens, temperature ...); {} = yours")
    priority: float
    prompt: PromptBody
    expires_at: str | None = Field(description="when a claim lapses unless marked done")
    group_id: str | None = Field(None, description="resample / resume in place: the group whose slot this fills "
                                                   "(POST /v1/groups/{group_id}/trajectories/{index})")
    index: int | None = Field(None, description="resample / resume in place: the trajectory slot it fills")
    checkpoint: dict[str, Any] | None = Field(
        None, description="resume: the state to continue from (messages, token_ids, loss_mask, logprobs, versions)")


class SamplingRequestsOut(BaseModel):
    requests: list[SamplingRequestOut]


class DoneIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    request_ids: list[Annotated[int, Field(ge=1, le=INT8_MAX)]] = Field(min_length=1, max_length=10_000)


class DoneOut(BaseModel):
    done: list[int]
    unknown: list[int]


@router.get("/requests", response_model=SamplingRequestsOut, dependencies=[allow(PRODUCER, dataset="dataset")])
def get_requests(
    session: SessionDep,
    n: Annotated[int, Query(ge=1, le=1000)] = 10,
    producer_id: Annotated[
        str | None, Query(min_length=1, max_length=256, description="claim (else peek)")
    ] = None,
    dataset: NameQuery = None,
    lease_seconds: Annotated[float, Query(gt=0, le=7 * 86_400)] = sampling.DEFAULT_LEASE_SECONDS,
    group_size: Annotated[int, Query(ge=1, le=1024, description="n of a prompt never sampled")] = 8,
    include_reference: bool = False,
) -> SamplingRequestsOut:
    return SamplingRequestsOut.model_validate(
        sampling.next_requests(
            session,
            n,
            producer_id=producer_id,
            dataset=dataset,
            lease_seconds=lease_seconds,
            group_size=group_size,
            include_reference=include_reference,
        )
    )


@router.post("/requests/done", response_model=DoneOut, dependencies=[allow(PRODUCER, dataset=SERVICE)])
def post_done(body: DoneIn, session: SessionDep, key: KeyDep) -> DoneOut:
    return DoneOut(**sampling.mark_done(session, body.request_ids, key.datasets))

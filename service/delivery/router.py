"""Batch delivery: POST /v1/batches/lease (JSON or Arrow IPC), /{batch_id}/ack, /nack, /extend, GET /{batch_id}.

The session is function-scoped: its transaction commits before the answer is sent, so a trainer never
holds a batch (or an ack) that was not stored.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from service.alerts.schemas import LeasePausedOut
from service.api.deps import SessionDep, SettingsDep
from service.auth.service import SERVICE, TRAINER, VIEWER, KeyDep, allow
from service.delivery import service as leases
from service.delivery.arrow import BatchColumns, encode_arrow, encode_json
from service.delivery.schemas import ARROW_MEDIA_TYPE, BatchOut, ExtendIn, LeaseIn, LeaseState, NackIn

router = APIRouter(prefix="/v1/batches", tags=["batches"])

BatchId = Annotated[str, Path(min_length=1, max_length=256)]

_LEASE_RESPONSES: dict[int | str, dict] = {
    200: {
        "model": BatchOut,
        "description": f"a batch, as JSON or (Accept: {ARROW_MEDIA_TYPE}) an Arrow IPC stream, one row per trajectory",
        "content": {ARROW_MEDIA_TYPE: {}},
    },
    204: {"description": "nothing became ready within wait_seconds"},
    409: {"description": "request_id belongs to a lease that is no longer active, or to another trainer"},
    429: {"description": "too many lease requests already wait in this process; retry after Retry-After seconds"},
    503: {
        "model": LeasePausedOut,
        "description": "leasing is paused: a monitor whose action is pause_leases is critical for every dataset or"
        " for one this lease could hold (detail.alert is the alert, detail.retry_after_s when to ask again;"
        " nothing was leased; docs/alerts.md), or the database is unavailable (detail null); retry after"
        " Retry-After seconds",
        "headers": {"Retry-After": {"description": "seconds to wait before asking again (alert_retry_after_s while"
                                    " paused)", "schema": {"type": "integer"}}},
    },
}


def _render(batch: BatchColumns, accept: str) -> Response:
    headers = {"X-Batch-Id": batch.batch_id, "X-Expires-At": batch.expires_at}
    if ARROW_MEDIA_TYPE in accept:
        return Response(encode_arrow(batch), media_type=ARROW_MEDIA_TYPE, headers=headers)
    return Response(encode_json(batch), media_type="application/json", headers=headers)


@router.post("/lease", response_class=Response, responses=_LEASE_RESPONSES, dependencies=[allow(TRAINER, dataset=SERVICE)])
async def lease_batch(
    body: LeaseIn, request: Request, session: SessionDep, settings: SettingsDep, key: KeyDep
) -> Response:
    batch = await leases.lease(
        session,
        body,
        default_lease_seconds=settings.lease_seconds_default,
        disconnected=request.is_disconnected,
        hub=request.app.state.ready_hub,
        retry_after_s=settings.lease_retry_after_s,
        key=key,
    )
    if batch is None:
        return Response(status_code=204)
    return await run_in_threadpool(_render, batch, request.headers.get("accept", ""))


@router.post(
    "/{batch_id}/ack",
    response_model=LeaseState,
    responses={404: {}, 409: {"description": "fenced"}},
    dependencies=[allow(TRAINER, dataset=SERVICE)],
)
def ack_batch(batch_id: BatchId, session: SessionDep, key: KeyDep) -> LeaseState:
    return leases.ack(session, batch_id, key)


@router.post("/{batch_id}/nack", response_model=LeaseState, responses={404: {}, 409: {}}, dependencies=[allow(TRAINER, dataset=SERVICE)])
def nack_batch(batch_id: BatchId, session: SessionDep, key: KeyDep, body: NackIn | None = None) -> LeaseState:
    body = body or NackIn()
    return leases.nack(session, batch_id, body.reason, body.drop, key=key, vocab_size=body.vocab_size)


@router.post(
    "/{batch_id}/extend",
    response_model=LeaseState,
    responses={404: {}, 409: {"description": "ended"}},
    dependencies=[allow(TRAINER, dataset=SERVICE)],
)
def extend_batch(batch_id: BatchId, body: ExtendIn, session: SessionDep, key: KeyDep) -> LeaseState:
    return leases.extend(session, batch_id, body.lease_seconds, key=key)


@router.get("/{batch_id}", response_model=LeaseState, responses={404: {}}, dependencies=[allow(TRAINER, VIEWER, dataset=SERVICE)])
def get_batch(batch_id: BatchId, session: SessionDep, key: KeyDep) -> LeaseState:
    return leases.state(session, batch_id, key)

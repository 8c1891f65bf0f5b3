"""The webhook outbox: alert transitions posted to the deployment's webhook (``alert_webhook_url``) as
Slack-compatible JSON (``{"text": ..., "alert": ...}``; Slack reads ``text``, other receivers the rest).

Durable: a transition row is stored with ``notified_at`` NULL in the transaction that makes it (nothing is
announced that was rolled back, nothing committed is forgotten by a kill -9) and the worker posts the
pending rows, oldest first, on every maintenance pass (``deliver_due``). At least once: each post carries
the transition's idempotency key (``alert-transition-<pk>``, in the body and the ``Idempotency-Key``
header), so a receiver that dedupes by it sees each transition once even when a crash between the post and
its commit sends it again. A failed post waits a backoff (``notify_after``) and the pass stops there: a hung
receiver costs one timeout per backoff, never the queue behind it for good; after
``alert_webhook_retries`` failed tries a transition is logged and given up (its row keeps the record).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.settings import Settings, get_settings
from service.store.models import Alert, AlertTransition

log = logging.getLogger(__name__)
BACKOFF_S = 0.5
BACKOFF_MAX_S = 300.0
TIMEOUT_S = 5.0
BATCH = 100


def idempotency_key(pk: int) -> str:
    return f"alert-transition-{pk}"


def message(t: AlertTransition, a: Alert) -> dict[str, Any]:
    """The payload of one stored transition: its own version, value and reason (a resolve says how it
    resolved, not the value that opened the alert)."""
    scope = "overall" if a.dataset is None else f"dataset {a.dataset}"
    head = f"[{t.to_state.upper()}] {a.monitor} ({scope}): {t.from_state} -> {t.to_state} at policy version {t.version}"
    if t.reason != "monitor":
        tail = f"by {t.reason}"
    elif t.to_state == "resolved":
        tail = f"value now {t.value}, below the resolve line under warning"
    else:
        tail = f"value {t.value}, threshold {a.threshold}"
    key = idempotency_key(t.pk)
    alert = {"id": a.id, "monitor": a.monitor, "dataset": a.dataset, "state": t.to_state, "value": t.value,
             "threshold": a.threshold}
    return {"text": f"{head}; {tail}", "alert": alert, "from": t.from_state, "to": t.to_state,
            "version": t.version, "reason": t.reason, "transition_id": t.pk, "idempotency_key": key}


def pending_mark(settings: Settings | None = None) -> Any:
    """``notified_at`` of a new transition row: NULL (pending) with a webhook configured, else now."""
    return None if (settings or get_settings()).alert_webhook_url else func.now()


def deliver_due(session: Session, settings: Settings | None = None) -> int:
    """Post the pending transitions that are due, oldest first; the number delivered. Rows are locked
    (SKIP LOCKED: two workers never post the same row at once); the caller commits."""
    settings = settings or get_settings()
    if not settings.alert_webhook_url:
        return 0
    now = session.execute(select(func.clock_timestamp())).scalar_one()
    stmt = (
        select(AlertTransition, Alert).join(Alert, Alert.id == AlertTransition.alert_id)
        .where(AlertTransition.notified_at.is_(None))
        .where(AlertTransition.notify_after.is_(None) | (AlertTransition.notify_after <= now))
        .order_by(AlertTransition.pk).limit(BATCH).with_for_update(of=AlertTransition, skip_locked=True)
    )
    delivered = 0
    for t, a in session.execute(stmt).all():
        payload = message(t, a)
        ok = _post(settings.alert_webhook_url, payload)
        if ok:
            t.notified_at, delivered = now, delivered + 1
            continue
        t.notify_attempts += 1
        if t.notify_attempts > settings.alert_webhook_retries:
            t.notified_at = now
            log.error("alert webhook: gave up on transition %d after %d tries: %s", t.pk, t.notify_attempts,
                      payload["text"])
        else:
            t.notify_after = now + timedelta(seconds=min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (t.notify_attempts - 1)))
        break  # the receiver is failing: the rest wait for the next pass
    session.flush()
    return delivered


def _post(url: str, payload: dict[str, Any]) -> bool:
    try:
        r = httpx.post(url, json=payload, timeout=TIMEOUT_S, headers={"Idempotency-Key": payload["idempotency_key"]})
    except httpx.HTTPError as exc:
        log.warning("alert webhook: %s failed: %s", url, exc.__class__.__name__)
        return False
    if r.status_code >= 300:
        log.warning("alert webhook: %s answered %d", url, r.status_code)
    return r.status_code < 300

"""Posts alert transitions to the deployment's webhook (``alert_webhook_url``) as Slack-compatible JSON
(``{"text": ..., "alert": ...}``; Slack reads ``text``, other receivers the structured part).

Transitions are queued after their transaction commits (nothing is announced that was rolled back) and
posted by one daemon thread per process, each retried ``alert_webhook_retries`` times with exponential
backoff: a slow or dead webhook never blocks ingest, leasing or the evaluation itself. A transition still
undelivered after its retries is logged and dropped (the alert rows stay the durable record).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import httpx
from sqlalchemy import event
from sqlalchemy.orm import Session

from service.settings import get_settings

log = logging.getLogger(__name__)
BACKOFF_S = 0.5
BACKOFF_MAX_S = 30.0


def message(change: dict[str, Any]) -> dict[str, Any]:
    a = change["alert"]
    scope = "overall" if a["dataset"] is None else f"dataset {a['dataset']}"
    text = (f"[{change['to'].upper()}] {a['monitor']} ({scope}): {change['from']} -> {change['to']} at policy "
            f"version {change['version']}; value {a['value']}, threshold {a['threshold']}")
    return {"text": text, "alert": a, "from": change["from"], "to": change["to"], "version": change["version"]}


class WebhookNotifier:
    def __init__(self, url: str, retries: int = 5, backoff_s: float = BACKOFF_S, timeout_s: float = 5.0) -> None:
        self.url, self.retries, self.backoff_s, self.timeout_s = url, retries, backoff_s, timeout_s
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=10_000)
        self.delivered = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, name="alert-webhook", daemon=True)
        self.thread.start()

    def post(self, change: dict[str, Any]) -> None:
        """Queue one transition; never blocks (a full queue drops it, logged)."""
        try:
            self.queue.put_nowait(message(change))
        except queue.Full:
            self.dropped += 1
            log.error("alert webhook: queue full; transition dropped: %s", change.get("alert", {}).get("id"))

    def _send(self, payload: dict[str, Any]) -> bool:
        for attempt in range(self.retries + 1):
            try:
                r = httpx.post(self.url, json=payload, timeout=self.timeout_s)
                if r.status_code < 300:
                    return True
                log.warning("alert webhook: %s answered %d (attempt %d)", self.url, r.status_code, attempt + 1)
            except httpx.HTTPError as exc:
                log.warning("alert webhook: %s failed: %s (attempt %d)", self.url, exc.__class__.__name__, attempt + 1)
            time.sleep(min(BACKOFF_MAX_S, self.backoff_s * 2**attempt))
        return False

    def _run(self) -> None:
        while True:
            payload = self.queue.get()
            if self._send(payload):
                self.delivered += 1
            else:
                self.dropped += 1
                log.error("alert webhook: gave up on %s", payload["text"])


_notifiers: dict[str, WebhookNotifier] = {}
_lock = threading.Lock()


def get_notifier(url: str, retries: int) -> WebhookNotifier:
    with _lock:
        if url not in _notifiers:
            _notifiers[url] = WebhookNotifier(url, retries)
        return _notifiers[url]


def notify_after_commit(session: Session, changes: list[dict[str, Any]]) -> None:
    """Post ``changes`` once ``session`` commits (nothing when no webhook is configured)."""
    settings = get_settings()
    if not changes or not settings.alert_webhook_url:
        return
    notifier = get_notifier(settings.alert_webhook_url, settings.alert_webhook_retries)

    @event.listens_for(session, "after_commit", once=True)
    def _posted(_: Session) -> None:
        for change in changes:
            notifier.post(change)

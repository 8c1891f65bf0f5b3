"""The trainer's side of batch delivery: lease, heartbeat, refuse, ack — every call retried.

Crash safety (see docs/operations.md): a batch is acked only once the update it fed is durable, i.e. once
a checkpoint that contains that update is written. Until then its lease is kept alive by a heartbeat
thread (``POST /v1/batches/{id}/extend`` every ``lease_seconds / 3``). A trainer killed at any point
therefore loses nothing: the leases of the batches trained since its last checkpoint stop being extended,
expire, and the groups are delivered again — to the resumed trainer, which restarts from that checkpoint.
Without a checkpoint directory nothing is durable and a batch is acked right after its step.

Every call goes through ``service.client.retry`` (transient errors: connection failures, 5xx); a lease
carries a ``request_id``, so a lease whose answer was lost comes back instead of a second one.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Protocol

from service.schemas import TEMPERATURE_MAX, TEMPERATURE_MIN

log = logging.getLogger(__name__)

RETRIES = 8
BACKOFF_S = 0.2


class DeliveryClient(Protocol):
    """The part of `service.client.CuratorClient` the trainer uses."""

    def lease(self, trainer_id: str, **kwargs: Any) -> dict[str, Any] | None: ...
    def ack(self, batch_id: str) -> dict[str, Any]: ...
    def nack(self, batch_id: str, *, reason: str | None = None, drop: bool = False) -> dict[str, Any]: ...
    def extend(self, batch_id: str, lease_seconds: float) -> dict[str, Any]: ...
    def publish_policy(self, version: int, metrics: dict[str, Any]) -> dict[str, Any]: ...
    def get_policy(self) -> dict[str, Any]: ...


def _retry(fn: Any, what: str) -> Any:
    from service.client import retry

    return retry(fn, retries=RETRIES, backoff_s=BACKOFF_S, what=what)


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def lease_batch(client: DeliveryClient, trainer_id: str, **kwargs: Any) -> dict[str, Any] | None:
    """One lease, retried with the same request_id (a new one if that lease already ended: 409)."""
    from service.client import CuratorError

    request_id = uuid.uuid4().hex

    def attempt() -> dict[str, Any] | None:
        nonlocal request_id
        try:
            return client.lease(trainer_id, request_id=request_id, **kwargs)
        except CuratorError as exc:
            if exc.status_code != 409:
                raise
            request_id = uuid.uuid4().hex
            return client.lease(trainer_id, request_id=request_id, **kwargs)

    return _retry(attempt, "lease")


def ack_batches(client: DeliveryClient, batch_ids: list[str]) -> int:
    """Ack each batch -> how many the service refused (409: the lease had expired and was re-leased, so
    another trainer consumes those groups; this one trained them too — never lost, at worst twice)."""
    from service.client import CuratorError

    refused = 0
    for batch_id in batch_ids:
        try:
            _retry(lambda b=batch_id: client.ack(b), "ack")
        except CuratorError as exc:
            if exc.status_code != 409:
                raise
            log.warning("ack of batch %s refused: %s", batch_id, exc)
            refused += 1
    return refused


def refuse(client: DeliveryClient, batch: dict[str, Any], reason: str) -> None:
    """Nack a batch this trainer cannot use, dropping its groups (they would poison every trainer)."""
    log.error("batch %s refused: %s", batch["batch_id"], reason)
    _retry(lambda: client.nack(batch["batch_id"], reason=reason[:2000], drop=True), "nack")


def unusable(batch: dict[str, Any], need_logprobs: bool) -> str | None:
    """Why this trainer cannot train on ``batch``, or None."""
    for group in batch.get("groups", []):
        for t in group.get("trajectories", []):
            where = f"group {group.get('id')!r} trajectory {t.get('index')}"
            tokens, mask, logprobs = t.get("token_ids"), t.get("loss_mask"), t.get("logprobs")
            if tokens is None or len(tokens) == 0 or mask is None:
                return f"{where}: no token_ids / loss_mask"
            if len(mask) != len(tokens) or (logprobs is not None and len(logprobs) != len(tokens)):
                return f"{where}: token_ids, loss_mask, logprobs differ in length"
            if need_logprobs and logprobs is None:
                return f"{where}: no behaviour logprobs (old_from_batch needs them)"
            if t.get("advantage") is None:
                return f"{where}: no advantage"
        temp = group.get("temperature")
        if temp is not None and not TEMPERATURE_MIN <= temp <= TEMPERATURE_MAX:  # stored before ingest checked
            return f"group {group.get('id')!r}: temperature {temp!r} outside [{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}]"
    return None


def next_version(client: DeliveryClient, checkpoint_version: int) -> int:
    """The last published version this trainer continues from: the service's latest, or the checkpoint's
    when higher (a service reset). Resuming after a crash that published past the checkpoint then
    publishes latest + 1, never a version the service already has."""
    latest = int(_retry(client.get_policy, "get policy").get("version") or 0)
    return max(latest, checkpoint_version)


def publish_version(client: DeliveryClient, version: int, metrics: dict[str, Any]) -> None:
    """Publish, retried; a retry whose first attempt was stored answers 409 — fine once the service has it."""
    from service.client import CuratorError

    try:
        _retry(lambda: client.publish_policy(version, metrics), "publish")
    except CuratorError as exc:
        if exc.status_code != 409 or int(client.get_policy().get("version") or 0) < version:
            raise
        log.warning("publish of version %d answered 409; the service already has it", version)


class Heartbeat:
    """Keeps the leases of held batches alive: extends each every ``lease_seconds / 3`` until released."""

    def __init__(self, client: DeliveryClient, lease_seconds: float) -> None:
        self.client, self.lease_seconds = client, lease_seconds
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
        self.lost: set[str] = set()  # leases the service would no longer extend

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def hold(self, batch_id: str) -> None:
        with self._lock:
            self._held.add(batch_id)

    def release(self, batch_ids: list[str]) -> None:
        with self._lock:
            self._held.difference_update(batch_ids)

    def beat(self) -> None:
        """Extend every held lease once."""
        with self._lock:
            held = sorted(self._held)
        for batch_id in held:
            try:
                self.client.extend(batch_id, self.lease_seconds)
            except Exception as exc:  # noqa: BLE001 - logged; a 409 means the lease is gone
                if _status(exc) == 409:
                    self.lost.add(batch_id)
                    self.release([batch_id])
                log.warning("heartbeat of batch %s failed: %s", batch_id, exc)

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self.lease_seconds / 3)):
            self.beat()

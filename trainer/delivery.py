"""The trainer's side of batch delivery: lease, heartbeat, refuse, ack — every call retried.

Crash safety (see docs/operations.md): a batch is acked only once the update it fed is durable, i.e. once
a checkpoint that contains that update is written. Until then its lease is kept alive by a heartbeat
thread (``POST /v1/batches/{id}/extend`` every ``lease_seconds / 3``). A trainer killed at any point
therefore loses nothing: the leases of the batches trained since its last checkpoint stop being extended,
expire, and the groups are delivered again — to the resumed trainer, which restarts from that checkpoint.
The checkpoint also records the batches it holds (``Ledger``): a crash between the checkpoint and the ack
is settled on resume, so those batches are not trained twice by this trainer.
Without a checkpoint directory nothing is durable and a batch is acked right after its step.

Every call goes through ``service.client.retry`` (transient errors: connection failures, 5xx); a lease
carries a ``request_id``, so a lease whose answer was lost comes back instead of a second one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal, Protocol

from service.ingest.schemas import TEMPERATURE_MAX, TEMPERATURE_MIN

if TYPE_CHECKING:
    from service.client import BatchFormat

log = logging.getLogger(__name__)

RETRIES = 8
BACKOFF_S = 0.2


class DeliveryClient(Protocol):
    """The part of `service.client.CuratorClient` the trainer uses."""

    def lease(self, trainer_id: str, *, max_groups: int | None = None, max_trajectories: int | None = None,
              max_tokens: int | None = None, max_staleness: int | None = None, lease_seconds: float = 300,
              wait_seconds: float = 0, request_id: str | None = None, format: BatchFormat = "json",
              order: Literal["oldest", "freshest"] | None = None, as_numpy: bool = False,
              min_groups: int | None = None, need_logprobs: bool = False) -> dict[str, Any] | None: ...
    def ack(self, batch_id: str) -> dict[str, Any]: ...
    def nack(self, batch_id: str, *, reason: str | None = None, drop: bool = False,
             vocab_size: int | None = None) -> dict[str, Any]: ...
    def extend(self, batch_id: str, lease_seconds: float) -> dict[str, Any]: ...
    def publish_policy(self, version: int, metrics: dict[str, Any]) -> dict[str, Any]: ...
    def get_policy(self) -> dict[str, Any]: ...


def _retry(fn: Any, what: str) -> Any:
    from service.client import retry

    return retry(fn, retries=RETRIES, backoff_s=BACKOFF_S, what=what)


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


PAUSE_MAX_WAIT_S = 60.0  # longest wait between lease attempts while the service pauses leasing


def paused_by(exc: BaseException) -> dict[str, Any] | None:
    """The alert of a 503 that says leasing is paused (service.alerts' breaker), else None."""
    detail = getattr(exc, "detail", None)
    if _status(exc) == 503 and isinstance(detail, dict) and isinstance(detail.get("alert"), dict):
        return detail
    return None


def _wait_while_paused(detail: dict[str, Any], message: str, sleep: Any) -> None:
    alert = detail["alert"]
    wait = min(PAUSE_MAX_WAIT_S, max(0.1, float(detail.get("retry_after_s") or 1.0)))
    log.warning("leasing paused by the service (alert %s, monitor %s, dataset %s): %s; waiting %.0f s",
                alert.get("id"), alert.get("monitor"), alert.get("dataset"), message, wait)
    sleep(wait)


def lease_batch(client: DeliveryClient, trainer_id: str, *, sleep: Any = None, **kwargs: Any) -> dict[str, Any] | None:
    """One lease, retried with the same request_id (a new one if that lease already ended: 409).

    While the service pauses leasing (a 503 naming a critical alert) this logs the reason and waits what
    the service says (at most ``PAUSE_MAX_WAIT_S``), then asks again, for as long as the pause lasts:
    a pause is never an error and never an empty poll. Nothing was leased by a refused request."""
    sleep = sleep or time.sleep
    while True:
        try:
            return _lease_batch(client, trainer_id, **kwargs)
        except Exception as exc:
            detail = paused_by(exc)
            if detail is None:
                raise
            _wait_while_paused(detail, getattr(exc, "message", str(exc)), sleep)


def _lease_batch(client: DeliveryClient, trainer_id: str, **kwargs: Any) -> dict[str, Any] | None:
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

    # a pause (503 naming an alert) is not retried here: lease_batch waits for it without burning retries
    return _retry_unless_paused(attempt)


def _retry_unless_paused(fn: Any) -> Any:
    """``service.client.retry``'s transient-error retries, except that a pause is raised at once."""
    from service.client import is_transient

    for attempt in range(RETRIES + 1):
        try:
            return fn()
        except Exception as exc:
            if paused_by(exc) is not None or not is_transient(exc) or attempt == RETRIES:
                raise
            delay = min(BACKOFF_S * 2**attempt, 5.0)
            log.warning("lease failed (%s); retry %d/%d in %.1f s", exc, attempt + 1, RETRIES, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def ack_batches(client: DeliveryClient, batch_ids: list[str]) -> list[str]:
    """Ack each batch -> the ids the service refused (409: the lease had expired; its groups went back to
    the queue or to another trainer). The caller records the refused batches' groups as trained."""
    from service.client import CuratorError

    refused = []
    for batch_id in batch_ids:
        try:
            _retry(lambda b=batch_id: client.ack(b), "ack")
        except CuratorError as exc:
            if exc.status_code != 409:
                raise
            log.warning("ack of batch %s refused: %s", batch_id, exc)
            refused.append(batch_id)
    return refused


class Ledger:
    """What this trainer trained but the service may not know (saved in every checkpoint's TrainerState).

    ``pending``: batch id -> group ids, trained since the last checkpoint (acked right after the next one;
    the checkpoint records them, so a crash between the checkpoint and the ack is settled by acking them on
    resume). ``trained``: groups whose update the weights hold but whose ack was refused (the lease had
    expired: the heartbeat lost it, or a crash outlasted it); if one comes back in a lease it is acked
    without training. Capped at ``keep`` ids (the oldest go: by then another trainer consumed them)."""

    def __init__(self, pending: tuple[dict, ...] = (), trained: tuple[str, ...] = (), keep: int = 100_000) -> None:
        self.pending: dict[str, list[str]] = {p["batch_id"]: list(p["groups"]) for p in pending}
        self.trained: dict[str, None] = dict.fromkeys(trained)  # insertion-ordered set
        self.keep = keep

    def add(self, batch: dict[str, Any]) -> None:
        self.pending[batch["batch_id"]] = batch.get("all_group_ids") or [g["id"] for g in batch["groups"]]

    def saved(self) -> dict[str, tuple]:
        """The ledger's fields of TrainerState."""
        pending = tuple({"batch_id": b, "groups": ids} for b, ids in self.pending.items())
        return {"pending": pending, "trained": tuple(list(self.trained)[-self.keep:])}

    def settle(self, client: DeliveryClient, lost: set[str] = frozenset()) -> int:  # type: ignore[assignment]
        """Ack every pending batch (its update is durable); refused ones, and those whose heartbeat was
        lost, leave their groups in ``trained``. -> how many were refused."""
        ids = list(self.pending)
        refused = set(ack_batches(client, ids)) | (lost & set(ids))
        for batch_id in ids:
            if batch_id in refused:
                self.trained.update(dict.fromkeys(self.pending[batch_id]))
            del self.pending[batch_id]
        return len(refused)

    def strip(self, client: DeliveryClient, batch: dict[str, Any] | None) -> dict[str, Any] | None:
        """The batch without the groups this trainer already trained (None when that leaves nothing: then
        it is acked at once, since its whole update is already in a checkpoint)."""
        if batch is None or not self.trained:
            return batch
        done = [g["id"] for g in batch["groups"] if g["id"] in self.trained]
        if not done:
            return batch
        for gid in done:
            self.trained.pop(gid, None)
        rest = [g for g in batch["groups"] if g["id"] not in set(done)]
        log.info("batch %s: %d group(s) already trained before a crash, not trained again", batch["batch_id"],
                 len(done))
        if rest:
            return {**batch, "groups": rest, "all_group_ids": [g["id"] for g in batch["groups"]]}
        if ack_batches(client, [batch["batch_id"]]):
            self.trained.update(dict.fromkeys(done))
        return None


def refuse(client: DeliveryClient, batch: dict[str, Any], reason: str, vocab_size: int | None = None,
           offending: list[str] | None = None) -> None:
    """Nack a batch this trainer cannot use, asking to drop its groups; the service drops those it finds
    untrainable itself (``vocab_size``: also those with a token id outside this trainer's vocabulary) and
    returns the others to the queue (another trainer may use them). ``offending``: the ids of the groups
    this trainer found unusable, named in the one log line (the others are said to go back)."""
    ids = [g.get("id") for g in batch.get("groups", [])]
    bad = [gid for gid in ids if gid in set(offending or ())]
    checks = "no token ids / loss mask" + ("" if vocab_size is None else f", a token id >= vocab_size {vocab_size}")
    log.warning("batch %s refused: %s; nacked: %s, the other %d group(s) go back to the queue and are leased again"
                " (the service drops only a group it confirms untrainable: %s)", batch["batch_id"], reason,
                f"group(s) {', '.join(map(repr, bad))} dropped" if bad else "no group named", len(ids) - len(bad),
                checks)
    _retry(lambda: client.nack(batch["batch_id"], reason=reason[:2000], drop=True, vocab_size=vocab_size), "nack")


def _outside_vocab(tokens: list[int], vocab_size: int | None) -> str | None:
    """The first token id outside [0, vocab_size) with its position, or None."""
    if vocab_size is None or not tokens or (0 <= min(tokens) and max(tokens) < vocab_size):
        return None
    pos = next(i for i, tok in enumerate(tokens) if not 0 <= tok < vocab_size)
    return f"token id {tokens[pos]} at position {pos} is outside the model's vocabulary (vocab_size {vocab_size})"


def _arrays_unusable(arrays: dict[str, Any], vocab_size: int | None, need_logprobs: bool) -> str | None:
    """What is wrong with one sequence's arrays (a trajectory's, or one segment's), or None."""
    tokens, mask, logprobs = arrays.get("token_ids"), arrays.get("loss_mask"), arrays.get("logprobs")
    versions = arrays.get("versions")
    if tokens is None or len(tokens) == 0 or mask is None:
        return "no token_ids / loss_mask"
    outside = _outside_vocab(tokens, vocab_size)
    if outside is not None:
        return outside
    if len(mask) != len(tokens) or (logprobs is not None and len(logprobs) != len(tokens)):
        return "token_ids, loss_mask, logprobs differ in length"
    if versions is not None and len(versions) != len(tokens):
        return f"versions has {len(versions)} entries for {len(tokens)} token ids"
    for name, values in (("logprobs", logprobs), ("versions", versions), ("loss_mask", mask)):
        if values is not None and any(v is None for v in values):
            pos = next(i for i, v in enumerate(values) if v is None)
            return f"{name} has a null at position {pos}"
    if need_logprobs and logprobs is None:
        return "no behaviour logprobs (old_from_batch needs them)"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _trajectory_unusable(t: dict[str, Any], need_logprobs: bool, vocab_size: int | None) -> str | None:
    """Why one leased trajectory cannot be trained, or None. A segmented one (``segments``: the service sends
    null top-level arrays then) is checked segment by segment: each segment's arrays, vocabulary and
    advantage (its own, or the trajectory's when null)."""
    segments = t.get("segments")
    if segments is None:
        why = _arrays_unusable(t, vocab_size, need_logprobs)
        if why is not None:
            return why
        if t.get("advantage") is None:
            return "no advantage"
        return None if _finite(t["advantage"]) else f"advantage {t['advantage']!r} is not a finite number"
    if len(segments) == 0:
        return "an empty segments list"
    for seg in segments:
        where = f"segment {seg.get('segment_index')}"
        why = _arrays_unusable(seg, vocab_size, need_logprobs)
        if why is not None:
            return f"{where}: {why}"
        adv = seg.get("advantage") if seg.get("advantage") is not None else t.get("advantage")
        if adv is None:
            return f"{where}: no advantage"
        if not _finite(adv):
            return f"{where}: advantage {adv!r} is not a finite number"
    return None


def unusable(batch: dict[str, Any], need_logprobs: bool, vocab_size: int | None = None) -> str | None:
    """Why this trainer cannot train on ``batch``, or None (``vocab_size``: the model's input vocabulary,
    every token id must be below it; a segmented trajectory's segments are each checked)."""
    for group in batch.get("groups", []):
        for t in group.get("trajectories", []):
            why = _trajectory_unusable(t, need_logprobs, vocab_size)
            if why is not None:
                return f"group {group.get('id')!r} trajectory {t.get('index')}: {why}"
        temp = group.get("temperature")
        if temp is not None and not TEMPERATURE_MIN <= temp <= TEMPERATURE_MAX:  # stored before ingest checked
            return f"group {group.get('id')!r}: temperature {temp!r} outside [{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}]"
    return None


def next_version(client: DeliveryClient, checkpoint_version: int) -> int:
    """The last published version this trainer continues from: always the service's latest, since a trainer
    key publishes exactly latest + 1 (docs/security.md). Resuming after a crash that published past the
    checkpoint publishes latest + 1, never a version the service already has; a checkpoint ahead of the
    service (a service reset) continues from the service's latest + 1 too, and says so."""
    latest = int(_retry(client.get_policy, "get policy").get("version") or 0)
    if checkpoint_version > latest:
        log.warning("checkpoint policy version %d is ahead of the service's %d (a service reset?): "
                    "continuing from the service's, publishing %d next", checkpoint_version, latest, latest + 1)
    return latest


def publish_version(client: DeliveryClient, version: int, metrics: dict[str, Any]) -> None:
    """Publish, retried; a retry whose first attempt was stored answers 409 — fine once the service has it."""
    from service.client import CuratorError, finite_metrics

    metrics = finite_metrics(metrics)  # a non-finite metric is named in a warning and left out, never fatal
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

"""One unit of work each: claim -> score (no transaction open) -> write + curate (one short transaction).

- **Claim.** A worker claims received groups by writing a claim token and ``claimed_until`` on them, counts
  the attempt, and commits. ``FOR UPDATE SKIP LOCKED`` makes concurrent claims disjoint; the claim (not a
  row lock) keeps others away while the group is scored, so no lock or transaction is held across judge
  calls or sandbox runs.
- **Score** with no session. **Write** the results in a short transaction that first re-reads which groups
  are still claimed by this token: a worker whose claim expired and was taken over writes nothing for
  those groups (fencing). A crashed worker's groups become claimable again when their claim expires.
- **Isolation.** Every failure is one group's: a spec that cannot be resolved, component errors, a scorer
  that raises, a curation that raises -> that group is retried or marked (``reward_error`` /
  ``curation_error``) with a decision naming the cause, and the worker moves on. Attempts are counted
  at claim time; every group of a claim whose worker died gets that attempt back
  (``repo.refund_dead_batches``: a death is no scoring failure, no backoff), and the dead claim is split in
  halves, each claimed again together (bisection), so a poison group ends up alone; one whose worker died
  while it was claimed alone more than ``max_solo_deaths`` times is the killer (``reward_error``), and its
  neighbours' attempts are never spent on it.
- **Heartbeat.** While scoring, the worker renews its claim (``ClaimHeartbeat``), so a batch slower than
  ``claim_seconds`` is not taken over while its worker lives; so the claim can be short (30 s) and a dead
  worker's groups are claimed again within it.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, fields, replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from reward_models.scoring import Scorer
from service.curation.service import curate
from service.scoring import service as scoring
from service.settings import MIN_BEAT_S, get_settings
from service.store import partitions
from service.worker import repository as repo

log = logging.getLogger(__name__)
_PARTITIONS = partitions.Throttle()  # this process's partition maintenance: at most every CHECK_EVERY_S


@dataclass(frozen=True)
class PipelineConfig:
    """How a worker claims, retries and gives up (``Settings`` carries the deployment's values)."""

    batch: int = 32
    max_attempts: int = 10
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    claim_seconds: float = 30.0
    max_solo_deaths: int = 3  # worker deaths forgiven a group claimed alone; one more: reward_error (the killer)
    caller_reference_specs: frozenset[str] = frozenset()  # specs that run non-admin references (opt-ins)
    worker_id: str = f"{socket.gethostname()}:{os.getpid()}"

    def __post_init__(self) -> None:
        for name in ("claim_seconds", "backoff_base_s", "backoff_max_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: expected a finite number of seconds > 0, got {value!r}")
        if self.batch < 1 or self.max_attempts < 1:
            raise ValueError(f"batch / max_attempts: expected at least 1, got {self.batch} / {self.max_attempts}")

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> PipelineConfig:
        values = {"batch": settings.worker_batch_groups, "max_attempts": settings.max_score_attempts,
                  "backoff_base_s": settings.score_backoff_base_s, "backoff_max_s": settings.score_backoff_max_s,
                  "claim_seconds": settings.score_claim_seconds, "max_solo_deaths": settings.max_solo_deaths,
                  "caller_reference_specs": frozenset(settings.caller_reference_specs)}
        return cls(**(values | overrides))

    @property
    def backoff(self) -> scoring.Backoff:
        return scoring.Backoff(self.backoff_base_s, self.backoff_max_s)


@dataclass
class PassResult:
    scored: int = 0
    retried: int = 0
    failed: int = 0
    ready: int = 0
    dropped: int = 0
    curation_errors: int = 0
    fenced: int = 0

    @property
    def worked(self) -> int:
        return self.scored + self.retried + self.failed + self.ready + self.dropped + self.curation_errors

    def add(self, other: PassResult) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _config(cfg: PipelineConfig | None, overrides: dict[str, Any]) -> PipelineConfig:
    return replace(cfg or PipelineConfig(), **overrides)


class ClaimHeartbeat:
    """While a claim is scored, renew it every ``claim_seconds / 3`` (its own short transactions), so a
    batch slower than the claim is not taken over by another worker; a worker that dies stops renewing and
    its claim expires. Stops by itself once the claim was taken over (nothing left to renew)."""

    def __init__(self, factory: sessionmaker[Session], token: str, claim_seconds: float) -> None:
        self.factory, self.token, self.claim_seconds = factory, token, claim_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-heartbeat", daemon=True)

    def __enter__(self) -> ClaimHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(max(MIN_BEAT_S, self.claim_seconds / 3)):
            try:
                with self.factory.begin() as session:
                    if repo.extend_claim(session, self.token, self.claim_seconds) == 0:
                        return
            except Exception:  # noqa: BLE001 - the database blinked: try again next beat
                log.warning("claim heartbeat of %s failed", self.token, exc_info=True)


def _killer_decisions(session: Session, rows: list[tuple[int, int]]) -> None:
    from service.curation.service import record_decisions

    record_decisions(session, [
        {"group_pk": pk, "idx": None, "policy_name": None, "policy_version": None, "action": "drop",
         "rule": "reward_error",
         "reason": f"its score worker died {n} times while it was scored alone: the likely killer of its worker"}
        for pk, n in rows
    ])


def score_pass(factory: sessionmaker[Session], scorer: Scorer, cfg: PipelineConfig) -> PassResult:
    """Claim received groups (commit), score them outside any transaction, write + curate (commit)."""
    token = f"{cfg.worker_id}:{uuid.uuid4().hex[:12]}"
    with factory.begin() as session:  # its own short transaction: the refund's lock ends with it
        repo.refund_dead_batches(session)
    with factory.begin() as session:
        exhausted = repo.fail_exhausted(session, cfg.max_attempts)
        scoring.exhausted_decisions(session, exhausted)
        pks = repo.claim_received(session, token, cfg.batch, cfg.claim_seconds, cfg.max_attempts,
                                  cfg.max_solo_deaths, refund=False)
        killers = repo.fail_killers(session, cfg.max_solo_deaths)
        _killer_decisions(session, killers)
        exhausted += killers
    if not pks:
        return PassResult(failed=len(exhausted))
    with factory() as session:  # a short read; closed (no transaction) before scoring starts
        job = scoring.prepare(session, token, pks, cfg.caller_reference_specs)
    with ClaimHeartbeat(factory, token, cfg.claim_seconds):  # a slow batch keeps its claim
        scoring.score_job(scorer, job)
    out, counts = write_back(factory, job, cfg)
    return PassResult(len(out.scored), out.retried, out.failed + len(exhausted), counts.get("ready", 0),
                      counts.get("dropped", 0), counts.get("curation_error", 0), out.fenced)


def write_back(factory: sessionmaker[Session], job: scoring.Job, cfg: PipelineConfig) -> tuple[Any, dict[str, int]]:
    """Write a scored job and curate what it scored (one transaction). Groups whose claim was taken for
    dead while this worker lived (fenced) take back the death it counted (``repo.take_back_deaths``)."""
    with factory.begin() as session:
        out = scoring.write(session, job, cfg.max_attempts, cfg.backoff)
        if out.fenced:  # this worker lives: a death counted for its lapsed claim was none
            revived = repo.take_back_deaths(session, job.token, [g.pk for g in job.groups], cfg.max_solo_deaths)
            if revived:
                log.warning("claim %s lapsed while its worker lived: %d group(s) take a death back",
                            job.token, len(revived))
        counts = curate(session, out.scored)
    return out, counts


def curate_pass(session: Session, batch: int) -> PassResult:
    """Claim groups left 'scored' (a re-curation) and curate them (no outside calls: one transaction)."""
    counts = curate(session, repo.claim_groups(session, "scored", batch))
    return PassResult(ready=counts.get("ready", 0), dropped=counts.get("dropped", 0),
                      curation_errors=counts.get("curation_error", 0))


def run_once(factory: sessionmaker[Session], scorer: Scorer, cfg: PipelineConfig | None = None,
             **overrides: Any) -> PassResult:
    """One pass of every stage. ``overrides``: PipelineConfig fields (``batch=4, max_attempts=3``)."""
    cfg = _config(cfg, overrides)
    result = score_pass(factory, scorer, cfg)
    with factory.begin() as session:
        result.add(curate_pass(session, cfg.batch * 8))
    _maintain(factory)
    return result


def _maintain(factory: sessionmaker[Session]) -> None:
    """Expired leases go back to ready; ready groups past their policy's staleness leave the queue;
    session groups past their deadline enter scoring with the sessions they have; every
    ``partitions.CHECK_EVERY_S``, the hot tables' partitions are created ahead and retired
    (``service.store.partitions``).
    Each task in its own transaction, and a failing one is logged, never raised: maintenance must not
    undo the other task's work or block scoring."""
    from service.alerts.service import evaluate_due
    from service.curation.service import expire_waits
    from service.delivery.service import drop_stale, reap_expired
    from service.sessions.service import sweep_overdue

    for task in (reap_expired, drop_stale, evaluate_due, sweep_overdue, expire_waits):
        try:
            with factory.begin() as session:
                task(session)
        except Exception:  # noqa: BLE001 - the next pass tries again; scoring goes on
            log.exception("maintenance task %s failed", task.__name__)
    if _PARTITIONS.due():  # ranges of the partitioned hot tables: created ahead, retired by DROP
        try:
            partitions.maintain(factory, get_settings().partition_groups)
        except Exception:  # noqa: BLE001 - a lock timeout, say: the next check tries again
            log.exception("maintenance task partitions failed")


def run_forever(factory: sessionmaker[Session], scorer: Scorer, stop: threading.Event,
                cfg: PipelineConfig | None = None, *, poll_seconds: float = 0.5, **overrides: Any) -> None:
    """Loop until ``stop`` is set; sleeps ``poll_seconds`` only when a pass found nothing to do."""
    cfg = _config(cfg, overrides)
    while not stop.is_set():
        try:
            result = run_once(factory, scorer, cfg)
        except Exception:  # the database went away, say; every group-level failure is handled inside
            log.exception("worker pass failed; retrying")
            stop.wait(poll_seconds * 4)
            continue
        if result.worked:
            log.info("worker pass: %s", result)
        else:
            stop.wait(poll_seconds)


def drain(factory: sessionmaker[Session], scorer: Scorer, cfg: PipelineConfig | None = None, *,
          timeout_s: float = 60.0, **overrides: Any) -> PassResult:
    """Run passes until two in a row find nothing to do, or ``timeout_s`` (tests, demo, benchmarks).
    Groups waiting for a retry's backoff are not waited for."""
    cfg = _config(cfg, overrides)
    total = PassResult()
    deadline = time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline and idle < 2:
        r = run_once(factory, scorer, cfg)
        total.add(r)
        idle = 0 if r.worked else idle + 1
    return total

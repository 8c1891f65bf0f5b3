"""One unit of work each: claim -> score -> curate, in one transaction per batch of groups.

Groups are claimed with ``FOR UPDATE SKIP LOCKED`` and held until commit, so any number of workers on any
number of machines share the queue, no group is worked on twice, and a crashed worker's groups are simply
claimed again by the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from reward_models.scoring import Scorer
from service.repositories import pipeline as repo
from service.workers.curation import curate
from service.workers.scoring import score_groups

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    scored: int = 0
    retried: int = 0
    failed: int = 0
    ready: int = 0
    dropped: int = 0

    @property
    def worked(self) -> int:
        return self.scored + self.retried + self.failed + self.ready + self.dropped


def score_pass(session: Session, scorer: Scorer, batch: int, max_attempts: int) -> PassResult:
    """Claim received groups, score them, and curate the ones that scored cleanly."""
    groups = repo.claim_groups(session, "received", batch)
    if not groups:
        return PassResult()
    out = score_groups(session, scorer, groups, max_attempts)
    counts = curate(session, out.scored)
    return PassResult(len(out.scored), out.retried, out.failed, counts.get("ready", 0), counts.get("dropped", 0))


def curate_pass(session: Session, batch: int) -> PassResult:
    """Claim groups left 'scored' (a re-curation) and curate them."""
    counts = curate(session, repo.claim_groups(session, "scored", batch))
    return PassResult(ready=counts.get("ready", 0), dropped=counts.get("dropped", 0))


def run_once(factory: sessionmaker[Session], scorer: Scorer, batch: int = 32, max_attempts: int = 3) -> PassResult:
    """One pass of every stage, each in its own transaction."""
    with factory.begin() as session:
        result = score_pass(session, scorer, batch, max_attempts)
    with factory.begin() as session:
        cur = curate_pass(session, batch * 8)
    result.ready += cur.ready
    result.dropped += cur.dropped
    with factory.begin() as session:
        _reap(session)
    return result


def _reap(session: Session) -> None:
    """Expired leases go back to ready (the delivery module owns the rule)."""
    try:
        from service.services.leases import reap_expired
    except ImportError:  # delivery not installed in this build
        return
    reap_expired(session)


def run_forever(
    factory: sessionmaker[Session],
    scorer: Scorer,
    stop: threading.Event,
    *,
    batch: int = 32,
    max_attempts: int = 3,
    poll_seconds: float = 0.5,
) -> None:
    """Loop until ``stop`` is set; sleeps ``poll_seconds`` only when a pass found nothing to do."""
    while not stop.is_set():
        try:
            result = run_once(factory, scorer, batch, max_attempts)
        except Exception:  # a bad batch must not kill the worker; its transaction rolled back
            log.exception("worker pass failed; retrying")
            stop.wait(poll_seconds * 4)
            continue
        if result.worked:
            log.info("worker pass: %s", result)
        else:
            stop.wait(poll_seconds)


def drain(factory: sessionmaker[Session], scorer: Scorer, *, batch: int = 32, max_attempts: int = 3,
          timeout_s: float = 60.0) -> PassResult:
    """Run passes until nothing is left to do (tests, demo, benchmarks). Retries wait for their backoff."""
    total = PassResult()
    deadline = time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline and idle < 2:
        r = run_once(factory, scorer, batch, max_attempts)
        for f in ("scored", "retried", "failed", "ready", "dropped"):
            setattr(total, f, getattr(total, f) + getattr(r, f))
        idle = 0 if r.worked else idle + 1
    return total

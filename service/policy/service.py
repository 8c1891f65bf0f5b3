"""Policy versions: the trainer publishes each new version with its step metrics; producers and the
curation stage read the current one (staleness = current version - the version that sampled a group).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.api.errors import Conflict
from service.policy import repository as policy_repo
from service.policy.schemas import PolicyHistory, PolicyIn, PolicyOut
from service.store.models import PolicyState


def _out(row: PolicyState) -> PolicyOut:
    return PolicyOut(version=row.version, metrics=row.metrics, created_at=row.created_at.isoformat())


def publish(session: Session, body: PolicyIn, publisher_key: str | None = None,
            any_version: bool = False) -> tuple[PolicyOut, bool]:
    """Store a new version; returns (the stored version, created?).

    Versions strictly increase, one step at a time: a trainer publishes exactly the latest + 1 (409 naming
    the expected version otherwise), so no key can jump to the top of the range and strand every group.
    ``any_version`` (admin keys) may publish any higher version, for recovery. The same version with the
    same metrics again is an idempotent retry (created=False); anything else is a 409 and stores nothing.
    """
    policy_repo.lock_publishing(session)
    existing = policy_repo.get_version(session, body.version)
    if existing is not None:
        if existing.metrics == body.metrics:
            return _out(existing), False
        raise Conflict(
            f"version: {body.version} was already published with different metrics",
            detail={"version": body.version},
        )
    latest = policy_repo.latest(session)
    if latest is not None and body.version <= latest.version:
        raise Conflict(
            f"version: {body.version} is not greater than the current version {latest.version}; "
            "versions strictly increase",
            detail={"version": body.version, "current": latest.version},
        )
    expected = (latest.version if latest is not None else 0) + 1
    if not any_version and body.version != expected:
        raise Conflict(
            f"version: expected {expected} (the current version + 1); a trainer key publishes one version "
            f"at a time, got {body.version} (an admin key may set any higher version, for recovery)",
            detail={"version": body.version, "expected": expected},
        )
    return _out(policy_repo.insert_version(session, body.version, body.metrics, publisher_key)), True


def current(session: Session) -> PolicyOut:
    """The latest published version; version 0 with no metrics when none was published."""
    row = policy_repo.latest(session)
    return PolicyOut(version=0, metrics={}, created_at=None) if row is None else _out(row)


def current_version(session: Session) -> int:
    return policy_repo.current_version(session)


def history(session: Session, limit: int) -> PolicyHistory:
    """Newest first."""
    return PolicyHistory(versions=[_out(r) for r in policy_repo.history(session, limit)])

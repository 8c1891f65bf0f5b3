"""What the service holds right now: groups by status, drops by reason, leases, policy version."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy.orm import Session

from service.observability import repository as repo
from service.policy import service as policy_service


def summary(session: Session, dataset: str | None = None) -> dict[str, Any]:
    """The counts, of one dataset when ``dataset`` is given (the policy version is the service's)."""
    return {
        "groups": repo.group_counts(session, dataset),
        "drop_reasons": repo.drop_reasons(session, dataset),
        "active_leases": repo.active_leases(session, dataset),
        "open_sampling_requests": repo.open_sampling_requests(session, dataset),
        "policy_version": policy_service.current_version(session),
    }


def prometheus_text(session: Session) -> bytes:
    """Gauges read from PostgreSQL at scrape time, so every API replica reports the same numbers."""
    s = summary(session)
    registry = CollectorRegistry()
    groups = Gauge("grpo_curator_groups", "groups by lifecycle status", ["status"], registry=registry)
    for status, n in s["groups"].items():
        groups.labels(status).set(n)
    drops = Gauge("grpo_curator_dropped_groups", "dropped groups by reason", ["reason"], registry=registry)
    for reason, n in s["drop_reasons"].items():
        drops.labels(reason).set(n)
    Gauge("grpo_curator_active_leases", "leases not yet acked, nacked or expired", registry=registry).set(s["active_leases"])
    requests = Gauge("grpo_curator_open_sampling_requests", "open refill / resample requests", ["reason"], registry=registry)
    for reason, n in s["open_sampling_requests"].items():
        requests.labels(reason).set(n)
    Gauge("grpo_curator_policy_version", "the trainer's latest published policy version", registry=registry).set(
        s["policy_version"]
    )
    return generate_latest(registry)

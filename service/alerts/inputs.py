"""What the monitors read, gathered for a window of policy versions: the stored groups (with their
trajectories and reward components, weighted by their spec) and the metrics trainers published."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from filters.monitors import ZLIB_TAIL_CHARS, ComponentFact, GroupFact, TrajectoryFact
from service.alerts import repository as alert_repo
from service.policy import service as policy
from service.specs import service as specs

log = logging.getLogger(__name__)
ZERO_SPREAD = 1e-12


@dataclass(frozen=True)
class Window:
    versions: tuple[int, ...]  # ascending
    groups: Mapping[str, list[GroupFact]]  # dataset -> its groups
    metrics: Mapping[int, Mapping[str, Any]]  # version -> published trainer metrics


def _spec_components(session: Session, name: str | None, version: int | None, cache: dict) -> dict[str, tuple[float, bool]]:
    """component name -> (weight, is the outcome) of a stored spec version; {} when unknown."""
    if name is None or version is None:
        return {}
    if (name, version) not in cache:
        try:
            body = specs.get_versioned(session, "reward_spec", name, version).body
        except Exception:  # noqa: BLE001 - a spec that cannot be read: components weighted 1
            log.warning("alerts: reward spec %s@%s unreadable; weights taken as 1", name, version)
            cache[(name, version)] = {}
            return {}
        comps = body.get("components", [])
        marked = [c.get("name") for c in comps if c.get("outcome")]
        first_verifier = next((c.get("name") for c in comps if str(c.get("kind", "")).startswith("verifier.")), None)
        outcome = marked[0] if marked else first_verifier
        cache[(name, version)] = {c.get("name"): (float(c.get("weight", 1.0)), c.get("name") == outcome) for c in comps}
    return cache[(name, version)]


def gather(session: Session, as_of: int, window_versions: int) -> Window:
    lo = max(0, as_of - window_versions + 1)
    versions = tuple(range(lo, as_of + 1))
    rows = alert_repo.window_groups(session, lo, as_of)
    pks = [r.pk for r in rows]
    trajs: dict[int, list[Any]] = {}
    comps: dict[tuple[int, int], list[Any]] = {}
    if pks:
        for t in alert_repo.window_trajectories(session, pks, ZLIB_TAIL_CHARS):
            trajs.setdefault(t.group_pk, []).append(t)
        for c in alert_repo.window_rewards(session, pks):
            comps.setdefault((c.group_pk, c.idx), []).append(c)
    cache: dict = {}
    groups: dict[str, list[GroupFact]] = {}
    for g in rows:
        weights = _spec_components(session, g.reward_spec_name, g.reward_spec_version, cache)
        facts = tuple(
            TrajectoryFact(
                tokens=t.num_tokens, finish_reason=t.finish_reason, text=t.tail or "", outcome=t.outcome,
                total=t.total_reward,
                components=tuple(
                    ComponentFact(c.component, c.kind, c.value, *weights.get(c.component, (1.0, False)))
                    for c in comps.get((g.pk, t.idx), [])
                ),
            )
            for t in sorted(trajs.get(g.pk, []), key=lambda t: t.idx)
        )
        groups.setdefault(g.dataset, []).append(GroupFact(
            version=g.policy_version, trajectories=facts, scored=g.scored_at is not None,
            zero_variance=g.metric_std is not None and abs(g.metric_std) < ZERO_SPREAD,
            stale=g.status == "dropped" and g.drop_reason == "stale",
        ))
    published = policy.history(session, window_versions).versions
    metrics = {p.version: p.metrics for p in published if lo <= p.version <= as_of}
    return Window(versions, groups, metrics)

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

log = logging.getLogger(__name__)
ZERO_SPREAD = 1e-12


@dataclass(frozen=True)
class Window:
    versions: tuple[int, ...]  # ascending
    groups: Mapping[str, list[GroupFact]]  # dataset -> its groups
    metrics: Mapping[int, Mapping[str, Any]]  # version -> published trainer metrics


@dataclass(frozen=True)
class WindowRows:
    """What ``read_window`` read: rows only, so that building the facts (Python) needs no transaction."""

    as_of: int
    versions: tuple[int, ...]
    groups: list[Any]
    trajectories: list[Any]
    rewards: list[Any]
    specs: Mapping[tuple[str, int], dict[str, tuple[float, bool]] | None]  # None: unreadable
    metrics: Mapping[int, Mapping[str, Any]]


def _components(body: Any) -> dict[str, tuple[float, bool]]:
    """component name -> (weight, is the outcome) of a stored spec body."""
    comps = body.get("components", [])
    marked = [c.get("name") for c in comps if c.get("outcome")]
    first_verifier = next((c.get("name") for c in comps if str(c.get("kind", "")).startswith("verifier.")), None)
    outcome = marked[0] if marked else first_verifier
    return {c.get("name"): (float(c.get("weight", 1.0)), c.get("name") == outcome) for c in comps}


# ``_components`` of stored spec bodies, by (name, version, sha256 of the body as stored): a body is parsed again
# only when its digest is one not seen before. Each entry is keyed by the digest read in the same statement as
# its body (``spec_bodies``), never by the name and version alone, so apps and databases in one process, and a
# body edited between two statements, cannot give another body's weights; only the specs of the latest read
# are kept (one assignment per read), and an unreadable one (None) is never kept.
_spec_cache: list[dict[tuple[str, int, bytes], dict[str, tuple[float, bool]]]] = [{}]


def _specs(session: Session, groups: list[Any]) -> dict[tuple[str, int], dict[str, tuple[float, bool]] | None]:
    """(name, version) -> components of every spec version the groups were scored with (None: unreadable,
    weights taken as 1). Two statements at most, on those versions only: their digests, then the bodies whose
    digest is not in the cache."""
    keys = {(g.reward_spec_name, g.reward_spec_version) for g in groups
            if g.reward_spec_name is not None and g.reward_spec_version is not None}
    previous, kept = _spec_cache[0], {}
    digests = alert_repo.spec_digests(session, keys)
    fresh = {key for key in keys if (*key, digests.get(key)) not in previous}
    read = alert_repo.spec_bodies(session, fresh)
    out: dict[tuple[str, int], dict[str, tuple[float, bool]] | None] = {}
    for key in keys:
        comps: dict[str, tuple[float, bool]] | None = None
        if key not in fresh:
            digest = digests[key]
            comps = previous[(*key, digest)]
        elif key in read:
            body, digest = read[key]
            try:
                comps = _components(body)
            except Exception:  # noqa: BLE001 - a body that cannot be read: components weighted 1
                comps = None
        if comps is None:
            log.warning("alerts: reward spec %s@%s unreadable; weights taken as 1", *key)
        else:
            kept[(*key, digest)] = comps
        out[key] = comps
    _spec_cache[0] = kept
    return out


def read_window(session: Session, window_versions: int) -> WindowRows:
    """The statements only, back to back (no Python work between them beyond fetching): a caller can read in
    a short transaction and build the facts (``build``) after it ended. The window ends at the highest
    published version, read with the trainer metrics (``WindowRows.as_of``)."""
    as_of, metrics = alert_repo.window_metrics(session, window_versions)
    lo = max(0, as_of - window_versions + 1)
    rows = alert_repo.window_groups(session, lo, as_of)
    pks = [r.pk for r in rows]
    trajs = alert_repo.window_trajectories(session, pks, ZLIB_TAIL_CHARS) if pks else []
    comps = alert_repo.window_rewards(session, pks) if pks else []
    return WindowRows(as_of, tuple(range(lo, as_of + 1)), rows, trajs, comps, _specs(session, rows), metrics)


# The previous ``build``'s facts, by group pk, each with the rows it was built from: a group whose rows
# are all equal to those (its trajectories, their components and the weights included) gets the same
# GroupFact object back, so a sliding window builds only its new or changed groups, and the StatsCache
# compares the kept versions' facts by identity. Keyed by the rows' contents, never by the pk alone, so
# apps and databases in one process cannot read each other's entries; one assignment per build.
_built: list[dict[int, tuple[tuple[Any, ...], GroupFact]]] = [{}]


def _group_fact(g: Any, trajs: list[Any], comps: dict[tuple[int, int], list[Any]],
                weights: Mapping[str, tuple[float, bool]]) -> GroupFact:
    facts = tuple(
        TrajectoryFact(
            tokens=t.num_tokens, finish_reason=t.finish_reason, text=t.tail or "", outcome=t.outcome,
            total=t.total_reward,
            components=tuple(
                ComponentFact(c.component, c.kind, c.value, *weights.get(c.component, (1.0, False)))
                for c in comps.get((g.pk, t.idx), [])
            ),
        )
        for t in trajs
    )
    return GroupFact(
        version=g.policy_version, trajectories=facts, scored=g.scored_at is not None,
        zero_variance=g.metric_std is not None and abs(g.metric_std) < ZERO_SPREAD,
        stale=g.status == "dropped" and g.drop_reason == "stale",
    )


def build(read: WindowRows) -> Window:
    """The monitors' facts from what ``read_window`` read (pure Python)."""
    trajs: dict[int, list[Any]] = {}
    comps: dict[tuple[int, int], list[Any]] = {}
    for t in read.trajectories:
        trajs.setdefault(t.group_pk, []).append(t)
    for c in read.rewards:
        comps.setdefault((c.group_pk, c.idx), []).append(c)
    groups: dict[str, list[GroupFact]] = {}
    previous, built = _built[0], {}
    for g in read.groups:
        weights = read.specs.get((g.reward_spec_name, g.reward_spec_version)) or {}
        ts = sorted(trajs.get(g.pk, []), key=lambda t: t.idx)
        rows = (tuple(g), [tuple(t) for t in ts], [tuple(c) for t in ts for c in comps.get((g.pk, t.idx), ())],
                tuple(weights.items()))  # plain tuples: compared in C (a Row compares in Python)
        hit = previous.get(g.pk)
        fact = hit[1] if hit is not None and hit[0] == rows else _group_fact(g, ts, comps, weights)
        built[g.pk] = (rows, fact)
        groups.setdefault(g.dataset, []).append(fact)
    _built[0] = built
    return Window(read.versions, groups, read.metrics)


def gather(session: Session, window_versions: int) -> Window:
    return build(read_window(session, window_versions))

"""Reward statistics (``GET /v1/stats``) served from a pre-aggregated rollup, not from raw scans.

Every curated group adds its trajectories to *cells* (table ``stats_cells``): per (policy_version,
dataset), per (finish_reason, dataset) and per dataset, each once per hour (what a query with ``since``
reads) and once for all time (bucket ``ALL_TIME``), plus all-time cells over every dataset (dataset
``ALL_DATASETS``), so a query without ``since`` reads one cell per key it answers. A cell is a flat map of
additive counters -- counts, sums, sums of squares and cross products, sparse log-bucket histograms -- so
cells merge by adding. Means, population standard deviations, rates and Pearson correlations are exact;
quantiles come from the histograms (``service.stats.sketch``: exact for small multiples of 1/8, else
within ``ALPHA`` relative error, DDSketch, Masson et al. 2019), interpolated between ranks like numpy.
``since`` applies at hour granularity (the UTC hour that contains it). Each process keeps the summaries
of all-time cells by cell version, so a cell that did not change is neither read nor summarised again.

Counted per trajectory of the curated groups, at the time of the group's ``created_at``:
``drop_fraction`` is the fraction left out of training (action drop or resample, or a member of a group
dropped as a whole: ``untrainable``, ``stale``) by reason;
``zero_variance_fraction`` the fraction in groups found to have zero variance (dropped or kept);
``truncation_rate`` the fraction per finish_reason other than ``stop``; ``length_reward_corr`` Pearson's r
between generated tokens and total reward (clearly positive while the pass rate stays flat: the classic
length-hacking signal). Groups that never finished scoring (``reward_error``) are not counted.

The rollup follows the groups through ``record_groups`` (the curation stage, after its writes) and
``retract_groups`` (before a rescore / recurate sends curated groups back) and ``record_late_drops`` (a
group dropped after curation: stale, or refused by a trainer); ``rebuild`` recomputes it.

The remedy log (``remedies`` in every answer: resample / resume steps requested, filled, unfilled,
exhausted) is counted in cells too (dim ``remedy``, key the remedy, counters by step, bucketed by the hour
of the step), added as the steps are logged (``record_remedies``): a query reads a few cells whatever the
number of decision rows, and the counts stay when their groups go to the archive.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from itertools import groupby
from typing import Any, Literal, get_args

from sqlalchemy.orm import Session

from filters.types import REASON_REWARD_ERROR, check_choice
from service.api.errors import BadRequest
from service.stats import repository as repo
from service.stats.sketch import ALPHA, QUANTILES, bucket_of, bucket_value, quantiles

__all__ = ["ALPHA", "QUANTILES", "bucket_of", "bucket_value", "quantiles"]  # re-exported

StatsBy = Literal["policy_version", "dataset", "component", "finish_reason"]
STATS_BY: tuple[str, ...] = get_args(StatsBy)

_EXCLUDED = ("drop", "resample", "resume")
_ZERO_VARIANCE = "zero_variance"

Counters = dict[str, float]
CellKey = tuple[str, str, str, datetime]  # (dim, key, dataset, hour or ALL_TIME)
ALL_TIME = datetime(1970, 1, 1, tzinfo=UTC)  # the bucket of the all-time cells
ALL_DATASETS = ""  # the dataset of the all-time cells over every dataset (dataset names are never empty)


# -- counters of one trajectory ----------------------------------------------------------------------------
_TOTAL_KEYS = ("t.n", "t.s", "t.ss", "lt.s", "lt.ss", "lt.st")  # total: count, sum, sum of squares; x length


@lru_cache(maxsize=1 << 12)
def _component_keys(name: str) -> tuple[str, ...]:
    """Values of a component: count, sum, sum of squares, and x length; then records and errors."""
    return tuple(f"c.{field}.{name}" for field in ("vn", "s", "ss", "ls", "lss", "lsv", "n", "e"))


def _add(c: Counters, sign: float, keys: Sequence[str], values: Sequence[float]) -> None:
    for key, value in zip(keys, values, strict=True):
        c[key] = c.get(key, 0.0) + sign * value


def add_trajectory(c: Counters, sign: float, fact: Any, zero_variance: bool) -> None:
    """Add (sign +1) or retract (-1) one trajectory's counters into ``c``.

    fact: (group_pk, idx, dataset, policy_version, hour, finish_reason, num_tokens, total, outcome,
    action, reason, component names, component values, ..., in its group's baseline (``facts``)); a
    component value None is a failed component.
    """
    length, total, outcome, action, reason = float(fact[6]), fact[7], fact[8], fact[9], fact[10]
    _add(c, sign, ("n", f"fin.{fact[5]}", "l.s", f"h.l.{bucket_of(length)}"), (1.0, 1.0, length, 1.0))
    if total is not None:
        _add(c, sign, _TOTAL_KEYS, (1.0, total, total * total, length, length * length, length * total))
        _add(c, sign, (f"h.t.{bucket_of(total)}",), (1.0,))
    if outcome is not None and fact[BASELINE]:  # pass_rate: the baseline's members only, as in curation
        _add(c, sign, ("o.n", "o.s"), (1.0, outcome))
    if zero_variance:
        _add(c, sign, ("zv",), (1.0,))
    if action in _EXCLUDED:
        _add(c, sign, (f"drop.{reason or action}",), (1.0,))
    for name, value in zip(fact[11] or (), fact[12] or (), strict=True):
        keys = _component_keys(name)
        if value is None:
            _add(c, sign, keys[6:], (1.0, 1.0))
            continue
        values = (1.0, value, value * value, length, length * length, length * value, 1.0)
        _add(c, sign, (*keys[:7], f"hc.{bucket_of(value)}.{name}"), (*values, 1.0))


BASELINE = -1  # the fact's last field: the member took part in its group's baseline (``facts``)
_BASELINES: dict[str, tuple[Mapping[str, str], frozenset[str]]] = {}  # policy body hash -> its rule
_BASELINES_LOCK = threading.Lock()


def _baseline_rule(body: Mapping[str, Any] | None) -> tuple[Mapping[str, str], frozenset[str]]:
    """(finish_reason -> action, the actions in the baseline) of a curation policy body (None: the default)."""
    from filters.policy import CurationPolicySpec
    from filters.rules import baseline_actions

    try:
        policy = CurationPolicySpec.model_validate(body or {"name": "default"}).to_policy()
    except ValueError:  # a body an older release stored that no longer reads: its group counts as the default's
        policy = CurationPolicySpec(name="default").to_policy()
    return dict(policy.finish_reason_actions), frozenset(baseline_actions(policy))


def facts(session: Session, group_pks: Sequence[int], group_drops: bool = True) -> list[tuple[Any, ...]]:
    """``repository.trajectory_facts``, each with whether the member was in its group's baseline: the one
    rule of curation (``filters.rules.baseline_actions`` of the policy its group was curated with, on its
    finish_reason's action) -- a masked member (unless ``masked_in_baseline``), a resampled or resumed one,
    an environment failure or a reward error is out; the members of a group dropped as a whole (zero
    variance, stale) keep their place. So ``pass_rate`` is what the curriculum and the advantages saw."""
    rows = repo.trajectory_facts(session, group_pks, group_drops)
    unknown = sorted({r.policy_hash for r in rows if r.policy_hash is not None} - _BASELINES.keys())
    if unknown:
        bodies = repo.policy_bodies(session, unknown)
        with _BASELINES_LOCK:
            for h, body in bodies.items():
                _BASELINES[h] = _baseline_rule(body)
    default = _BASELINES.get("") or _BASELINES.setdefault("", _baseline_rule(None))
    out = []
    for r in rows:
        actions, baseline = _BASELINES.get(r.policy_hash or "", default)
        # its own reward error (no total: a component failed), not a member taken down with its group
        own = r.member_reason == REASON_REWARD_ERROR and r.total_reward is None
        out.append((*r, not own and actions.get(r.finish_reason) in baseline))
    return out


@lru_cache(maxsize=1 << 14)
def _hour(epoch_seconds: int) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


def cell_counters(facts: Sequence[Any], sign: float = 1.0) -> dict[CellKey, Counters]:
    """Counters of every cell the trajectories fall in; ``facts`` ordered by group (see ``add_trajectory``)."""
    fine: dict[tuple[str, int, int, str], Counters] = {}
    for _pk, rows in groupby(facts, key=lambda f: f[0]):
        members = list(rows)
        zero_variance = any(f[10] == _ZERO_VARIANCE for f in members)
        for f in members:
            add_trajectory(fine.setdefault((f[2], f[3], f[4], f[5]), {}), sign, f, zero_variance)
    cells: dict[CellKey, Counters] = {}
    for (dataset, version, epoch, finish), c in fine.items():
        for dim, key in (("policy_version", str(version)), ("finish_reason", finish), ("all", "")):
            for cell_dataset, bucket in (
                (dataset, _hour(epoch)),
                (dataset, ALL_TIME),
                (ALL_DATASETS, ALL_TIME),
            ):
                merge_into(cells.setdefault((dim, key, cell_dataset, bucket), {}), c)
    return cells


def merge_into(target: Counters, source: Mapping[str, float]) -> Counters:
    """target += source, key by key."""
    get = target.get
    for key, value in source.items():
        target[key] = get(key, 0.0) + value
    return target


# -- summaries ---------------------------------------------------------------------------------------------
def _moments(n: float, s: float, ss: float) -> tuple[float | None, float | None]:
    """(mean, population std) from count, sum and sum of squares."""
    if n <= 0:
        return None, None
    mean = s / n
    return mean, math.sqrt(max(0.0, ss / n - mean * mean))


def _corr(n: float, sx: float, sxx: float, sy: float, syy: float, sxy: float) -> float | None:
    """Pearson's r from sums; None when either variable is constant (or n < 2)."""
    if n < 2:
        return None
    vx, vy = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    if vx <= 1e-12 * max(1.0, sxx / n) or vy <= 1e-12 * max(1.0, syy / n):
        return None
    return max(-1.0, min(1.0, (sxy / n - (sx / n) * (sy / n)) / math.sqrt(vx * vy)))


def _distribution(n: float, s: float, ss: float, hist: Mapping[str, float]) -> dict[str, float | None]:
    mean, std = _moments(n, s, ss)
    p10, p50, p90 = quantiles(hist)
    if mean is not None and sum(1 for c in hist.values() if c > 0) == 1:
        # every value lies in one bucket, and so does their exact mean: report it (a single value 0.1 is
        # 0.1, not its bucket's representative 0.101; a spread inside one bucket stays within ALPHA)
        p10 = p50 = p90 = mean
    return {"count": round(n), "mean": mean, "std": std, "p10": p10, "p50": p50, "p90": p90}


@lru_cache(maxsize=1 << 16)
def _family(key: str) -> tuple[str, str]:
    """'h.t.p3' -> ('h.t', 'p3'); 'c.s.correct' -> ('c.s', 'correct'); 'hc.p3.correct' -> ('hc:correct', 'p3');
    'drop.stale' -> ('drop', 'stale'); 'fin.length' -> ('fin', 'length'); plain 'n' -> ('', 'n')."""
    head, _, rest = key.partition(".")
    if head in ("h", "c"):
        field, _, sub = rest.partition(".")
        return f"{head}.{field}", sub
    if head == "hc":
        bucket, _, name = rest.partition(".")
        return f"hc:{name}", bucket
    if head in ("drop", "fin"):
        return head, rest
    return "", key


def _split(c: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Counters by family (see ``_family``): {family: {sub: value}}."""
    out: dict[str, dict[str, float]] = {}
    for key, value in c.items():
        family, sub = _family(key)
        part = out.get(family)
        if part is None:
            part = out[family] = {}
        part[sub] = value
    return out


def component_summary(parts: Mapping[str, Mapping[str, float]], name: str) -> dict[str, Any]:
    """Distribution of one component's values, its error rate and its correlation with length."""

    def get(field: str) -> float:
        return parts.get(f"c.{field}", {}).get(name, 0.0)

    records, n = get("n"), get("vn")
    return {
        **_distribution(n, get("s"), get("ss"), parts.get(f"hc:{name}", {})),
        "error_rate": get("e") / records if records > 0 else None,
        "length_reward_corr": _corr(n, get("ls"), get("lss"), get("s"), get("ss"), get("lsv")),
    }


def summarize(c: Mapping[str, float]) -> dict[str, Any]:
    """One row of ``GET /v1/stats`` (every ``by`` except component) from merged counters."""
    parts = _split(c)
    plain = parts.get("", {})
    n = plain.get("n", 0.0)
    t_n, t_s, t_ss = plain.get("t.n", 0.0), plain.get("t.s", 0.0), plain.get("t.ss", 0.0)
    o_n = plain.get("o.n", 0.0)
    names = [name for name, records in sorted(parts.get("c.n", {}).items()) if records >= 0.5]
    return {
        "count": round(n),
        "total": _distribution(t_n, t_s, t_ss, parts.get("h.t", {})),
        "components": {name: component_summary(parts, name) for name in names},
        "pass_rate": plain.get("o.s", 0.0) / o_n if o_n > 0 else None,
        "zero_variance_fraction": plain.get("zv", 0.0) / n if n > 0 else None,
        "drop_fraction": {r: v / n for r, v in sorted(parts.get("drop", {}).items()) if n > 0},
        "truncation_rate": {
            f: v / n for f, v in sorted(parts.get("fin", {}).items()) if f != "stop" and n > 0
        },
        "length": {
            "mean": plain.get("l.s", 0.0) / n if n > 0 else None,
            "p90": quantiles(parts.get("h.l", {}), (0.9,))[0],
        },
        "length_reward_corr": _corr(
            t_n, plain.get("lt.s", 0.0), plain.get("lt.ss", 0.0), t_s, t_ss, plain.get("lt.st", 0.0)
        ),
    }


# -- the rollup --------------------------------------------------------------------------------------------
def _apply(session: Session, group_pks: Sequence[int], sign: float, group_drops: bool = True) -> None:
    cells = cell_counters(facts(session, sorted(set(group_pks)), group_drops), sign)
    repo.add_to_cells(session, cells)


def record_late_drops(session: Session, group_pks: Sequence[int]) -> None:
    """Curated groups that were just dropped as a whole after curation (stale in the queue, refused by a
    trainer as untrainable): call it *after* the status change, same transaction. Their members move from
    kept to dropped (by the group's drop reason) in the rollup, so ``drop_fraction`` counts them."""
    cells = cell_counters(facts(session, sorted(set(group_pks)), group_drops=False), -1.0)
    for key, c in cell_counters(facts(session, sorted(set(group_pks)))).items():
        merge_into(cells.setdefault(key, {}), c)
    repo.add_to_cells(session, cells)


def record_groups(session: Session, group_pks: Sequence[int]) -> None:
    """Add the curated groups among ``group_pks`` to the rollup. The curation stage calls it once per
    curation, after its writes, in the same transaction (groups that are not curated are ignored)."""
    _apply(session, group_pks, 1.0)


def retract_groups(session: Session, group_pks: Sequence[int]) -> None:
    """Take curated groups out of the rollup; call it *before* a rescore / recurate clears their
    decisions and scores (same transaction), so that their next curation is not counted twice."""
    _apply(session, group_pks, -1.0)


def record_archived(session: Session, group_pks: Sequence[int]) -> None:
    """The curated groups among ``group_pks`` are about to leave the hot tables (service.archive): call it
    *before* their rows are deleted, same transaction. Their counters (remedy steps included) stay in
    ``stats_cells`` as they are and are also kept in ``stats_archived_cells``, which ``rebuild`` starts from."""
    pks = sorted(set(group_pks))
    cells = cell_counters(facts(session, pks))
    for key, c in remedy_cells(repo.remedy_facts(session, pks)).items():
        merge_into(cells.setdefault(key, {}), c)
    repo.add_to_archived_cells(session, cells)


# -- the remedy log ----------------------------------------------------------------------------------------
REMEDY_DIM = "remedy"
_REMEDY_PREFIX = "remedy_"


def remedy_cells(steps: Iterable[tuple[str, int, str, str, int]]) -> dict[CellKey, Counters]:
    """Counters of the remedy cells ``(dataset, hour as epoch seconds, remedy, rule, count)`` falls in: per
    remedy (key) and dataset, each hour and all time, and all time over every dataset, as the other cells."""
    cells: dict[CellKey, Counters] = {}
    for dataset, epoch, remedy, rule, n in steps:
        step = rule.removeprefix(_REMEDY_PREFIX)
        for cell_dataset, bucket in ((dataset, _hour(epoch)), (dataset, ALL_TIME), (ALL_DATASETS, ALL_TIME)):
            c = cells.setdefault((REMEDY_DIM, remedy, cell_dataset, bucket), {})
            c[step] = c.get(step, 0.0) + n
    return cells


def stored_remedy_cells(session: Session) -> dict[CellKey, Counters]:
    """The remedy cells of every stored group's logged steps (a rebuild; migration 0017)."""
    return remedy_cells(repo.remedy_facts(session, None))


def record_remedies(session: Session, decisions: Sequence[Mapping[str, Any]]) -> None:
    """Count the remedy steps among decision rows just inserted in this transaction (``created_at`` its
    ``now()``): the one place the remedy log reaches the rollup (service.curation.remedies.log_decisions)."""
    steps = [d for d in decisions if str(d["rule"]).startswith(_REMEDY_PREFIX)]
    if not steps:
        return
    datasets, hour = repo.datasets_and_now(session, sorted({d["group_pk"] for d in steps}))
    repo.add_to_cells(session, remedy_cells((datasets[d["group_pk"]], hour, d["action"], d["rule"], 1) for d in steps))


def rebuild(session: Session, chunk: int = 2_000) -> dict[str, int]:
    """Recompute the whole rollup from the stored groups (other writers wait for it)."""
    repo.lock_cells(session)
    repo.delete_cells(session)
    cells: dict[CellKey, Counters] = {}
    for dim, key, dataset, bucket, counters in repo.archived_cells(session):  # archived groups stay counted
        merge_into(cells.setdefault((dim, key, dataset, bucket), {}), counters)
    after, groups = 0, 0
    while pks := repo.curated_group_pks(session, after, chunk):
        part = cell_counters(facts(session, pks))
        for key, c in part.items():
            merge_into(cells.setdefault(key, {}), c)
        after, groups = pks[-1], groups + len(pks)
    for key, c in stored_remedy_cells(session).items():  # the remedy log: every stored group's, curated or not
        merge_into(cells.setdefault(key, {}), c)
    repo.add_to_cells(session, cells)
    return {"groups": groups, "cells": len(cells)}


# -- the query ---------------------------------------------------------------------------------------------
def since_hour(since: datetime | None) -> datetime | None:
    """The UTC hour that contains ``since`` (naive datetimes are taken as UTC); None (all time) for None
    or a time before the first hourly bucket."""
    if since is None:
        return None
    try:
        aware = since.replace(tzinfo=UTC) if since.tzinfo is None else since.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00 lies before the first representable UTC time
        raise BadRequest("query.since: out of range once converted to UTC (years 1 to 9999)") from None
    hour = aware.replace(minute=0, second=0, microsecond=0)
    return hour if hour > ALL_TIME else None


def _merged(rows: Iterable[Any], key_of: Any) -> dict[Any, Counters]:
    out: dict[Any, Counters] = {}
    for key, dataset, counters in rows:
        row_key = key_of(key, dataset)
        if row_key in out:
            merge_into(out[row_key], counters)
        else:
            out[row_key] = dict(counters)
    return out


# by -> (the cells it reads, the row key of a cell from its (key, dataset))
_SOURCES: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "dataset": ("all", lambda _key, dataset: dataset),
    "component": ("all", lambda _key, _dataset: ""),
    "policy_version": ("policy_version", lambda key, _dataset: int(key)),
    "finish_reason": ("finish_reason", lambda key, _dataset: key),
}


def _rows_of(by: str, counters: Mapping[str, float]) -> list[dict[str, Any]]:
    """The rows one key's counters give: one summary (without its key), or one row per component."""
    if by != "component":
        return [summarize(counters)] if counters.get("n", 0.0) >= 0.5 else []
    parts = _split(counters)
    names = [name for name, records in sorted(parts.get("c.n", {}).items()) if records >= 0.5]
    return [{"key": name, **component_summary(parts, name)} for name in names]


class _SummaryCache:
    """Rows of all-time cells by (database, by, cell, version): a cell that did not change since it was last
    summarised is neither read nor summarised again. Bounded (oldest out first) and thread-safe."""

    def __init__(self, size: int = 8192) -> None:
        self._rows: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self._size, self._lock = size, threading.Lock()

    def get(self, key: tuple[Any, ...]) -> list[dict[str, Any]] | None:
        return self._rows.get(key)

    def put(self, key: tuple[Any, ...], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            while len(self._rows) >= self._size:
                del self._rows[next(iter(self._rows))]
            self._rows[key] = rows
        return rows

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


_CACHE = _SummaryCache()


def clear_summary_cache() -> None:
    """Forget every cached summary (benchmarks measure the cold path with it)."""
    _CACHE.clear()


def _all_time_rows(session: Session, by: str, dataset: str | None) -> list[tuple[Any, list[dict[str, Any]]]]:
    """(row key, rows) of each all-time cell a query without ``since`` reads (one cell per key)."""
    dim, key_of = _SOURCES[by]
    versions = repo.cell_versions(session, dim, dataset, ALL_TIME, per_dataset=by == "dataset")
    db = str(session.get_bind().engine.url)  # one process may serve (tests: see) several databases
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, ds, version in versions:
        hit = _CACHE.get((db, by, dim, key, ds, version))
        if hit is not None:
            found[(key, ds)] = hit
    missing = [(key, ds) for key, ds, _v in versions if (key, ds) not in found]
    for key, ds, version, counters in repo.cells_at(session, dim, missing, ALL_TIME):
        found[(key, ds)] = _CACHE.put((db, by, dim, key, ds, version), _rows_of(by, counters))
    return [(key_of(key, ds), found[(key, ds)]) for key, ds, _v in versions if (key, ds) in found]


def _hourly_rows(
    session: Session, by: str, dataset: str | None, hour: datetime
) -> list[tuple[Any, list[dict[str, Any]]]]:
    """(row key, rows) from the hourly cells from ``hour`` on, merged per key."""
    dim, key_of = _SOURCES[by]
    merged = _merged(repo.read_cells(session, dim, dataset, hour, ALL_TIME, per_dataset=False), key_of)
    return [(key, _rows_of(by, counters)) for key, counters in merged.items()]


def get_stats(
    session: Session, by: str, dataset: str | None = None, since: datetime | None = None
) -> dict[str, Any]:
    """``{"by", "dataset", "since", "rows": [...]}``; rows sorted by key (policy versions numerically)."""
    try:
        check_choice(by, STATS_BY, "by")
    except ValueError as exc:
        raise BadRequest(f"by: {exc}") from None
    hour = since_hour(since)
    keyed = _all_time_rows(session, by, dataset) if hour is None else _hourly_rows(session, by, dataset, hour)
    if by == "component":
        rows = [row for _key, rows_ in keyed for row in rows_]
    else:
        rows = [{"key": key, **row} for key, rows_ in sorted(keyed, key=lambda kr: kr[0]) for row in rows_]
    return {"by": by, "dataset": dataset, "since": hour.isoformat() if hour else None, "rows": rows,
            "remedies": remedies(session, dataset, hour)}


def remedies(session: Session, dataset: str | None, since: datetime | None) -> dict[str, dict[str, int]]:
    """Remedy steps logged (decision rows), by remedy (resample / resume) and step: ``requested``, ``filled``,
    ``unfilled`` (the deadline passed), ``exhausted`` (cut again past the bound); from the ``remedy`` cells
    (hourly from ``since``'s hour, else all time)."""
    merged = _merged(repo.read_cells(session, REMEDY_DIM, dataset, since, ALL_TIME, per_dataset=False),
                     lambda key, _dataset: key)
    return {remedy: {step: int(round(n)) for step, n in sorted(c.items()) if round(n)}
            for remedy, c in sorted(merged.items()) if any(round(n) for n in c.values())}

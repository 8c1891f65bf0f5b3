"""Reward statistics: the rollup against hand-computed values on a seeded dataset, incremental = rebuild,
retraction, filters, concurrent writers, the sketch's accuracy, and the CLI over a real pipeline."""

from __future__ import annotations

import json
import math
import random
import threading
from datetime import UTC, datetime

import numpy as np
import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.cli import stats as stats_cli
from service.stats import service as stats
from service.store.db import get_engine, make_sessionmaker
from service.store.models import Group, Prompt, Reward, Trajectory
from tests.helpers import make_group

H0 = datetime(2026, 1, 1, 10, 15, tzinfo=UTC)
H1 = datetime(2026, 1, 1, 12, 40, tzinfo=UTC)

# (finish_reason, num_tokens, total, outcome, action, reason, {component: value | "error"})
GROUP_A = [  # math, version 1, ready
    ("stop", 10, 1.1, 1.0, "keep", "ok", {"correct": 1.0, "fmt": 0.1}),
    ("stop", 20, 0.1, 0.0, "keep", "ok", {"correct": 0.0, "fmt": 0.1}),
    ("length", 40, 0.0, 0.0, "mask", "finish_reason:length", {"correct": 0.0, "fmt": 0.0}),
    ("env_error", 30, None, None, "drop", "finish_reason:env_error", {"correct": "error", "fmt": 0.0}),
]
GROUP_B = [  # math, version 2, dropped for zero variance
    ("stop", 10, 1.1, 1.0, "drop", "zero_variance", {"correct": 1.0, "fmt": 0.1}),
    ("stop", 30, 1.1, 1.0, "drop", "zero_variance", {"correct": 1.0, "fmt": 0.1}),
]
GROUP_C = [  # code, version 1, ready
    ("stop", 100, 1.0, 1.0, "keep", "ok", {"tests": 1.0}),
    ("stop", 50, 0.0, 0.0, "keep", "ok", {"tests": 0.0}),
]


def _add_group(
    session: Session,
    gid: str,
    dataset: str,
    version: int,
    created: datetime,
    members: list,
    *,
    status: str = "ready",
    drop_reason: str | None = None,
    curated: bool = True,
) -> int:
    if session.get(Prompt, f"p-{dataset}") is None:
        session.add(Prompt(id=f"p-{dataset}", dataset=dataset, messages=[], reference={}, metadata_={}))
        session.flush()
    g = Group(
        id=gid,
        prompt_id=f"p-{dataset}",
        dataset=dataset,
        policy_version=version,
        sampling={},
        metadata_={},
        body_hash="x",
        status=status,
        drop_reason=drop_reason,
        n_trajectories=len(members),
        n_tokens=sum(m[1] for m in members),
        reward_spec_name=dataset,
        reward_spec_version=1,
        created_at=created,
        curated_at=created if curated else None,
    )
    session.add(g)
    session.flush()
    for idx, (finish, tokens, total, outcome, action, reason, comps) in enumerate(members):
        session.add(
            Trajectory(
                group_pk=g.pk,
                idx=idx,
                messages=[],
                final_answer="",
                seq_len=tokens,
                num_tokens=tokens,
                num_turns=1,
                finish_reason=finish,
                metadata_={},
                total_reward=total,
                outcome=outcome,
                action=action,
                reason=reason,
            )
        )
        for name, value in comps.items():
            err = value == "error"
            session.add(
                Reward(
                    group_pk=g.pk,
                    idx=idx,
                    spec_name=dataset,
                    spec_version=1,
                    component=name,
                    kind="k",
                    value=None if err else value,
                    details={},
                    error="sandbox crashed" if err else None,
                    latency_ms=0.0,
                )
            )
    session.flush()
    return g.pk


def seed(session: Session) -> dict[str, int]:
    """Groups A and B (math), C (code), and D which is not curated yet (never counted)."""
    return {
        "A": _add_group(session, "A", "math", 1, H0, GROUP_A),
        "B": _add_group(session, "B", "math", 2, H1, GROUP_B, status="dropped", drop_reason="zero_variance"),
        "C": _add_group(session, "C", "code", 1, H1, GROUP_C),
        "D": _add_group(session, "D", "math", 2, H1, GROUP_A, status="scored", curated=False),
    }


def _rows(client, **params) -> dict:
    r = client.get("/v1/stats", params=params)
    assert r.status_code == 200, r.text
    return {row["key"]: row for row in r.json()["rows"]}


def _corr(x: list[float], y: list[float]) -> float:
    return float(np.corrcoef(x, y)[0, 1])


def _close(value: float, expected: float) -> bool:
    """Within the sketch's relative accuracy."""
    return abs(value - expected) <= stats.ALPHA * abs(expected) + 1e-12


class TestSeededDataset:
    @pytest.fixture
    def seeded(self, session, client):
        pks = seed(session)
        r = client.post("/v1/stats/rebuild")
        assert r.status_code == 200 and r.json()["groups"] == 3, r.text
        return pks

    def test_by_dataset_against_hand_computed_values(self, client, seeded):
        math_row = _rows(client, by="dataset")["math"]
        totals = [1.1, 0.1, 0.0, 1.1, 1.1]  # A's env_error member has no total
        assert math_row["count"] == 6
        t = math_row["total"]
        assert t["count"] == 5
        assert t["mean"] == pytest.approx(0.68) and t["std"] == pytest.approx(float(np.std(totals)))
        assert t["std"] == pytest.approx(math.sqrt(0.2656))
        p10, p50, p90 = np.quantile(totals, stats.QUANTILES)  # 0.04, 1.1, 1.1 (linear interpolation)
        assert _close(t["p10"], p10) and _close(t["p50"], p50) and _close(t["p90"], p90)
        assert math_row["pass_rate"] == pytest.approx(3 / 4)  # A: 1, 0 (its masked member left out); B: 1, 1
        assert math_row["zero_variance_fraction"] == pytest.approx(2 / 6)
        assert math_row["drop_fraction"] == pytest.approx(
            {"finish_reason:env_error": 1 / 6, "zero_variance": 2 / 6}
        )
        assert math_row["truncation_rate"] == pytest.approx({"env_error": 1 / 6, "length": 1 / 6})
        assert math_row["length"]["mean"] == pytest.approx(140 / 6) and math_row["length"]["p90"] == 35  # exact
        lengths = [10, 20, 40, 10, 30]
        assert math_row["length_reward_corr"] == pytest.approx(_corr(lengths, totals))
        correct, fmt = math_row["components"]["correct"], math_row["components"]["fmt"]
        assert (correct["count"], correct["mean"], correct["error_rate"]) == (
            5,
            pytest.approx(0.6),
            pytest.approx(1 / 6),
        )
        assert (correct["p10"], correct["p50"], correct["p90"]) == (0.0, 1.0, 1.0)  # 0 and 1 are exact
        assert correct["length_reward_corr"] == pytest.approx(_corr([10, 20, 40, 10, 30], [1, 0, 0, 1, 1]))
        assert (fmt["count"], fmt["mean"], fmt["error_rate"]) == (6, pytest.approx(0.4 / 6), 0.0)
        assert fmt["std"] == pytest.approx(float(np.std([0.1, 0.1, 0, 0, 0.1, 0.1])))

    def test_by_policy_version_and_finish_reason(self, client, seeded):
        by_version = _rows(client, by="policy_version")
        assert list(by_version) == [1, 2]
        assert (by_version[1]["count"], by_version[2]["count"]) == (6, 2)  # A + C, B
        assert by_version[1]["pass_rate"] == pytest.approx(2 / 4)  # A: 1, 0, (masked), -; C: 1, 0
        assert by_version[2]["zero_variance_fraction"] == 1.0
        assert set(by_version[1]["components"]) == {"correct", "fmt", "tests"}
        by_finish = _rows(client, by="finish_reason")
        assert {k: r["count"] for k, r in by_finish.items()} == {"stop": 6, "length": 1, "env_error": 1}
        assert by_finish["stop"]["total"]["mean"] == pytest.approx((1.1 + 0.1 + 1.1 + 1.1 + 1.0 + 0.0) / 6)
        assert by_finish["env_error"]["total"]["count"] == 0 and by_finish["env_error"]["pass_rate"] is None
        assert by_finish["length"]["truncation_rate"] == {"length": 1.0}

    def test_by_component(self, client, seeded):
        rows = _rows(client, by="component")
        assert list(rows) == ["correct", "fmt", "tests"]
        assert rows["correct"]["count"] == 5 and rows["correct"]["error_rate"] == pytest.approx(1 / 6)
        assert rows["tests"]["mean"] == 0.5 and rows["tests"]["length_reward_corr"] == pytest.approx(1.0)
        assert "total" not in rows["tests"]

    def test_dataset_and_since_filters(self, client, seeded):
        assert list(_rows(client, by="dataset", dataset="code")) == ["code"]
        late = client.get(
            "/v1/stats", params={"by": "policy_version", "since": "2026-01-01T12:59:00+00:00"}
        ).json()
        assert late["since"] == "2026-01-01T12:00:00+00:00"  # the hour that contains it
        assert {r["key"]: r["count"] for r in late["rows"]} == {1: 2, 2: 2}  # C and B; A is from 10:00
        assert _rows(client, by="dataset", since="2026-01-02T00:00:00Z") == {}
        assert {k: r["count"] for k, r in _rows(client, by="policy_version", dataset="math").items()} == {
            1: 4,
            2: 2,
        }
        late_components = _rows(client, by="component", since="2026-01-01T12:00:00Z")  # B and C only
        assert {k: r["count"] for k, r in late_components.items()} == {"correct": 2, "fmt": 2, "tests": 2}
        assert _rows(client, by="dataset", since="1960-01-01T00:00:00Z") == _rows(client, by="dataset")

    def test_unknown_by_is_rejected_naming_the_field(self, client, seeded):
        r = client.get("/v1/stats", params={"by": "color"})
        assert r.status_code == 422 and "by" in r.json()["error"]


class TestRollupMaintenance:
    def test_incremental_equals_rebuild_and_retract_undoes(self, session, client):
        pks = seed(session)
        stats.record_groups(session, [pks["A"], pks["B"], pks["C"], pks["D"]])  # D is not curated: ignored
        incremental = {by: _rows(client, by=by) for by in stats.STATS_BY}
        client.post("/v1/stats/rebuild")
        assert {by: _rows(client, by=by) for by in stats.STATS_BY} == incremental
        stats.retract_groups(session, [pks["A"]])
        math_row = _rows(client, by="dataset")["math"]
        assert math_row["count"] == 2 and math_row["zero_variance_fraction"] == 1.0
        stats.retract_groups(session, [pks["B"], pks["C"]])
        assert all(_rows(client, by=by) == {} for by in stats.STATS_BY)

    def test_recurated_group_counts_once_when_retracted_first(self, session, client):
        pks = seed(session)
        stats.record_groups(session, [pks["A"]])
        stats.retract_groups(session, [pks["A"]])  # a recurate sends A back ...
        session.execute(
            text("UPDATE trajectories SET action = 'keep', reason = 'ok' WHERE group_pk = :pk"),
            {"pk": pks["A"]},
        )
        stats.record_groups(session, [pks["A"]])  # ... and it is curated again, differently
        row = _rows(client, by="dataset")["math"]
        assert row["count"] == 4 and row["drop_fraction"] == {}


def test_concurrent_writers_add_up(fresh_db):
    factory = make_sessionmaker(get_engine(fresh_db))
    with factory.begin() as s:
        pks = seed(s)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(order: list[int]) -> None:
        try:
            barrier.wait()
            for _ in range(5):
                with factory.begin() as s:
                    stats.record_groups(s, order)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(o,)) for o in ([pks["A"], pks["C"]], [pks["C"], pks["A"]])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with factory() as s:
        rows = {r["key"]: r for r in stats.get_stats(s, "dataset")["rows"]}
    assert (rows["math"]["count"], rows["code"]["count"]) == (10 * 4, 10 * 2)
    assert rows["math"]["total"]["mean"] == pytest.approx(1.2 / 3)


def _hist(values) -> dict[str, float]:
    hist: dict[str, float] = {}
    for v in values:
        hist[stats.bucket_of(float(v))] = hist.get(stats.bucket_of(float(v)), 0.0) + 1
    return hist


class TestSketch:
    def test_bucket_value_is_within_alpha(self):
        rng = random.Random(0)
        for _ in range(2000):
            v = rng.choice((-1, 1)) * 10 ** rng.uniform(-6, 6)
            assert abs(stats.bucket_value(stats.bucket_of(v)) - v) <= stats.ALPHA * abs(v) * (1 + 1e-9)
        assert stats.bucket_of(0.0) == "z" and stats.bucket_value("z") == 0.0

    @pytest.mark.parametrize("seed_", range(5))
    def test_quantiles_match_numpy_within_alpha(self, seed_):
        rng = np.random.default_rng(seed_)
        values = np.concatenate([rng.normal(0, 2, 500), rng.integers(0, 4000, 500), [0.0] * 20])
        exact = np.quantile(values, stats.QUANTILES)  # numpy's default: linear interpolation
        for got, want in zip(stats.quantiles(_hist(values)), exact, strict=True):
            assert abs(got - want) <= stats.ALPHA * max(abs(want), 1.0)

    @pytest.mark.parametrize(
        "values",
        [[0, 1], [1, 0, 0], [2, 2, 1, 0, 2], [0.5, 1, 0, 0.25], [-1, 1], [7], [0, 0, 0, 1], [64, 3, 17]],
    )
    def test_small_and_reward_values_are_exact(self, values):
        """p90 of {0, 1} is 0.9 (not 0), and integers <= 2 never give 2.04."""
        qs = (0.0, 0.1, 0.25, 0.5, 0.9, 1.0)
        got = stats.quantiles(_hist(values), qs)
        assert got == pytest.approx(np.quantile(np.array(values, dtype=float), qs), abs=1e-12)
        assert min(values) <= min(got) and max(got) <= max(values)

    @pytest.mark.parametrize("seed_", range(3))
    def test_integer_lengths_are_exact(self, seed_):
        values = np.random.default_rng(seed_).integers(0, 65, 301)
        assert stats.quantiles(_hist(values)) == pytest.approx(np.quantile(values, stats.QUANTILES), abs=1e-9)

    def test_retracted_counts_leave_the_quantiles(self):
        hist = _hist([0, 1, 1, 1])
        hist[stats.bucket_of(1.0)] -= 3  # retract the three 1s
        assert stats.quantiles(hist) == [0.0, 0.0, 0.0]

    def test_empty(self):
        assert stats.quantiles({}) == [None, None, None]
        assert stats.summarize({})["total"]["mean"] is None


def test_cli_over_the_real_pipeline(live_server, scorer, capsys):
    """Ingest over HTTP, score and curate with the real worker, rebuild and print through the CLI."""
    import httpx

    from service.worker.pipeline import drain

    for i, answers in enumerate((["42", "41", "42", "7"], ["42"] * 4)):
        body = make_group(f"cli-{i}", prompt_id=f"cp-{i}", answers=answers)
        assert httpx.post(f"{live_server.url}/v1/groups", json=body).status_code == 201
    drain(make_sessionmaker(get_engine(live_server.db_url)), scorer)
    assert stats_cli.main(["--url", live_server.url, "--rebuild", "--by", "dataset"]) == 0
    out = capsys.readouterr().out
    assert "reward statistics by dataset: 1 rows" in out and "toy" in out
    assert "zero_variance=50.0%" in out and "75.0%" in out  # half the groups solved; pass rate 6/8
    assert stats_cli.main(["--url", live_server.url, "--by", "component", "--json"]) == 0
    body = capsys.readouterr().out
    assert '"key": "correct"' in body and '"count": 8' in body
    assert stats_cli.main(["--url", live_server.url, "--by", "dataset", "--since", "not-a-time"]) == 1
    with make_sessionmaker(get_engine(live_server.db_url))() as s:
        assert s.scalar(select(Group.status).where(Group.id == "cli-1")) == "dropped"


def _cells(url: str) -> dict[tuple, dict]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(text("SELECT dim, key, dataset, bucket, counters FROM stats_cells"))
        return {(r.dim, r.key, r.dataset, r.bucket): r.counters for r in rows}


def test_upgrade_rebuilds_a_rollup_written_with_old_buckets(make_db):
    """Migration 0007 recomputes the rollup from the stored groups: cells written with the previous
    sketch's buckets (here: stale counts and an old bucket key) are replaced, no manual step needed;
    a downgrade empties the rollup (the older code rebuilds it with its own buckets)."""
    from service.store.migrate import downgrade, upgrade

    url = make_db()
    factory = make_sessionmaker(get_engine(url))
    with factory.begin() as session:
        pks = seed(session)
        stats.record_groups(session, list(pks.values()))
    current = _cells(url)
    assert current
    downgrade(url, "0006")
    assert _cells(url) == {}
    with get_engine(url).begin() as conn:  # the rollup as the old code left it
        for (dim, key, dataset, bucket), counters in current.items():
            stale = {**{k: v * 3 for k, v in counters.items()}, "p0": 7.0}
            conn.execute(text("INSERT INTO stats_cells (dim, key, dataset, bucket, counters) "
                              "VALUES (:d, :k, :ds, :b, CAST(:c AS jsonb))"),
                         {"d": dim, "k": key, "ds": dataset, "b": bucket, "c": json.dumps(stale)})
    upgrade(url)
    migrated = _cells(url)
    assert all("p0" not in c for c in migrated.values())
    with factory.begin() as session:
        stats.rebuild(session)
    assert migrated == _cells(url) and set(migrated) == set(current)

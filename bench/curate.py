"""Curation throughput and reward-statistics latency.

Pure part: the vectorised `curate_groups` beside the per-group reference `curate_group` on the same
synthetic groups (agreement checked), both rates and their ratio. Target: >= 50,000 groups of 8 per second.

DB part (`--db`, needs PostgreSQL: DATABASE_URL): groups ingested through the API and scored by the real
scoring stage with a rule-only spec, then timed through `service.worker.pipeline.curate_pass` (claim,
curate, bulk writes, commit), with and without the statistics rollup (`service.stats.service`) side by
side. Target: >= 1,000 groups/s. Then `GET /v1/stats` p50 / p99 over 1M stored trajectories (seeded in
SQL, rollup rebuilt), beside the same aggregate computed from the raw tables. Target: p99 <= 200 ms.

    python -m bench.curate --groups 50000 --size 8
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.curate --db --db-groups 4000
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import service.curation.service as curation
from filters.curate import curate_group, curate_groups
from filters.types import CurationPolicy, GroupDecision, GroupScore, TrajectoryScore
from reward_models.scoring import Scorer
from service.app import create_app
from service.curation.service import curate
from service.scoring import stage as scoring
from service.stats import service as stats
from service.store.db import get_engine, make_sessionmaker, to_sqlalchemy_url
from service.store.migrate import upgrade
from service.worker.pipeline import curate_pass
from service.worker.repository import claim_groups, claim_received

TARGET_GROUPS_PER_S = 50_000
# A plausible mix for a math / agent run: mostly answered, some budget cut-offs, few infra failures.
FINISH_MIX = {
    "stop": 0.82,
    "length": 0.08,
    "max_turns": 0.03,
    "tool_misuse": 0.015,
    "tool_failure": 0.015,
    "env_error": 0.01,
    "timeout": 0.02,
    "aborted": 0.01,
}


def synthetic_groups(n_groups: int, size: int, seed: int = 0) -> list[GroupScore]:
    """n_groups groups of `size` scored trajectories: binary outcome + format component, some
    reward errors (None), per-prompt difficulty so that some groups are all solved / all failed."""
    rng = random.Random(seed)
    reasons, weights = list(FINISH_MIX), list(FINISH_MIX.values())
    groups = []
    for g in range(n_groups):
        difficulty = rng.random()
        trajectories = []
        for i in range(size):
            outcome = 1.0 if rng.random() > difficulty else 0.0
            fmt = rng.choice((0.0, 0.1, 0.2))
            total = None if rng.random() < 0.01 else outcome + fmt
            finish = rng.choices(reasons, weights)[0]
            tokens = 1024 if finish == "length" else rng.randint(50, 1000)
            trajectories.append(
                TrajectoryScore(i, finish, total, {"math": outcome, "format": fmt}, outcome, tokens)
            )
        version = 10 - min(int(rng.expovariate(1.0)), 10)  # mostly fresh, a few past max_staleness
        groups.append(GroupScore(f"g{g}", version, trajectories, max_tokens=1024))
    return groups


def _rate(
    run: Callable[[], list[GroupDecision]], n_groups: int, repeats: int
) -> tuple[float, list[GroupDecision]]:
    """Best-of-`repeats` groups per second of `run`, and its last result."""
    best = math.inf
    result: list[GroupDecision] = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return n_groups / best, result


def _agree(fast: Sequence[GroupDecision], ref: Sequence[GroupDecision]) -> bool:
    """Same statuses, actions and (to 1e-9) advantages."""
    for f, r in zip(fast, ref, strict=True):
        if (f.status, f.drop_reason) != (r.status, r.drop_reason):
            return False
        for a, b in zip(f.trajectories, r.trajectories, strict=True):
            if a.action != b.action or not math.isclose(a.advantage, b.advantage, abs_tol=1e-9):
                return False
    return True


def bench_pure(
    n_groups: int = 50_000, size: int = 8, repeats: int = 3, policy: CurationPolicy | None = None
) -> dict[str, float]:
    """Run the pure-function benchmark; returns groups/s of both paths, their ratio and drop rates."""
    policy = policy or CurationPolicy(max_staleness=4, finish_reason_actions={"max_turns": "penalize"})
    groups = synthetic_groups(n_groups, size)
    n_ref = min(n_groups, 5_000)
    fast_rate, fast = _rate(lambda: curate_groups(groups, policy, 10), n_groups, repeats)
    ref_rate, ref = _rate(lambda: [curate_group(g, policy, 10) for g in groups[:n_ref]], n_ref, repeats)
    if not _agree(fast[:n_ref], ref):
        raise AssertionError("vectorised and reference curation disagree")
    return {
        "groups": n_groups,
        "group_size": size,
        "vectorised_groups_per_s": fast_rate,
        "reference_groups_per_s": ref_rate,
        "speedup": fast_rate / ref_rate,
        "ready_fraction": sum(d.status == "ready" for d in fast) / n_groups,
        "target_met": float(fast_rate >= TARGET_GROUPS_PER_S),
    }


# -- DB part ---------------------------------------------------------------------------------------------------
TARGET_DB_GROUPS_PER_S = 1_000
TARGET_STATS_P99_MS = 200.0
RULE_SPEC = {
    "name": "bench-rule",
    "components": [
        {"name": "boxed", "kind": "rule.format", "params": {"pattern": r"\\boxed\{42\}"}, "outcome": True},
        {"name": "short", "kind": "rule.length", "weight": 0.1, "params": {"target": 32, "limit": 64}},
    ],
}


def _admin(server: str, sql: str) -> None:
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


def _temp_db(server: str) -> str:
    """A new database at the head migration."""
    name = f"bench_curate_{uuid.uuid4().hex[:8]}"
    _admin(server, f'CREATE DATABASE "{name}"')
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return url


def _bench_group(i: int, size: int, rng: random.Random) -> dict:
    """A group of `size` small trajectories: per-prompt difficulty, the finish mix of the pure part."""
    reasons, weights = list(FINISH_MIX), list(FINISH_MIX.values())
    difficulty, trajectories = rng.random(), []
    for _ in range(size):
        answer, n = ("42" if rng.random() > difficulty else "41"), rng.randint(8, 64)
        trajectories.append(
            {
                "messages": [{"role": "assistant", "content": f"so \\boxed{{{answer}}}"}],
                "token_ids": list(range(n)),
                "loss_mask": [1] * n,
                "finish_reason": rng.choices(reasons, weights)[0],
            }
        )
    return {
        "id": f"b{i}",
        "prompt_id": f"bp{i % 1000}",
        "policy_version": 0,
        "prompt": {
            "dataset": "bench",
            "messages": [{"role": "user", "content": "6 * 7?"}],
            "reference": {"answer": "42"},
        },
        "sampling": {"temperature": 1.0, "max_tokens": 64},
        "trajectories": trajectories,
    }


def _ingest_and_score(url: str, n_groups: int, size: int) -> None:
    """Groups through the API, scored by the real scoring stage (rule-only spec), left 'scored'."""
    rng = random.Random(1)
    with TestClient(create_app(database_url=url)) as api:
        assert api.post("/v1/reward-specs", json=RULE_SPEC).status_code == 201
        assert api.put("/v1/datasets/bench", json={"reward_spec": "bench-rule"}).status_code == 200
        for start in range(0, n_groups, 256):
            groups = [_bench_group(i, size, rng) for i in range(start, min(n_groups, start + 256))]
            assert api.post("/v1/groups", json={"groups": groups}).status_code in (200, 201)
    factory = make_sessionmaker(get_engine(url))
    with Scorer(processes=1) as scorer:
        while True:
            with factory.begin() as s:
                pks = claim_received(s, "bench", 512, 600.0, 3)
            if not pks:
                break
            with factory() as s:
                job = scoring.prepare(s, "bench", pks)
            scoring.score(scorer, job)
            with factory.begin() as s:
                scoring.write(s, job, 3, scoring.Backoff())  # scored, not curated: the bench times curation


_RESET = (
    "UPDATE groups SET status = 'scored', drop_reason = NULL, curated_at = NULL, ready_at = NULL,"
    " curation_policy_name = NULL, curation_policy_version = NULL, metric_std = NULL, outcome_mean = NULL"
    " WHERE status IN ('ready', 'dropped');"
    " UPDATE trajectories SET advantage = NULL, action = NULL, reason = NULL;"
    " DELETE FROM decisions; DELETE FROM sampling_requests; DELETE FROM stats_cells;"
    " UPDATE prompts SET n_groups = 0, recent_outcomes = '[]', pass_rate = NULL;"
)


def _curate_rate(url: str, batch: int, with_stats: bool) -> tuple[float, dict[str, int]]:
    """groups/s of curate passes over every 'scored' group (each pass one transaction)."""
    _admin(url, _RESET)
    _admin(url, "VACUUM ANALYZE")
    factory, done, counts = make_sessionmaker(get_engine(url)), 0, {"ready": 0, "dropped": 0}
    start = time.perf_counter()
    while True:
        with factory.begin() as s:
            if with_stats:
                groups = claim_groups(s, "scored", batch)
                result = curate(s, groups)
                stats.record_groups(s, [g.pk for g in groups])
            else:
                r = curate_pass(s, batch)
                result = {"ready": r.ready, "dropped": r.dropped}
        worked = sum(result.values())
        if not worked:
            break
        done += worked
        for k in counts:
            counts[k] += result.get(k, 0)
    return done / (time.perf_counter() - start), counts


def bench_db_curation(server: str, n_groups: int, size: int, batch: int = 256) -> dict[str, float]:
    """The curation stage with its DB writes, plain and with the stats rollup, side by side."""
    url = _temp_db(server)
    try:
        _ingest_and_score(url, n_groups, size)
        wired = "record_groups" in inspect.getsource(curation)
        plain = max(_curate_rate(url, batch, False)[0] for _ in range(2))
        rollup, counts = (plain, {}) if wired else max(_curate_rate(url, batch, True) for _ in range(2))
    finally:
        _admin(server, f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    return {
        "groups": n_groups,
        "curate_pass": plain,
        "with_rollup": rollup,
        "rollup_wired": float(wired),
        "ready": counts.get("ready", 0),
        "dropped": counts.get("dropped", 0),
    }


_SEED = """
SELECT setseed(0.42);
INSERT INTO prompts (id, dataset, messages, reference, metadata)
  SELECT 'sp' || i, 'ds' || (i % 2), '[]', '{}', '{}' FROM generate_series(0, 9999) i;
INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, status, drop_reason,
                    n_trajectories, n_tokens, reward_spec_name, reward_spec_version, created_at, curated_at)
  SELECT 'sg' || i, 'sp' || (i % 10000), 'ds' || (i % 2), i / 500, '{}', '{}', '',
         CASE WHEN i % 5 = 0 THEN 'dropped' ELSE 'ready' END, CASE WHEN i % 5 = 0 THEN 'zero_variance' END,
         8, 0, 'bench', 1, ts, ts
  FROM generate_series(0, :groups - 1) i,
       LATERAL (SELECT timestamptz '2026-11-01' + i * (360000.0 / :groups) * interval '1 second' AS ts) t;
INSERT INTO trajectories (group_pk, idx, messages, final_answer, seq_len, num_tokens, num_turns, finish_reason,
                          metadata, total_reward, outcome, action, reason)
  SELECT pk, j, '[]', '', tokens, tokens, 1, fr, '{}', outcome + 0.5 * judge, outcome,
         CASE WHEN dropped THEN 'drop' WHEN fr = 'stop' THEN 'keep' WHEN fr IN ('length', 'max_turns') THEN 'mask'
              ELSE 'drop' END,
         CASE WHEN dropped THEN 'zero_variance' WHEN fr = 'stop' THEN 'ok' ELSE 'finish_reason:' || fr END
  FROM (SELECT pk, j, dropped, fr, CASE WHEN fr = 'length' THEN 1024 ELSE 50 + floor(r2 * 950)::int END AS tokens,
               CASE WHEN fr IN ('tool_failure', 'env_error', 'timeout', 'aborted') THEN NULL ELSE (r3 < 0.6)::int::float8 END AS outcome,
               round(r4::numeric, 2)::float8 AS judge
        FROM (SELECT g.pk, j, g.status = 'dropped' AS dropped, random() AS r2, random() AS r3, random() AS r4,
                     CASE WHEN r1 < 0.82 THEN 'stop' WHEN r1 < 0.90 THEN 'length' WHEN r1 < 0.93 THEN 'max_turns'
                          WHEN r1 < 0.955 THEN 'tool_misuse' WHEN r1 < 0.96 THEN 'tool_failure' WHEN r1 < 0.97 THEN 'env_error'
                          WHEN r1 < 0.99 THEN 'timeout' ELSE 'aborted' END AS fr
              FROM groups g CROSS JOIN generate_series(0, 7) j CROSS JOIN LATERAL (SELECT random() + 0 * g.pk AS r1) r
             ) a) b;
INSERT INTO rewards (group_pk, idx, spec_name, spec_version, component, kind, value, details, error, latency_ms)
  SELECT group_pk, idx, 'bench', 1, 'correct', 'verifier.math', outcome, '{}'::jsonb,
         CASE WHEN outcome IS NULL THEN 'sandbox failed' END, 0 FROM trajectories
  UNION ALL
  SELECT group_pk, idx, 'bench', 1, 'judge', 'judge.llm', (total_reward - outcome) / 0.5, '{}'::jsonb,
         CASE WHEN outcome IS NULL THEN 'judge unreachable' END, 0 FROM trajectories;
"""

# the same kind of aggregate straight from the raw tables (a subset of the metrics: no components, drops)
_RAW = (
    "SELECT g.policy_version, count(*), avg(t.total_reward), stddev_pop(t.total_reward),"
    " percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP (ORDER BY t.total_reward), avg(t.outcome),"
    " avg(t.num_tokens), percentile_cont(0.9) WITHIN GROUP (ORDER BY t.num_tokens),"
    " corr(t.num_tokens, t.total_reward)"
    " FROM trajectories t JOIN groups g ON g.pk = t.group_pk WHERE g.curated_at IS NOT NULL GROUP BY 1"
)

STATS_QUERIES = {
    "by=dataset": {"by": "dataset"},
    "by=policy_version": {"by": "policy_version"},
    "by=finish_reason": {"by": "finish_reason"},
    "by=component": {"by": "component"},
    "by=policy_version&dataset&since": {
        "by": "policy_version",
        "dataset": "ds1",
        "since": "2026-11-02T12:00:00Z",
    },
}


def _percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, math.ceil(q * len(sorted_ms)) - 1)]


def bench_stats(server: str, n_trajectories: int, requests: int) -> dict[str, object]:
    """GET /v1/stats latency over `n_trajectories` stored trajectories (groups of 8), and the raw SQL."""
    url = _temp_db(server)
    try:
        t0 = time.perf_counter()
        with make_sessionmaker(get_engine(url)).begin() as s:
            for statement in filter(str.strip, _SEED.split(";")):
                s.execute(text(statement), {"groups": n_trajectories // 8})
        _admin(url, "VACUUM ANALYZE")
        seed_s, t0 = time.perf_counter() - t0, time.perf_counter()
        with make_sessionmaker(get_engine(url)).begin() as s:
            built = stats.rebuild(s)
        rebuild_s = time.perf_counter() - t0
        latencies: dict[str, list[float]] = {}
        with TestClient(create_app(database_url=url)) as api:
            for name, params in [
                *STATS_QUERIES.items(),
                *((f"{k} (cold)", v) for k, v in STATS_QUERIES.items()),
            ]:
                api.get("/v1/stats", params=params)  # warm: connections, and the summaries of unchanged cells
                for _ in range(requests):
                    if name.endswith("(cold)"):
                        stats.clear_summary_cache()  # every cell read and summarised again
                    t0 = time.perf_counter()
                    assert api.get("/v1/stats", params=params).status_code == 200
                    latencies.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
        raw = []
        with make_sessionmaker(get_engine(url))() as s:
            for _ in range(3):
                t0 = time.perf_counter()
                s.execute(text(_RAW)).all()
                raw.append((time.perf_counter() - t0) * 1e3)
    finally:
        _admin(server, f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    every = sorted(v for vs in latencies.values() for v in vs)
    per = {k: (_percentile(sorted(v), 0.5), _percentile(sorted(v), 0.99)) for k, v in latencies.items()}
    return {
        "trajectories": n_trajectories,
        "seed_s": seed_s,
        "rebuild_s": rebuild_s,
        **built,
        "per_query": per,
        "p50_ms": _percentile(every, 0.5),
        "p99_ms": _percentile(every, 0.99),
        "raw_ms": sorted(raw)[1],
    }


def _line(label: str, text: str) -> None:
    print(f"  {label:<41}: {text}")


def main_db(n_groups: int, size: int, n_trajectories: int, requests: int) -> None:
    server = to_sqlalchemy_url(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    c = bench_db_curation(server, n_groups, size)
    print(
        f"curation stage with DB writes, {c['groups']:,} groups of {size} (rule-only spec, batches of 256):"
    )
    _line("curate_pass", f"{c['curate_pass']:>9,.0f} groups/s")
    if not c["rollup_wired"]:
        ratio = c["with_rollup"] / c["curate_pass"]
        _line(
            "curate + stats rollup", f"{c['with_rollup']:>9,.0f} groups/s  (ratio {ratio:.2f} side by side)"
        )
    ok = min(c["curate_pass"], c["with_rollup"]) >= TARGET_DB_GROUPS_PER_S
    _line(f"target {TARGET_DB_GROUPS_PER_S:,} groups/s", "met" if ok else "NOT met")
    r = bench_stats(server, n_trajectories, requests)
    print(
        f"GET /v1/stats over {r['trajectories']:,} trajectories ({r['groups']:,} groups; seeded in {r['seed_s']:.0f}"
        f" s, rollup rebuilt in {r['rebuild_s']:.1f} s into {r['cells']:,} cells):"
    )
    for name, (p50, p99) in r["per_query"].items():  # type: ignore[attr-defined]
        _line(name, f"p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")
    _line("all requests", f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms")
    cold = r["per_query"]["by=policy_version (cold)"][0]  # type: ignore[index]
    _line(
        "raw SQL aggregate by version",
        f"{r['raw_ms']:7.1f} ms  (raw / rollup cold p50: {r['raw_ms'] / cold:.0f}x)",
    )
    met = "met" if r["p99_ms"] <= TARGET_STATS_P99_MS else "NOT met"
    _line(f"target p99 {TARGET_STATS_P99_MS:.0f} ms", f"{met} (cold and warm requests together)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", action="store_true", help="also run the DB part (DATABASE_URL)")
    parser.add_argument("--db-groups", type=int, default=4_000, help="groups through the curation stage")
    parser.add_argument("--stats-trajectories", type=int, default=1_000_000)
    parser.add_argument("--stats-requests", type=int, default=40, help="requests per query shape")
    args = parser.parse_args()
    if args.db:
        main_db(args.db_groups, args.size, args.stats_trajectories, args.stats_requests)
    r = bench_pure(args.groups, args.size, args.repeats)
    print(f"curation of {r['groups']:,} groups of {r['group_size']} ({r['ready_fraction']:.0%} ready)")
    print(f"  vectorised curate_groups : {r['vectorised_groups_per_s']:>12,.0f} groups/s")
    print(f"  reference  curate_group  : {r['reference_groups_per_s']:>12,.0f} groups/s")
    print(f"  speedup (side by side)   : {r['speedup']:>12.1f}x")
    print(f"  target {TARGET_GROUPS_PER_S:,} groups/s    : {'met' if r['target_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()

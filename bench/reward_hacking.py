"""Reward-hacking and collapse monitors (issue 24), not a test: synthetic runs through the real service, and
what evaluating the monitors costs with a large store.

Part 1 -- detection. One ``grpo-curator serve`` process (uvicorn, real HTTP) on a fresh database; the real
score / curate worker (``service.worker.pipeline.drain``, in this process) scores what is posted. Each run
publishes trainer metrics (``POST /v1/policy``) and posts 4 groups of 4 per policy version, evaluates the
monitors after every version (``POST /v1/alerts/evaluate``) and records every alert transition. Versions
1-20 are healthy (noisy); from version 21 on the pathology grows step by step:

- ``length``: responses 10 % longer each version, the outcome unchanged (length hacking);
- ``repetition``: 10 % more of the answers per version are a loop;
- ``format``: 10 % more of the answers per version lose the format marker (format collapse);
- ``dominance``: a hackable spec (dataset ``hack``: the format rule weighs 0.5, beside the verifier) whose
  format reward the policy learns to collect (pass rate 0.2 -> 1) while its answers get worse;
- ``entropy``: the policy entropy falls by a quarter each version;
- ``kl``: the KL to the reference grows by half each version;
- ``saturation``: 25 % more of the groups per version all solved (no signal left);
- ``healthy``: the control, ``--healthy-versions`` noisy healthy versions.

The monitor that should catch each one is set to ``pause_leases``; the table shows the version it warned
and went critical at (and how many versions after the onset), the outcome and mean length by then,
whether ``POST /v1/batches/lease`` then answered 503 (the breaker), and every other alert the run raised
(false positives; for the control, all of them).

Part 2 -- cost. Trajectories are seeded in SQL into older policy versions (as a long run leaves them),
around a fixed window of the last ``alert_window_versions`` versions; one evaluation pass
(``service.alerts.service.evaluate``, what the worker runs every ``alert_evaluate_seconds``) is timed with
the store at each size, the window's content the same every time: flat means the pass does not read the
store, only the window. The plans of the window queries are checked for sequential scans.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres nice -n 10 python -m bench.reward_hacking
    DATABASE_URL=... python -m bench.reward_hacking --trajectories 1000000 --seeds 3 --healthy-versions 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from tests.conftest import start_server, stop_server
from tests.service.alerts.helpers import group, healthy_metrics, text_of

START = 21  # the first sick version
MAX_SICK = 12  # sick versions at most (a run stops at its critical alert)
GROUPS = 4
LOOP = "the answer is " * 300
HONEST = {"name": "honest", "components": [
    {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True},
    {"name": "fmt", "kind": "rule.format", "weight": 0.1, "params": {"pattern": "Final answer:", "source": "response"}},
]}
HACKABLE = {"name": "hackable", "components": [
    {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True},
    {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"pattern": "Final answer:", "source": "response"}},
]}
EXPECTED = {"length": "length_hacking", "repetition": "repetition", "format": "format_collapse",
            "dominance": "component_dominance", "entropy": "entropy_collapse", "kl": "kl_spike",
            "saturation": "zero_variance_saturation"}
_TABLES = "prompts, groups, trajectories, prompt_prefixes, rewards, leases, policy_versions, alerts, alert_transitions, monitor_settings"


# -- part 1: detection ------------------------------------------------------------------------------------
def _groups(v: int, pathology: str, rng: random.Random) -> list[dict[str, Any]]:
    k = v - START + 1 if pathology != "healthy" and v >= START else 0  # steps into the pathology
    dataset = "hack" if pathology == "dominance" else "toy"
    out = []
    n_traj = GROUPS * 4
    loops = round(n_traj * min(1.0, 0.1 * k)) if pathology == "repetition" else 0
    unmarked = round(n_traj * min(1.0, 0.1 * k)) if pathology == "format" else 0
    if pathology == "dominance":  # healthy: 1 in 4 use the format; hacked: all of them, answers worse
        marked = round(n_traj * min(1.0, 0.25 + 0.25 * k))
        n_right = round(n_traj * max(0.0, 0.5 - 0.1 * k))  # deterministic, spread over the groups
        right = [(n * 5) % n_traj < n_right for n in range(n_traj)]
    for i in range(GROUPS):
        if pathology == "saturation" and i < round(GROUPS * min(1.0, 0.25 * k)):
            answers = ["42"] * 4
        elif pathology == "dominance":
            answers = ["42" if right[i * 4 + j] else "7" for j in range(4)]
        else:
            right = rng.randint(1, 3)
            answers = ["42"] * right + ["7"] * (4 - right)
            rng.shuffle(answers)
        scale = 1.1 ** k if pathology == "length" else 1.0
        lengths = [max(1, round(rng.gauss(60, 6) * scale)) for _ in answers]
        texts = []
        for j in range(4):
            n = i * 4 + j
            body = LOOP if n < loops else text_of(rng, rng.randint(200, 1500))
            if pathology == "dominance":
                mark = (n * 7 + 3) % n_traj < marked  # spread over the groups
            else:
                mark = n >= unmarked
            texts.append(f"{body} Final answer:" if mark else body)
        out.append(group(f"g-{v}-{i}", v, answers, lengths=lengths, texts=texts, prompt_id=f"p-{i}",
                         dataset=dataset))
    return out


def _metrics(v: int, pathology: str, rng: random.Random) -> dict[str, float]:
    m = healthy_metrics(rng)
    k = v - START + 1 if v >= START else 0
    if pathology == "entropy" and k:
        m["entropy"] *= 0.75 ** k
    if pathology == "kl" and k:
        m["kl_ref"] *= 1.5 ** k
    return m


def _reset(engine: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {_TABLES} RESTART IDENTITY CASCADE"))


def one_run(http: httpx.Client, factory: Any, scorer: Any, engine: Any, pathology: str, seed: int,
            healthy_versions: int) -> dict[str, Any]:
    from service.worker.pipeline import drain

    _reset(engine)
    rng = random.Random(seed)
    expected = EXPECTED.get(pathology)
    if expected:
        r = http.put(f"/v1/monitors/{expected}", json={"dataset": None, **_defaults(http, expected),
                                                       "action": "pause_leases"})
        assert r.status_code == 200, r.text
    last = healthy_versions if pathology == "healthy" else START + MAX_SICK - 1
    firsts: dict[tuple[str, str | None, str], int] = {}
    outcome: dict[int, float] = {}
    length: dict[int, float] = {}
    breaker = None
    t0 = time.monotonic()
    for v in range(1, last + 1):
        assert http.post("/v1/policy", json={"version": v, "metrics": _metrics(v, pathology, rng)}).status_code == 201
        groups = _groups(v, pathology, rng)
        r = http.post("/v1/groups", json={"groups": groups})
        assert r.status_code in (200, 201), r.text
        trajs = [t for g in groups for t in g["trajectories"]]
        outcome[v] = statistics.fmean(t["messages"][-1]["content"].endswith("{42}") for t in trajs)
        length[v] = statistics.fmean(sum(t["loss_mask"]) for t in trajs)  # response tokens
        drain(factory, scorer)
        r = http.post("/v1/alerts/evaluate")
        assert r.status_code == 200, r.text
        for c in r.json()["transitions"]:
            firsts.setdefault((c["alert"]["monitor"], c["alert"]["dataset"], c["to"]), v)
        crit = firsts.get((expected, None, "critical")) if expected else None
        if crit is not None and breaker is None:
            lease = http.post("/v1/batches/lease", json={"trainer_id": "bench", "max_groups": 1})
            breaker = lease.status_code
        if crit is not None:
            break
    warn = min((v for (m, d, s), v in firsts.items() if m == expected and d is None), default=None)
    crit = firsts.get((expected, None, "critical")) if expected else None
    others = sorted({f"{m}{'' if d is None else '@' + d}" for (m, d, s), v in firsts.items()
                     if m != expected and s != "resolved"})
    at = crit or v
    return {"pathology": pathology, "seed": seed, "monitor": expected or "-", "versions": v,
            "warning_at": warn, "critical_at": crit,
            "to_detect": None if warn is None else warn - START + 1, "to_critical": None if crit is None else crit - START + 1,
            "outcome_then": outcome.get(at), "outcome_before": statistics.fmean(outcome[x] for x in range(1, min(START, at + 1))),
            "length_then": length.get(at), "length_before": statistics.fmean(length[x] for x in range(1, min(START, at + 1))),
            "breaker": breaker, "other_alerts": others, "seconds": time.monotonic() - t0}


def _defaults(http: httpx.Client, monitor: str) -> dict[str, float]:
    row = next(m for m in http.get("/v1/monitors").json()["monitors"] if m["monitor"] == monitor and m["dataset"] is None)
    return {"warning": row["default_warning"], "critical": row["default_critical"]}


def detection(db: str, seeds: int, healthy_versions: int, pathologies: list[str]) -> list[dict[str, Any]]:
    from reward_models.scoring import Scorer
    from service.store.db import get_engine, make_sessionmaker

    server = start_server(db)
    engine = create_engine(db)
    rows = []
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http, Scorer(processes=1, timeout_s=20) as scorer:
            for spec, dataset in ((HONEST, "toy"), (HACKABLE, "hack")):
                assert http.post("/v1/reward-specs", json=spec).status_code == 201
                assert http.put(f"/v1/datasets/{dataset}", json={"reward_spec": spec["name"]}).status_code == 200
            factory = make_sessionmaker(get_engine(db))
            for pathology in pathologies:
                for seed in range(seeds):
                    rows.append(one_run(http, factory, scorer, engine, pathology, seed, healthy_versions))
                    print(_fmt(rows[-1]), flush=True)
    finally:
        stop_server(server)
        engine.dispose()
    return rows


def _fmt(r: dict[str, Any]) -> str:
    def f(x: Any, spec: str = "") -> str:
        return "-" if x is None else format(x, spec)

    return (f"{r['pathology']:>10} {r['seed']:>4} {r['monitor']:>24} {f(r['warning_at']):>6} {f(r['critical_at']):>6}"
            f" {f(r['to_detect']):>6} {f(r['to_critical']):>6} {f(r['outcome_before'], '.2f'):>5}->{f(r['outcome_then'], '.2f'):<5}"
            f" {f(r['length_before'], '.0f'):>5}->{f(r['length_then'], '.0f'):<6} {f(r['breaker']):>7}"
            f" {r['versions']:>5} {r['seconds']:>6.1f}  {', '.join(r['other_alerts']) or '-'}")


HEADER = (f"{'run':>10} {'seed':>4} {'monitor':>24} {'warn@':>6} {'crit@':>6} {'+warn':>6} {'+crit':>6}"
          f" {'outcome':>11} {'length':>12} {'breaker':>7} {'vers':>5} {'s':>6}  other alerts")


# -- part 2: cost ------------------------------------------------------------------------------------------
_SEED_PROMPTS = """INSERT INTO prompts (id, dataset, messages, reference, metadata)
  SELECT 'cp' || i, 'toy', '[]', '{}', '{}' FROM generate_series(0, 99) i ON CONFLICT DO NOTHING"""
# groups of 8 at versions [lo, hi], :n of them, ids from :start; 8 trajectories and 2 rewards each
_SEED_GROUPS = """INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, status,
                    n_trajectories, n_tokens, reward_spec_name, reward_spec_version, metric_std, created_at, scored_at, curated_at)
  SELECT 'cg' || i, 'cp' || (i % 100), 'toy', :lo + (i % (:hi - :lo + 1)), '{}', '{}', '', 'consumed', 8, 480,
         'honest', 1, 0.5, now(), now(), now()
  FROM generate_series(:start, :start + :n - 1) i"""
_SEED_TRAJ = """INSERT INTO trajectories (group_pk, idx, messages, final_answer, seq_len, num_tokens, num_turns,
                    finish_reason, metadata, total_reward, outcome, action, reason)
  SELECT g.pk, j, '[]', repeat('word ', (40 + (g.pk + j) % 200)::int) || 'Final answer:', 64, 40 + (g.pk + j) % 40, 1,
         'stop', '{}', ((g.pk + j) % 2)::float8 + 0.1, ((g.pk + j) % 2)::float8, 'keep', 'ok'
  FROM groups g CROSS JOIN generate_series(0, 7) j WHERE g.pk > :after"""
_SEED_REWARDS = """INSERT INTO rewards (group_pk, idx, spec_name, spec_version, component, kind, value, details, latency_ms)
  SELECT group_pk, idx, 'honest', 1, 'correct', 'verifier.math', outcome, '{}'::jsonb, 0 FROM trajectories WHERE group_pk > :after
  UNION ALL
  SELECT group_pk, idx, 'honest', 1, 'fmt', 'rule.format', 1.0, '{}'::jsonb, 0 FROM trajectories WHERE group_pk > :after"""


def _seed(conn: Any, lo: int, hi: int, n_groups: int, start: int) -> None:
    after = conn.execute(text("SELECT coalesce(max(pk), 0) FROM groups")).scalar_one()
    conn.execute(text(_SEED_GROUPS), {"lo": lo, "hi": hi, "n": n_groups, "start": start})
    conn.execute(text(_SEED_TRAJ), {"after": after})
    conn.execute(text(_SEED_REWARDS), {"after": after})


def _time_pass(factory: Any, repeats: int) -> tuple[float, float]:
    from service.alerts import service as alerts

    times = []
    for _ in range(repeats):
        with factory() as s:
            t0 = time.perf_counter()
            alerts.evaluate(s)
            times.append(time.perf_counter() - t0)
            s.rollback()  # every pass sees the same state
    return statistics.median(times), max(times)


def _scans(conn: Any, lo: int, hi: int) -> list[str]:
    """Sequential scans of the big tables in the window queries' plans (the first window group pks)."""
    pks = [r[0] for r in conn.execute(text("SELECT pk FROM groups WHERE policy_version BETWEEN :lo AND :hi"),
                                      {"lo": lo, "hi": hi})]
    queries = {
        "window_groups": ("SELECT pk, dataset FROM groups WHERE policy_version BETWEEN :lo AND :hi", {"lo": lo, "hi": hi}),
        "window_trajectories": ("SELECT group_pk, idx FROM trajectories WHERE group_pk = ANY(:pks)", {"pks": pks}),
        "window_rewards": ("SELECT group_pk, idx FROM rewards WHERE group_pk = ANY(:pks)", {"pks": pks}),
    }
    found = []
    for name, (sql, args) in queries.items():
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql), args))
        for table in ("groups", "trajectories", "rewards"):
            if f"Seq Scan on {table}" in plan:
                found.append(f"{name}: Seq Scan on {table}")
    return found


def cost(db: str, sizes: list[int], window_versions: int, repeats: int) -> list[dict[str, Any]]:
    from service.settings import get_settings
    from service.store.db import get_engine, make_sessionmaker

    engine = create_engine(db)
    _reset(engine)
    as_of = 100_000  # the current version; older versions hold the bulk
    lo = as_of - window_versions + 1
    with engine.begin() as conn:
        conn.execute(text(_SEED_PROMPTS))
        conn.execute(text("INSERT INTO reward_specs (name, version, body, body_hash) SELECT 'honest', 1,"
                          " CAST(:b AS jsonb), 'bench' WHERE NOT EXISTS (SELECT 1 FROM reward_specs WHERE name = 'honest')"),
                     {"b": json.dumps(HONEST)})
        conn.execute(text("INSERT INTO policy_versions (version, metrics) SELECT v, jsonb_build_object('entropy', 1.0,"
                          " 'kl_ref', 0.02, 'grad_norm', 1.0) FROM generate_series(:lo, :hi) v"), {"lo": lo, "hi": as_of})
        _seed(conn, lo, as_of, window_versions * GROUPS, 0)  # the window: 4 groups of 8 per version
    window_traj = window_versions * GROUPS * 8
    factory = make_sessionmaker(get_engine(db))
    get_settings()
    rows, stored, next_id = [], window_traj, window_versions * GROUPS
    for size in sorted(sizes):
        if size > stored:
            n_groups = (size - stored) // 8
            t0 = time.perf_counter()
            with engine.begin() as conn:
                _seed(conn, 0, lo - 1, n_groups, next_id)
            next_id += n_groups
            stored += n_groups * 8
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE groups, trajectories, rewards"))
            seed_s = time.perf_counter() - t0
        else:
            seed_s = 0.0
        median, worst = _time_pass(factory, repeats)
        with engine.connect() as conn:
            scans = _scans(conn, lo, as_of)
        rows.append({"trajectories": stored, "window_trajectories": window_traj, "pass_median_s": median,
                     "pass_max_s": worst, "seq_scans": scans, "seed_s": seed_s})
        print(f"{stored:>12,} {window_traj:>8,} {median * 1000:>10.1f} {worst * 1000:>9.1f} {seed_s:>7.1f}"
              f"  {', '.join(scans) or 'none'}", flush=True)
    engine.dispose()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--healthy-versions", type=int, default=40)
    ap.add_argument("--pathologies", nargs="+", default=[*EXPECTED, "healthy"], choices=[*EXPECTED, "healthy"])
    ap.add_argument("--trajectories", type=int, default=100_000, help="the largest store size of part 2 (1M: 1000000)")
    ap.add_argument("--repeats", type=int, default=5, help="evaluation passes timed per store size")
    ap.add_argument("--skip-detection", action="store_true")
    ap.add_argument("--skip-cost", action="store_true")
    args = ap.parse_args(argv)
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        print("set DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    from service.settings import get_settings
    from service.store.db import to_sqlalchemy_url
    from service.store.dbadmin import create_database, drop_database
    from service.store.migrate import upgrade

    admin = to_sqlalchemy_url(server_url)
    db = create_database(admin, "gcrh")
    try:
        upgrade(db)
        if not args.skip_detection:
            print(HEADER)
            rows = detection(db, args.seeds, args.healthy_versions, args.pathologies)
            control = [r for r in rows if r["pathology"] == "healthy"]
            missed = [r["pathology"] for r in rows if r["pathology"] != "healthy" and r["critical_at"] is None]
            print(f"healthy control: {sum(r['versions'] for r in control)} versions,"
                  f" {sum(len(r['other_alerts']) for r in control)} false-positive alerts;"
                  f" pathologies never critical: {missed or 'none'}")
        if not args.skip_cost:
            w = get_settings().alert_window_versions
            sizes = sorted({max(args.trajectories // 10, w * GROUPS * 8), args.trajectories})
            print(f"\n{'stored':>12} {'window':>8} {'pass ms':>10} {'max ms':>9} {'seed s':>7}  sequential scans")
            rows2 = cost(db, sizes, w, args.repeats)
            base = rows2[0]["pass_median_s"] or 1e-9
            print(f"pass time at {rows2[-1]['trajectories']:,} vs {rows2[0]['trajectories']:,} stored:"
                  f" x{rows2[-1]['pass_median_s'] / base:.2f} (flat: about 1)")
    finally:
        from service.store.db import dispose_engine

        dispose_engine(db)
        drop_database(admin, db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

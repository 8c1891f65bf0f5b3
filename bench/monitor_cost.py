"""Monitor cost benchmark (not a test, issue 24): what the training-health monitors add to a worker pass.

One private database (created, migrated, dropped at the end). At each checkpoint of ``--sizes`` (stored
trajectories) the history is bulk-loaded with ``bench.scale``'s loader (binary COPY, groups of 8 x 64 token
ids, 4 datasets, a new policy version every 10,000 groups, consumed), then given what the monitors read:
``outcome`` = the stored total reward and one ``verifier.math`` reward row per trajectory; every policy
version up to the newest is published with trainer metrics (entropy, KL, clip fractions, grad norm,
behaviour KL). With 10,000 groups a version and the default 50-version window, every stored group up to
4 M trajectories is inside the window: the monitors read all of it.

Then ``--passes`` timed passes (one warm-up pass more, not counted) of each, interleaved:

* (a) ``worker``: one worker pass (``service.worker.pipeline.run_once``: claim ``--batch`` newly received
  groups, score them with a rule-only spec, write + curate, maintenance) while the monitors are not due;
* (c) ``worker+monitors``: the same pass with the monitors due (``evaluate_due`` runs inside it, as the
  worker runs it every ``alert_evaluate_seconds``);
* (b) ``monitors``: ``service.alerts.service.evaluate`` alone, in its own transaction, over the stored data.

The received groups are posted through the API (in-process, before timing) at the current policy version.
Prints p50 / p99 per checkpoint and what the monitors cost per worker pass amortised over the default
``alert_evaluate_seconds``; writes ``--out``/monitor_cost.json.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.monitor_cost
    DATABASE_URL=... python -m bench.monitor_cost --sizes 100000 --passes 10
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench import scale
from service.store.dbadmin import create_database, drop_database, libpq_url

ROOT = Path(__file__).resolve().parents[1]
SPEC = {  # rule-only: no outside calls, so the pass times the service's own work
    "name": "moncost-rule",
    "components": [
        {"name": "even", "kind": "rule.format", "params": {"pattern": r"[02468]$"}, "outcome": True},
        {"name": "short", "kind": "rule.length", "weight": 0.1, "params": {"target": 32, "limit": 64}},
    ],
}
METRICS = ("entropy", "kl_ref", "clip_frac_low", "clip_frac_high", "grad_norm", "behaviour_kl")


def _pct(values: list[float], q: float) -> float:
    return scale._pct(values, q)


def enrich(url: str, first_pk: int, last_pk: int) -> float:
    """What the worker would have stored for loaded groups: outcomes and one reward row per trajectory."""
    t0 = time.perf_counter()
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("UPDATE trajectories SET outcome = total_reward WHERE group_pk BETWEEN %s AND %s",
                     (first_pk, last_pk))
        conn.execute(
            "INSERT INTO rewards (group_pk, idx, spec_name, spec_version, component, kind, value, details,"
            " latency_ms) SELECT group_pk, idx, 'moncost', 1, 'correct', 'verifier.math', outcome, '{}', 0"
            " FROM trajectories WHERE group_pk BETWEEN %s AND %s", (first_pk, last_pk))
        conn.commit()
    return time.perf_counter() - t0


def publish_versions(url: str, upto: int, rng: np.random.Generator) -> int:
    """Publish every version up to ``upto`` (those not yet published) with trainer metrics; -> the newest."""
    from service.policy import service as policy
    from service.policy.schemas import PolicyIn
    from service.store.db import get_engine, make_sessionmaker

    with make_sessionmaker(get_engine(url)).begin() as session:
        for v in range(policy.current_version(session) + 1, upto + 1):
            metrics = {m: float(x) for m, x in zip(METRICS, [1.2 - 0.01 * v, 0.02, 0.03, 0.02, 1.0, 0.001]
                                                  * (1 + 0.05 * rng.standard_normal(len(METRICS))), strict=True)}
            policy.publish(session, PolicyIn(version=v, metrics=metrics))
        return policy.current_version(session)


def receive(url: str, tag: str, n_groups: int, version: int, tokens: int) -> None:
    """``n_groups`` new groups through the API (in-process), status received, at ``version``."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    groups = scale.bodies(tag, n_groups, tokens, seed=len(tag) + n_groups)
    for g in groups:
        g["policy_version"] = version
    with TestClient(create_app(database_url=url)) as api:
        for start in range(0, n_groups, 128):
            r = api.post("/v1/groups", json={"groups": groups[start:start + 128]})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"POST /v1/groups: {r.status_code} {r.text[:300]}")


def setup_spec(url: str) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(database_url=url)) as api:
        if (r := api.post("/v1/reward-specs", json=SPEC)).status_code != 201:
            raise RuntimeError(f"POST /v1/reward-specs: {r.status_code} {r.text[:300]}")
        for d in scale.DATASETS:
            if (r := api.put(f"/v1/datasets/{d}", json={"reward_spec": SPEC["name"]})).status_code != 200:
                raise RuntimeError(f"PUT /v1/datasets/{d}: {r.status_code} {r.text[:300]}")


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from reward_models.scoring import Scorer
    from service.store.db import get_engine, make_sessionmaker
    from service.worker.pipeline import PassResult, PipelineConfig

    factory = make_sessionmaker(get_engine(url))
    cfg = PipelineConfig(batch=args.batch)
    times: dict[str, list[float]] = {"worker": [], "worker+monitors": [], "monitors": []}
    worked = {"worker": PassResult(), "worker+monitors": PassResult()}
    failures = _MaintenanceFailures()
    errors: list[str] = []
    logging.getLogger("service.worker.pipeline").addFilter(failures)
    try:
        with Scorer(processes=1) as scorer:
            _passes(factory, scorer, cfg, args, times, worked, failures, errors)
    finally:
        logging.getLogger("service.worker.pipeline").removeFilter(failures)
    transitions, version = failures.transitions, failures.version
    row: dict[str, Any] = {k: {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99), "passes": len(v)}
                           for k, v in times.items()}
    for mode, r in worked.items():
        row[mode].update(ready=r.ready, dropped=r.dropped, scored=r.scored, failed=r.failed,
                         curation_errors=r.curation_errors)
    # a failed evaluation is timed too (to the failure): the worker logs it and goes on, so do we
    row["worker+monitors"]["evaluate_failures"] = failures.count
    row["monitors"].update(version=version, transitions=transitions, errors=len(errors),
                           error=errors[0] if errors else None)
    row["added_p50_ms"] = row["worker+monitors"]["p50_ms"] - row["worker"]["p50_ms"]
    return row


class _MaintenanceFailures(logging.Filter):
    """Counts the worker's 'maintenance task evaluate_due failed' records and keeps their (possibly
    megabyte-long) tracebacks off the terminal; everything else passes."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.transitions, self.version = 0, 0, None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and "evaluate_due" in str(record.args):
            self.count += 1
            return False
        return True


def _passes(factory: Any, scorer: Any, cfg: Any, args: argparse.Namespace, times: dict[str, list[float]],
            worked: dict[str, Any], failures: _MaintenanceFailures, errors: list[str]) -> None:
    from service.alerts import service as alerts
    from service.worker.pipeline import run_once

    for i in range(args.passes + 1):  # pass 0 warms every path up, not counted
        for mode in ("worker", "worker+monitors"):
            # the worker's own schedule: evaluate_due runs when alert_evaluate_seconds have passed
            alerts._last_run[0] = 0.0 if mode == "worker+monitors" else time.monotonic()
            before = failures.count
            t0 = time.perf_counter()
            r = run_once(factory, scorer, cfg)
            dt = time.perf_counter() - t0
            if i:
                times[mode].append(dt)
                worked[mode].add(r)
            elif mode == "worker+monitors":
                failures.count = before  # the warm-up's failure is not counted either
        t0 = time.perf_counter()
        try:
            with factory.begin() as session:
                out = alerts.evaluate(session)
            failures.transitions += len(out.transitions)
            failures.version = out.version
        except Exception as exc:  # noqa: BLE001 - measured and reported, as the worker logs it
            if i:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        if i:
            times["monitors"].append(time.perf_counter() - t0)


def report(rows: list[dict[str, Any]], args: argparse.Namespace, evaluate_every_s: float) -> None:
    print(f"shape: groups of {scale.PER_GROUP} x {args.tokens} token ids, {scale.GROUPS_PER_VERSION} groups a "
          f"version; worker pass = run_once over {args.batch} newly received groups (rule-only spec); "
          f"{args.passes} passes each (+1 warm-up); ms")
    print(f"{'stored':>9} {'versions':>8} {'load s':>7} {'worker p50|p99':>17} {'+monitors p50|p99':>19} "
          f"{'monitors p50|p99':>18} {'added p50':>9} {'amortised':>9}")
    for r in rows:
        w, wm, m = r["worker"], r["worker+monitors"], r["monitors"]
        print(f"{r['db']['trajectories']:>9} {r['versions']:>8} {r['load_s']:>7.0f} {w['p50_ms']:>8.1f}|{w['p99_ms']:>8.1f} "
              f"{wm['p50_ms']:>9.1f}|{wm['p99_ms']:>9.1f} {m['p50_ms']:>8.1f}|{m['p99_ms']:>9.1f} "
              f"{r['added_p50_ms']:>9.1f} {r['amortised_share']:>8.1%}")
        if m["errors"] or wm["evaluate_failures"]:
            print(f"  monitors FAILED at {r['db']['trajectories']}: {m['errors']}/{m['passes']} direct evaluations, "
                  f"{wm['evaluate_failures']}/{wm['passes']} inside the worker pass (logged and skipped by the "
                  f"worker); times above are to the failure: {m['error']}")
    print(f"amortised: the monitors' p50 over alert_evaluate_seconds={evaluate_every_s:g} s, the share of a "
          "busy worker's time they take at the default schedule")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.monitor_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000],
                    help="checkpoints: stored trajectories (ascending; default 100000 1000000)")
    ap.add_argument("--tokens", type=int, default=64, help="token ids per trajectory (default 64)")
    ap.add_argument("--batch", type=int, default=32, help="received groups per worker pass (default 32, the "
                    "worker_batch_groups default)")
    ap.add_argument("--passes", type=int, default=10, help="timed passes of each kind per checkpoint (default 10)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="directory for monitor_cost.json")
    args = ap.parse_args(argv)
    if args.sizes != sorted(args.sizes) or args.sizes[0] < scale.PER_GROUP:
        ap.error("--sizes: ascending trajectory counts, each at least 8")
    if args.tokens <= scale.PROMPT_TOKENS:
        ap.error(f"--tokens: must be more than {scale.PROMPT_TOKENS} (the prompt part)")
    if args.batch < 1:
        ap.error("--batch: at least 1 group")
    if args.passes < 1:
        ap.error("--passes: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from service.settings import get_settings
    from service.store.db import dispose_engine, to_sqlalchemy_url
    from service.store.migrate import upgrade

    server = to_sqlalchemy_url(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    url = create_database(server, "moncost")
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    try:
        upgrade(url)
        with psycopg.connect(libpq_url(url)) as conn:
            scale.seed_prompts(conn)
        setup_spec(url)
        loaded = 0
        for size in args.sizes:
            n_groups = max(size // scale.PER_GROUP - loaded // scale.PER_GROUP, 0)
            with psycopg.connect(libpq_url(url)) as conn:
                next_pk = 1 + conn.execute("SELECT coalesce(max(pk), 0) FROM groups").fetchone()[0]  # type: ignore[index]
            load_s = scale.load(url, next_pk, n_groups, args.tokens, rng)
            load_s += enrich(url, next_pk, next_pk + n_groups - 1)
            loaded += n_groups * scale.PER_GROUP
            version = publish_versions(url, 1 + (next_pk + n_groups - 1) // scale.GROUPS_PER_VERSION, rng)
            receive(url, f"new-{size}", 2 * (args.passes + 1) * args.batch, version, args.tokens)
            scale.vacuum(url)
            print(f"loaded {loaded} trajectories ({n_groups} groups more in {load_s:.0f} s, with outcomes and "
                  f"rewards); versions 1..{version}; measuring", flush=True)
            row = {"size": size, "versions": version, "load_s": load_s, **measure(url, args), "db": scale.counts(url)}
            row["amortised_share"] = row["monitors"]["p50_ms"] / 1e3 / get_settings().alert_evaluate_seconds
            rows.append(row)
        dispose_engine(url)
    finally:
        drop_database(server, url)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings = get_settings()
    (args.out / "monitor_cost.json").write_text(json.dumps({
        "config": config, "per_group": scale.PER_GROUP, "groups_per_version": scale.GROUPS_PER_VERSION,
        "alert_window_versions": settings.alert_window_versions,
        "alert_evaluate_seconds": settings.alert_evaluate_seconds, "checkpoints": rows}, indent=2))
    report(rows, args, settings.alert_evaluate_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

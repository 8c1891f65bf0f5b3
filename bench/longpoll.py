"""Long-poll benchmark (not a test): N concurrent waiting leases against one API process while ingest runs.

Starts ``grpo-curator serve`` (one process, no embedded worker, so nothing becomes ready and every lease
waits its full ``wait_seconds``) on a fresh database. For each N (0 = the baseline) a separate process
keeps N long polls open (``wait_seconds`` 5, re-polling on 204, honouring Retry-After on 429) while this
process ingests groups of 8 trajectories from 2 threads and polls /healthz every 50 ms. Prints, side by
side: 5xx and 429 counts, /healthz p50 / p99, and ingest groups/s against the no-poller baseline.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres nice -n 10 python -m bench.longpoll
    DATABASE_URL=... python -m bench.longpoll --polls 100 300 500 --seconds 15 --max-waiters 1024
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections import Counter

import httpx

from service.store.dbadmin import create_database, drop_database
from tests.conftest import start_server, stop_server
from tests.helpers import make_group

WAIT_S = 5.0


async def _one_poller(http: httpx.AsyncClient, i: int, until: float, counts: Counter) -> None:
    while time.monotonic() < until:
        body = {"trainer_id": f"bench-{i}", "max_groups": 1, "wait_seconds": min(WAIT_S, max(until - time.monotonic(), 0))}
        try:
            r = await http.post("/v1/batches/lease", json=body, timeout=WAIT_S + 60)
        except httpx.HTTPError as exc:
            counts[f"transport:{type(exc).__name__}"] += 1
            await asyncio.sleep(0.5)
            continue
        counts[r.status_code] += 1
        if r.status_code == 429:
            await asyncio.sleep(float(r.headers.get("Retry-After", "1")))


def _pollers(url: str, n: int, seconds: float, out: multiprocessing.Queue) -> None:
    os.nice(5)  # the load generator yields the shared CPUs to the server under test
    async def main() -> Counter:
        counts: Counter = Counter()
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        async with httpx.AsyncClient(base_url=url, limits=limits) as http:
            until = time.monotonic() + seconds
            await asyncio.gather(*(_one_poller(http, i, until, counts) for i in range(n)))
        return counts

    out.put(dict(asyncio.run(main())))


def _ingest(url: str, until: float, tag: str, done: list[int], errors: Counter) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        i = 0
        while time.monotonic() < until:
            r = http.post("/v1/groups", json=make_group(f"{tag}-{i}", prompt_id=f"bp-{tag}-{i % 50}", n=8))
            if r.status_code == 201:
                done.append(1)
            else:
                errors[r.status_code] += 1
            i += 1


def _health(url: str, until: float, latencies: list[float], errors: Counter) -> None:
    with httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while time.monotonic() < until:
            start = time.monotonic()
            r = http.get("/healthz")
            latencies.append(time.monotonic() - start)
            if r.status_code != 200:
                errors[r.status_code] += 1
            time.sleep(0.05)


def _db_probe(db_url: str, until: float, latencies: list[float]) -> None:
    """What /healthz does inside, timed from here beside it: a new connection + the schema read."""
    import psycopg

    while time.monotonic() < until:
        start = time.monotonic()
        with psycopg.connect(db_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT version_num FROM alembic_version").fetchone()
        latencies.append(time.monotonic() - start)
        time.sleep(0.05)


def _p99(values: list[float]) -> float:
    lat = sorted(values)
    return lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")


def run_level(url: str, n: int, seconds: float, db_url: str | None = None) -> dict:
    """One measurement: ``n`` pollers (ramped for 2 s first), ingest and /healthz for ``seconds``."""
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()
    proc = ctx.Process(target=_pollers, args=(url, n, seconds + 4, queue)) if n else None
    if proc is not None:
        proc.start()
        time.sleep(2.0)
    until = time.monotonic() + seconds
    done: list[int] = []
    latencies: list[float] = []
    errors: Counter = Counter()
    threads = [threading.Thread(target=_ingest, args=(url, until, f"n{n}t{k}", done, errors)) for k in range(2)]
    threads.append(threading.Thread(target=_health, args=(url, until, latencies, errors)))
    probe: list[float] = []
    if db_url is not None:
        threads.append(threading.Thread(target=_db_probe, args=(db_url, until, probe)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    polls = queue.get(timeout=seconds + 120) if proc is not None else {}
    if proc is not None:
        proc.join()
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return {
        "n": n,
        "5xx": sum(c for k, c in {**polls, **errors}.items() if isinstance(k, int) and k >= 500),
        "429": polls.get(429, 0),
        "other": {k: c for k, c in {**polls, **errors}.items() if k not in (200, 204, 429)},
        "health_p50_ms": statistics.median(lat) * 1000,
        "health_p99_ms": p99 * 1000,
        "db_probe_p99_ms": _p99(probe) * 1000,
        "groups_per_s": len(done) / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, nargs="+", default=[100, 300, 500])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-waiters", type=int, default=1024)
    args = parser.parse_args(argv)
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        print("set DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    from service.store.db import to_sqlalchemy_url

    admin = to_sqlalchemy_url(server_url)
    db = create_database(admin, "gcb")
    from service.store.migrate import upgrade

    upgrade(db)
    server = start_server(db, env={"GRPO_CURATOR_LEASE_MAX_WAITERS": str(args.max_waiters)})
    from service.store.dbadmin import libpq_url

    try:
        rows = [run_level(server.url, n, args.seconds, libpq_url(db)) for n in [0, *args.polls]]
    finally:
        stop_server(server)
        drop_database(admin, db)
    base = rows[0]["groups_per_s"] or 1.0
    print(f"{'pollers':>8} {'5xx':>5} {'429':>5} {'healthz p50 ms':>15} {'p99 ms':>8} {'db probe p99':>13}"
          f" {'ingest g/s':>11} {'vs 0':>6}  other")
    for r in rows:
        print(f"{r['n']:>8} {r['5xx']:>5} {r['429']:>5} {r['health_p50_ms']:>15.1f} {r['health_p99_ms']:>8.1f}"
              f" {r['db_probe_p99_ms']:>13.1f} {r['groups_per_s']:>11.1f} {r['groups_per_s'] / base:>6.2f}  {r['other'] or ''}")
    print("db probe: a new connection + the schema read from this process, beside /healthz (what its check costs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

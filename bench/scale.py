"""Scale benchmark (not a test): how ingest, lease, /v1/stats and the archive behave as the hot tables grow.

One private database (created, migrated, dropped at the end). Synthetic groups of 8 trajectories x
``--tokens`` token ids (default 64: short, so 5 M trajectories fit a small disk; int32 token ids, uint8 loss
mask, float32 log-probs as bytea, i.e. ~580 bytes of arrays per trajectory) are bulk-loaded with binary
COPY (``bench.lease._copy_trajectories``), in 4 datasets, a new policy version every 10,000 groups, the
groups' ``created_at`` at a steady GROUPS_PER_HOUR (a bigger store is a longer run, not a denser one: 5 M
trajectories are ~6.5 days ending now, 100 k the first ~3 hours of them) and the stats rollup kept through the service's own
``record_groups``. Loaded groups are ``consumed`` (history), as in a long run, with a decision log as
curation writes one: each group's last member masked (cut at the budget), and every 10th group's slot
resampled (``remedy_requested`` + ``remedy_filled``): 1.2 decision rows a group.

At each checkpoint of ``--sizes`` (trajectories in the hot tables) it measures, against a real
``grpo-curator serve`` over real HTTP:

* ingest: a fixed sample of ``POST /v1/groups`` (``--ingest-groups`` from 4 clients) and raw binary COPY
  of the same rows on one connection, side by side (groups/s and the ratio);
* lease: ``--ready`` groups made ready, then lease + ack of ``--batch`` trajectories by 1 and by 4
  concurrent trainer processes (``bench.lease.run_config``, Arrow), p50 / p99;
* ``GET /v1/stats``: ``--stats-requests`` requests over every ``by`` with and without ``since``, p50 / p99;
* archive: ``grpo-curator archive --to <temp dir>`` of a fixed slice of ``--archive-groups`` consumed
  groups (the slice is aged past the retention first), groups/s net of the command's start-up.

``--profile`` adds, at each checkpoint, where one lease's time goes inside the service: the claim SQL and
the batch-rows SQL alone (EXPLAIN ANALYZE), ``lease_once`` in-process (all its SQL, no HTTP), the Arrow and
JSON encodings alone, and what is left for HTTP + the client. Prints a table; writes ``--out``/scale.json.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.scale --profile
    DATABASE_URL=... python -m bench.scale --sizes 100000 --profile                 # one checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg
from sqlalchemy import event

from bench.lease import _copy_trajectories, run_config
from service.api.wire_checks import ARROW_MEDIA_TYPE
from service.settings import get_settings
from service.store.dbadmin import create_database, drop_database, libpq_url

ROOT = Path(__file__).resolve().parents[1]
PER_GROUP = 8
PROMPT_TOKENS = 16
DATASETS = ("math", "code", "chat", "tools")
GROUPS_PER_VERSION = 10_000
GROUPS_PER_HOUR = 4_000  # a busy run: ~96 k groups (~0.8 M trajectories) a day
CHUNK = 1_000  # groups per COPY transaction
RESAMPLED_EVERY = 10  # every 10th group's cut member was resampled and filled (two more decision rows)
COPY_BATCH = 50  # groups per commit of the COPY side of the ingest comparison (and per batched API request)
ANALYZE_EVERY = 25  # chunks between two ANALYZEs of the tables being loaded
STATS_QUERIES = [{"by": by} for by in ("policy_version", "dataset", "finish_reason", "component")]
STATS_QUERIES += [{**q, "since": "SINCE"} for q in STATS_QUERIES]
_GROUP_COLS = ("pk, id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, n_trajectories, n_tokens,"
               " status, created_at, scored_at, curated_at, ready_at, consumed_at")
_GROUP_TYPES = ["int8", "text", "text", "text", "int4", "jsonb", "jsonb", "varchar", "int4", "int8", "varchar"]
_GROUP_TYPES += ["timestamptz"] * 5


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


# -- bulk load -----------------------------------------------------------------------------------------------
def seed_prompts(conn: psycopg.Connection) -> None:
    rows = [(f"p-{d}-{i}", d) for d in DATASETS for i in range(100)]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO prompts (id, dataset, messages, reference, metadata)"
                        " VALUES (%s, %s, '[]', '{}', '{}')", rows)
    conn.commit()


def load(url: str, first_pk: int, n_groups: int, tokens: int, rng: np.random.Generator,
         end: tuple[datetime, int] | None = None) -> float:
    """Groups ``first_pk`` .. ``first_pk + n_groups - 1`` (consumed, curated), binary COPY; -> seconds. ``end`` =
    (time, pk): the run's last group and when it was made; a group ``n`` pks before it was made ``n /
    GROUPS_PER_HOUR`` hours earlier (default: this load's last group, an hour ago)."""
    mask = np.r_[np.zeros(PROMPT_TOKENS, np.uint8), np.ones(tokens - PROMPT_TOKENS, np.uint8)].tobytes()
    end_at, end_pk = end or (datetime.now(UTC) - timedelta(hours=1), first_pk + n_groups - 1)
    from service.settings import get_settings
    from service.stats import repository as stats_repo
    from service.stats import service as stats
    from service.store import partitions
    from service.store.db import get_engine, make_sessionmaker

    factory = make_sessionmaker(get_engine(url))
    size = get_settings().partition_groups
    t0 = time.perf_counter()
    with psycopg.connect(libpq_url(url)) as conn:
        for start in range(first_pk, first_pk + n_groups, CHUNK):
            pks = list(range(start, min(start + CHUNK, first_pk + n_groups)))
            # the worker's job in a deployment: ranges created ahead, so no row lands in the DEFAULT partition
            partitions.ensure_ahead(factory, size, ahead=1 + CHUNK // size)
            with conn.cursor().copy(f"COPY groups ({_GROUP_COLS}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(_GROUP_TYPES)
                for pk in pks:
                    dataset = DATASETS[pk % len(DATASETS)]
                    at = end_at - timedelta(hours=(end_pk - pk) / GROUPS_PER_HOUR)
                    cp.write_row((pk, f"g-{pk}", f"p-{dataset}-{pk % 100}", dataset, 1 + pk // GROUPS_PER_VERSION,
                                  '{"temperature": 1.0}', "{}", "", PER_GROUP, PER_GROUP * tokens, "consumed",
                                  at, at, at, at, at + timedelta(seconds=30)))
            _copy_trajectories(conn, pks, mask, rng, per_group=PER_GROUP, tokens_per=tokens,
                               prompt_tokens=PROMPT_TOKENS)
            _copy_decisions(conn, pks)
            conn.commit()
            if (start - first_pk) // CHUNK % ANALYZE_EVERY == ANALYZE_EVERY - 1:
                # autovacuum's job in a deployment, which a bulk load outruns: fresh statistics for the planner
                lo = start // size * size
                for table in ("groups", f"parts.{partitions.partition_name('trajectories', lo)}"):
                    conn.execute(f"ANALYZE {table}")
                conn.commit()
            with factory.begin() as session:  # the rollup, as the curation stage keeps it
                stats.record_groups(session, pks)
                stats_repo.add_to_cells(session, stats.remedy_cells(stats_repo.remedy_facts(session, pks)))
        conn.execute("SELECT setval(pg_get_serial_sequence('groups', 'pk'), (SELECT max(pk) FROM groups))")
        conn.commit()
    return time.perf_counter() - t0


def _copy_decisions(conn: psycopg.Connection, pks: list[int]) -> None:
    """The decision log curation writes for these groups: the last member masked; every ``RESAMPLED_EVERY``-th
    group's slot resampled and filled (created with the groups' curation, as the worker logs it)."""
    with conn.cursor().copy("COPY decisions (group_pk, idx, action, rule, reason) FROM STDIN") as cp:
        for pk in pks:
            cp.write_row((pk, PER_GROUP - 1, "mask", "length", "finish_reason length: mask"))
            if pk % RESAMPLED_EVERY == 0:
                cp.write_row((pk, PER_GROUP - 1, "resample", "remedy_requested", "slot resampled"))
                cp.write_row((pk, PER_GROUP - 1, "resample", "remedy_filled", "filled"))


def vacuum(url: str) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in ("groups", "trajectories", "decisions", "stats_cells", "leases"):
            conn.execute(f"VACUUM ANALYZE {table}")


def counts(url: str) -> dict[str, int]:
    with psycopg.connect(libpq_url(url)) as conn:
        groups, trajs = conn.execute(
            "SELECT count(*), coalesce(sum(n_trajectories), 0) FROM groups").fetchone()  # type: ignore[misc]
        cells = conn.execute("SELECT count(*) FROM stats_cells").fetchone()[0]  # type: ignore[index]
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
    return {"groups": int(groups), "trajectories": int(trajs), "stats_cells": int(cells), "db_bytes": int(size)}


# -- ingest: the API vs raw binary COPY of the same rows ---------------------------------------------------
def bodies(tag: str, n: int, tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        dataset = DATASETS[i % len(DATASETS)]
        trajs = [{"messages": [{"role": "assistant", "content": f"step {j} so x = {rng.randrange(100)}"}],
                  "token_ids": [rng.randrange(150_000) for _ in range(tokens)],
                  "loss_mask": [0] * PROMPT_TOKENS + [1] * (tokens - PROMPT_TOKENS),
                  "logprobs": [round(-rng.random() * 3, 6) for _ in range(tokens)],
                  "finish_reason": "stop" if j % 4 else "length"} for j in range(PER_GROUP)]
        out.append({"id": f"{tag}-{i}", "prompt_id": f"ip-{dataset}-{i % 50}", "policy_version": 1,
                    "prompt": {"dataset": dataset, "messages": [{"role": "user", "content": "q"}],
                               "reference": {"answer": "42"}},
                    "sampling": {"temperature": 1.0, "max_tokens": tokens}, "trajectories": trajs})
    return out


def ingest_api(server_url: str, groups: list[dict[str, Any]], clients: int = 4, batch: int = 1,
               wire: str = "json") -> dict[str, float]:
    """``groups`` posted by ``clients`` threads, ``batch`` groups a request (``{"groups": [...]}`` when > 1), as JSON
    or Arrow bodies (``wire``; encoded before the clock starts): groups/s, and per-request latency."""
    from service.ingest.arrow_body import encode_groups

    chunks = [groups[i:i + batch] for i in range(0, len(groups), batch)]
    encode = encode_groups if wire == "arrow" else orjson.dumps
    encoded = [encode(c[0] if batch == 1 else {"groups": c}) for c in chunks]
    media = ARROW_MEDIA_TYPE if wire == "arrow" else "application/json"
    lat: list[float] = []

    def run(chunk: list[bytes]) -> None:
        with httpx.Client(base_url=server_url, timeout=120) as http:
            for body in chunk:
                t0 = time.perf_counter()
                r = http.post("/v1/groups", content=body, headers={"content-type": media})
                lat.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    raise RuntimeError(f"POST /v1/groups: {r.status_code} {r.text[:300]}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, [encoded[i::clients] for i in range(clients)]))
    wall = time.perf_counter() - t0
    return {"groups_per_s": len(groups) / wall, "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99)}


def ingest_copy(url: str, groups: list[dict[str, Any]]) -> dict[str, float]:
    """The same rows (ids suffixed) as groups + trajectories with binary COPY, one connection, one commit
    per COPY_BATCH groups (the API commits one request: one group, or a batch): the floor for what the API could do."""
    cols = ("group_pk, idx, messages, final_answer, token_ids, loss_mask, logprobs, seq_len, num_tokens, num_turns,"
            " finish_reason, metadata")
    types = ["int8", "int2", "jsonb", "text", "bytea", "bytea", "bytea", "int4", "int4", "int2", "varchar", "jsonb"]
    t0 = time.perf_counter()
    with psycopg.connect(libpq_url(url)) as conn:
        for start in range(0, len(groups), COPY_BATCH):
            part = groups[start:start + COPY_BATCH]
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO prompts (id, dataset, messages, reference, metadata)"
                                " VALUES (%s, %s, '[]', '{}', '{}') ON CONFLICT DO NOTHING",
                                [(g["prompt_id"] + "-copy", g["prompt"]["dataset"]) for g in part])
                pks = [cur.execute(
                    "INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash,"
                    " n_trajectories, n_tokens) VALUES (%s, %s, %s, 1, %s, '{}', '', %s, %s) RETURNING pk",
                    (g["id"] + "-copy", g["prompt_id"] + "-copy", g["prompt"]["dataset"], orjson.dumps(g["sampling"]).decode(),
                     PER_GROUP, sum(len(t["token_ids"]) for t in g["trajectories"]))).fetchone()[0]  # type: ignore[index]
                    for g in part]
                with cur.copy(f"COPY trajectories ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(types)
                    for pk, g in zip(pks, part, strict=True):
                        for j, t in enumerate(g["trajectories"]):
                            cp.write_row((pk, j, orjson.dumps(t["messages"]).decode(), t["messages"][-1]["content"],
                                          np.asarray(t["token_ids"], "<i4").tobytes(),
                                          np.asarray(t["loss_mask"], "u1").tobytes(),
                                          np.asarray(t["logprobs"], "<f4").tobytes(), len(t["token_ids"]),
                                          sum(t["loss_mask"]), 1, t["finish_reason"], "{}"))
            conn.commit()
    return {"groups_per_s": len(groups) / (time.perf_counter() - t0)}


# -- lease -------------------------------------------------------------------------------------------------
def make_ready(url: str, n_groups: int) -> list[int]:
    """The newest ``n_groups`` loaded groups become ready (a fresh queue, identical for every configuration)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        pks = [r[0] for r in conn.execute(
            "SELECT pk FROM groups WHERE id LIKE 'g-%%' ORDER BY pk DESC LIMIT %s", (n_groups,))]
        conn.execute("UPDATE groups SET status = 'ready', lease_id = NULL, consumed_at = NULL, staleness = NULL"
                     " WHERE pk = ANY(%s)", (pks,))
        conn.execute("UPDATE leases SET status = 'acked' WHERE status = 'active'")
    return pks


def back_to_history(url: str, pks: list[int]) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("UPDATE groups SET status = 'consumed', lease_id = NULL, consumed_at = coalesce(consumed_at, now())"
                     " WHERE pk = ANY(%s)", (pks,))


def lease(url: str, server_url: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trainers in (1, 4):
        pks = make_ready(url, args.ready)
        with WaitSampler(url) if args.profile else contextlib.nullcontext() as waits:  # type: ignore[attr-defined]
            r = run_config(server_url, "arrow", trainers, args.batch, args.batches)
        back_to_history(url, pks)
        out[str(trainers)] = {"batches": r["batches"], "p50_ms": r["lease_p50"], "p99_ms": r["lease_p99"],
                              "lease_ack_p50_ms": r["p50"], "lease_ack_p99_ms": r["p99"]}
        if waits is not None:
            out[str(trainers)]["backend_samples"] = waits.counts
    return out


class WaitSampler:
    """Samples pg_stat_activity every 10 ms while a configuration runs: how often the service's backends
    were running ('cpu'), waiting on a lock ('Lock:...', 'LWLock:...'), on I/O, or on the client
    ('Client:ClientRead': the service's own Python or the network)."""

    def __init__(self, url: str) -> None:
        self.url, self.counts, self._stop = url, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(libpq_url(self.url), autocommit=True) as conn:
            while not self._stop.wait(0.01):
                for kind, event_name, state in conn.execute(
                        "SELECT wait_event_type, wait_event, state FROM pg_stat_activity WHERE datname ="
                        " current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"):
                    if state == "idle":
                        continue
                    key = "cpu" if kind is None else f"{kind}:{event_name}"
                    self.counts[key] = self.counts.get(key, 0) + 1


# -- /v1/stats ---------------------------------------------------------------------------------------------
def stats_latency(server_url: str, n: int, newest: datetime | None = None) -> dict[str, Any]:
    """p50 / p99 over every query of STATS_QUERIES, and per query (its p50 / p99 and the rows it answered: what
    grows with the store, and what grows with the answer); ``since`` is 24 h before ``newest`` (the run's last
    loaded group; default now): the run's last day so far."""
    since = ((newest or datetime.now(UTC)) - timedelta(hours=24)).isoformat()
    cold: list[float] = []
    lat: list[float] = []
    per: dict[str, list[float]] = {}
    rows: dict[str, int] = {}
    with httpx.Client(base_url=server_url, timeout=120) as http:
        for i in range(n + len(STATS_QUERIES)):
            q = STATS_QUERIES[i % len(STATS_QUERIES)]
            params = {k: (since if v == "SINCE" else v) for k, v in q.items()}
            t0 = time.perf_counter()
            r = http.get("/v1/stats", params=params)
            took = time.perf_counter() - t0
            if r.status_code != 200:
                raise RuntimeError(f"GET /v1/stats {params}: {r.status_code} {r.text[:300]}")
            if i < len(STATS_QUERIES):
                cold.append(took)
                continue
            lat.append(took)
            label = q["by"] + (" since 24 h" if "since" in q else "")
            per.setdefault(label, []).append(took)
            rows[label] = len(r.json()["rows"])
    return {"p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "cold_max_ms": max(cold) * 1e3,
            "by_query": {label: {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99), "rows": rows[label]}
                         for label, v in per.items()}}


# -- archive -----------------------------------------------------------------------------------------------
def archive(url: str, n_groups: int) -> dict[str, float]:
    """Age the oldest ``n_groups`` consumed groups past the retention and out of the monitors' window (created
    30 days earlier, sampled ``alert_window_versions`` + 1 policy versions before the current one: the archive
    keeps what the monitors still read), then ``grpo-curator archive`` them to a temporary directory; the same
    command over nothing first gives its start-up time."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        current = conn.execute("SELECT coalesce(max(version), 0) FROM policy_versions").fetchone()[0]
        conn.execute("UPDATE groups SET created_at = created_at - interval '30 days', policy_version = %s WHERE pk IN ("
                     " SELECT pk FROM groups WHERE status = 'consumed' AND id LIKE 'g-%%' ORDER BY pk LIMIT %s)",
                     (current - get_settings().alert_window_versions - 1, n_groups))
    env = {**os.environ, "DATABASE_URL": url}
    with tempfile.TemporaryDirectory(prefix="scale-archive-") as to:
        def run(older_than: str) -> tuple[float, str]:
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "service.cli", "archive", "--to", to, "--older-than",
                                   older_than], env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise RuntimeError(f"grpo-curator archive: {done.returncode} {done.stderr[-500:]}")
            return time.perf_counter() - t0, done.stdout

        idle, _ = run("3650d")
        busy, said = run("7d")
        size = sum(p.stat().st_size for p in Path(to).rglob("*.parquet"))
    archived = int(said.split("archived ")[1].split()[0])
    net = busy - idle if busy > idle else float("nan")  # a slice too small to time says nan
    return {"groups": archived, "s": busy, "startup_s": idle, "groups_per_s": archived / net,
            "trajectories_per_s": archived * PER_GROUP / net, "end_to_end_groups_per_s": archived / busy,
            "parquet_mb": size / 1e6}


# -- where a lease's time goes -----------------------------------------------------------------------------
def profile(url: str, server_url: str, args: argparse.Namespace) -> dict[str, float]:
    from service.auth.service import OPEN
    from service.delivery import arrow
    from service.delivery import repository as lease_repo
    from service.delivery.schemas import LeaseIn
    from service.delivery.service import lease_once
    from service.store.db import get_engine, make_sessionmaker

    pks = make_ready(url, args.ready)
    groups = args.batch // PER_GROUP
    claim_sql = ("SELECT pk, policy_version FROM groups WHERE status = 'ready' ORDER BY pk LIMIT %s"
                 " FOR UPDATE SKIP LOCKED")
    rows_sql = lease_repo._BATCH_ROWS_SQL.replace("%(pks)s", "%(pks)s::bigint[]").replace(
        "%(actions)s", "%(actions)s::text[]")
    claim_ms, rows_ms = [], []
    with psycopg.connect(libpq_url(url)) as conn:
        for i in range(args.batches):
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_sql, (groups,)).fetchone()[0]  # type: ignore[index]
            claim_ms.append(plan[0]["Execution Time"])
            some = pks[(i * groups) % len(pks):][:groups]
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + rows_sql,
                                {"pks": some, "actions": list(lease_repo.DELIVERABLE_ACTIONS)}).fetchone()[0]  # type: ignore[index]
            rows_ms.append(plan[0]["Execution Time"])
            conn.rollback()
    engine = get_engine(url)
    factory = make_sessionmaker(engine)
    once, sql, fetch, enc_arrow, enc_json = [], [], [], [], []
    clock = {"sql": 0.0, "n": 0, "t": 0.0}
    by_statement: dict[str, list[float]] = {}

    def before(*_: Any) -> None:
        clock["t"] = time.perf_counter()

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        dt = time.perf_counter() - clock["t"]
        clock["sql"] += dt
        clock["n"] += 1
        by_statement.setdefault(" ".join(statement.split())[:70], []).append(dt)

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        for i in range(args.batches + 1):  # the first warms the connection up, not counted
            with factory() as session:
                clock.update(sql=0.0, n=0)
                t0 = time.perf_counter()
                batch = lease_once(session, LeaseIn(trainer_id=f"profile-{i}", max_trajectories=args.batch), 60.0,
                                   key=OPEN)
                t1 = time.perf_counter()
                assert batch is not None
                lease_repo.batch_rows(session, pks[:groups])
                t2 = time.perf_counter()
                session.rollback()  # the queue stays as it was
            if i:
                once.append(t1 - t0)
                sql.append(clock["sql"])
                fetch.append(t2 - t1)
                statements = clock["n"]
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    arrow.encode_arrow(batch), arrow.encode_json(batch)  # warm-up (first imports), not counted
    for _ in range(args.batches):
        t0 = time.perf_counter()
        arrow.encode_arrow(batch)
        enc_arrow.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        arrow.encode_json(batch)
        enc_json.append(time.perf_counter() - t0)
    http = run_config(server_url, "arrow", 1, args.batch, args.batches)
    back_to_history(url, pks)
    out = {"claim_sql_p50_ms": float(np.median(claim_ms)), "rows_sql_p50_ms": float(np.median(rows_ms)),
           "lease_once_p50_ms": _pct(once, 50), "orm_sql_p50_ms": _pct(sql, 50), "orm_statements": statements,
           "batch_rows_fetch_p50_ms": _pct(fetch, 50), "encode_arrow_p50_ms": _pct(enc_arrow, 50),
           "encode_json_p50_ms": _pct(enc_json, 50), "http_lease_p50_ms": http["lease_p50"]}
    out["orm_statement_p50_ms"] = {k: _pct(v, 50) for k, v in sorted(by_statement.items(), key=lambda kv: -sum(kv[1]))}
    out["python_in_lease_once_p50_ms"] = out["lease_once_p50_ms"] - out["orm_sql_p50_ms"] - out["batch_rows_fetch_p50_ms"]
    out["http_and_client_p50_ms"] = out["http_lease_p50_ms"] - out["lease_once_p50_ms"] - out["encode_arrow_p50_ms"]
    return out


# -- the run -----------------------------------------------------------------------------------------------
def checkpoint(url: str, server_url: str, size: int, load_s: float, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"size": size, "load_trajectories_per_s": size and args._loaded / load_s}
    sample = bodies(f"api-{size}", args.ingest_groups, args.tokens, seed=size)
    row["ingest_api"] = ingest_api(server_url, sample)
    # the same rows again, 50 groups a request: the unit COPY commits (POST /v1/groups takes a batch)
    row["ingest_api_batch"] = ingest_api(server_url, bodies(f"apib-{size}", args.ingest_groups, args.tokens, seed=size),
                                         batch=COPY_BATCH)
    # and as Arrow bodies (the token arrays as columns), 50 a request
    row["ingest_api_arrow"] = ingest_api(server_url, bodies(f"apia-{size}", args.ingest_groups, args.tokens, seed=size),
                                         batch=COPY_BATCH, wire="arrow")
    row["ingest_copy"] = ingest_copy(url, sample)
    for key, api in (("ingest_ratio", "ingest_api"), ("ingest_ratio_batch", "ingest_api_batch"),
                     ("ingest_ratio_arrow", "ingest_api_arrow")):
        row[key] = row[api]["groups_per_s"] / row["ingest_copy"]["groups_per_s"]
    vacuum(url)
    row["lease"] = lease(url, server_url, args)
    with psycopg.connect(libpq_url(url)) as conn:
        newest = conn.execute("SELECT max(created_at) FROM groups WHERE id LIKE 'g-%%'").fetchone()[0]  # type: ignore[index]
    row["stats"] = stats_latency(server_url, args.stats_requests, newest)
    if args.profile:
        row["profile"] = profile(url, server_url, args)
    row["archive"] = archive(url, args.archive_groups)
    row["db"] = counts(url)
    return row


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"shape: groups of {PER_GROUP} trajectories x {args.tokens} token ids ({PROMPT_TOKENS} prompt); "
          f"lease {args.batch} trajectories (Arrow) x {args.batches} per trainer; ingest sample {args.ingest_groups} "
          f"groups from 4 clients; archive slice {args.archive_groups} groups; API workers {args.workers}")
    print("loaded: trajectories bulk-loaded; hot: trajectories in PostgreSQL after the checkpoint (with the API's and "
          "COPY's samples, without the archived slices); lease and stats in ms; arch g/s net of start-up")
    head = (f"{'loaded':>9} {'hot':>9} {'DB GB':>6} {'load/s':>8} {'API g/s':>8} {'API50 g/s':>9} {'Arrow50':>8} {'COPY g/s':>8} "
            f"{'ratio':>5} {'ratio50':>7} {'ratioA':>6} "
            f"{'lease1 p50|p99':>15} {'lease4 p50|p99':>15} {'stats p50|p99':>14} {'arch g/s':>8}")
    print(head)
    for r in rows:
        l1, l4, st = r["lease"]["1"], r["lease"]["4"], r["stats"]
        print(f"{r['size']:>9} {r['db']['trajectories']:>9} {r['db']['db_bytes'] / 1e9:>6.2f} {r['load_trajectories_per_s']:>8.0f} "
              f"{r['ingest_api']['groups_per_s']:>8.1f} {r['ingest_api_batch']['groups_per_s']:>9.1f} "
              f"{r['ingest_api_arrow']['groups_per_s']:>8.1f} {r['ingest_copy']['groups_per_s']:>8.1f} "
              f"{r['ingest_ratio']:>5.2f} {r['ingest_ratio_batch']:>7.2f} {r['ingest_ratio_arrow']:>6.2f} {l1['p50_ms']:>7.1f}|{l1['p99_ms']:>7.1f} "
              f"{l4['p50_ms']:>7.1f}|{l4['p99_ms']:>7.1f} {st['p50_ms']:>6.1f}|{st['p99_ms']:>7.1f} "
              f"{r['archive']['groups_per_s']:>8.0f}")
    for r in rows:
        if "profile" in r:
            p = r["profile"]
            print(f"profile at {r['size']} (p50): claim SQL {p['claim_sql_p50_ms']:.1f} ms, rows SQL {p['rows_sql_p50_ms']:.1f} ms "
                  f"(EXPLAIN ANALYZE, server side); lease_once {p['lease_once_p50_ms']:.1f} ms in-process = "
                  f"{p['orm_statements']} ORM statements {p['orm_sql_p50_ms']:.1f} ms + batch-rows fetch "
                  f"{p['batch_rows_fetch_p50_ms']:.1f} ms + Python {p['python_in_lease_once_p50_ms']:.1f} ms; "
                  f"Arrow {p['encode_arrow_p50_ms']:.1f} ms, "
                  f"JSON {p['encode_json_p50_ms']:.1f} ms, HTTP lease {p['http_lease_p50_ms']:.1f} ms "
                  f"(left for HTTP + client {p['http_and_client_p50_ms']:.1f} ms); 4 trainers' p50 - 1 trainer's "
                  f"{r['lease']['4']['p50_ms'] - r['lease']['1']['p50_ms']:.1f} ms (queueing for CPU and locks)")
            print("  slowest ORM statements (p50 ms): " + "; ".join(
                f"{k[:48]} {v:.1f}" for k, v in list(p["orm_statement_p50_ms"].items())[:4]))
            for trainers in ("1", "4"):
                print(f"  {trainers} trainer(s), active service backends sampled every 10 ms: "
                      f"{r['lease'][trainers].get('backend_samples')}")
    print("GET /v1/stats per query, p50 | p99 ms (rows answered): " + "; ".join(
        f"{r['size']}: " + ", ".join(f"{label} {v['p50_ms']:.1f}|{v['p99_ms']:.1f} ({v['rows']})"
                                     for label, v in r["stats"]["by_query"].items()) for r in rows))
    first, last = rows[0], rows[-1]
    lease_x = last["lease"]["1"]["p99_ms"] / first["lease"]["1"]["p99_ms"]
    stats_x = last["stats"]["p99_ms"] / first["stats"]["p99_ms"]
    print(f"targets: lease p99 x{lease_x:.2f} and stats p99 x{stats_x:.2f} from {first['size']} to {last['size']}"
          f" (<= 1.5); ingest ratio {min(r['ingest_ratio'] for r in rows):.2f} one group a request, "
          f"{min(r['ingest_ratio_batch'] for r in rows):.2f} {COPY_BATCH} a request, "
          f"{min(r['ingest_ratio_arrow'] for r in rows):.2f} {COPY_BATCH} a request as Arrow (>= 0.5); "
          f"4-trainer lease p99 {max(r['lease']['4']['p99_ms'] for r in rows):.0f} ms (<= 150)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000],
                    help="checkpoints: trajectories loaded (ascending; default 100000 1000000 5000000)")
    ap.add_argument("--tokens", type=int, default=64, help="token ids per trajectory (default 64)")
    ap.add_argument("--batch", type=int, default=256, help="trajectories per lease (default 256)")
    ap.add_argument("--batches", type=int, default=50, help="leases per trainer and configuration (default 50: the 1-trainer p99 is then not its one slowest lease)")
    ap.add_argument("--ready", type=int, default=0, help="groups made ready for leasing (default: enough)")
    ap.add_argument("--ingest-groups", type=int, default=200, help="POST /v1/groups sample per checkpoint")
    ap.add_argument("--stats-requests", type=int, default=200, help="GET /v1/stats requests per checkpoint")
    ap.add_argument("--archive-groups", type=int, default=2_000, help="groups archived per checkpoint")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    ap.add_argument("--profile", action="store_true", help="also say where a lease's time goes")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="directory for scale.json")
    args = ap.parse_args(argv)
    if args.sizes != sorted(args.sizes) or args.sizes[0] < PER_GROUP:
        ap.error("--sizes: ascending trajectory counts, each at least 8")
    if args.tokens <= PROMPT_TOKENS:
        ap.error(f"--tokens: must be more than {PROMPT_TOKENS} (the prompt part)")
    if args.batch < PER_GROUP:
        ap.error(f"--batch: at least {PER_GROUP} (one group)")
    args.ready = args.ready or (4 * (args.batches + 1) + 1) * (args.batch // PER_GROUP)  # + each one's warm-up
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from service.store.db import dispose_engine, to_sqlalchemy_url
    from service.store.migrate import upgrade
    from service.store.processes import exit_on_signals
    from tests.conftest import start_server, stop_server

    exit_on_signals()  # killed (SIGTERM / SIGHUP): the finally blocks still stop its server and drop its database

    server = to_sqlalchemy_url(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    url = create_database(server, "scale")
    rows: list[dict[str, Any]] = []
    try:
        upgrade(url)
        with psycopg.connect(libpq_url(url)) as conn:
            seed_prompts(conn)
        rng = np.random.default_rng(0)
        loaded = 0
        # the run's last group (the API's and COPY's samples take pks between the loads) and when it was made
        run_end = (datetime.now(UTC) - timedelta(hours=1),
                   max(args.sizes) // PER_GROUP + len(args.sizes) * 3 * args.ingest_groups)
        live = start_server(url, workers=args.workers)
        try:
            for size in args.sizes:
                n_groups = max(size // PER_GROUP - loaded // PER_GROUP, 0)
                with psycopg.connect(libpq_url(url)) as conn:  # after the API's groups of the last checkpoint
                    next_pk = 1 + conn.execute("SELECT coalesce(max(pk), 0) FROM groups").fetchone()[0]  # type: ignore[index]
                load_s = load(url, next_pk, n_groups, args.tokens, rng, end=run_end)
                args._loaded = n_groups * PER_GROUP
                loaded += args._loaded
                vacuum(url)
                print(f"loaded {loaded} trajectories ({n_groups} groups more in {load_s:.0f} s); measuring", flush=True)
                rows.append(checkpoint(url, live.url, size, max(load_s, 1e-9), args))
        finally:
            stop_server(live)
            dispose_engine(url)
    finally:
        drop_database(server, url)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("_")}
    (args.out / "scale.json").write_text(json.dumps({"config": config, "per_group": PER_GROUP,
                                                     "prompt_tokens": PROMPT_TOKENS, "checkpoints": rows}, indent=2))
    report(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

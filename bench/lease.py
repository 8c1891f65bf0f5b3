"""Lease benchmark (not a test): lease + ack of 512-trajectory batches, JSON vs Arrow, 1 and 4 trainers.

Stores ``--trajectories`` trajectories of 1,024 tokens (groups of 8, bytea arrays, written with COPY as
test setup), serves them with ``grpo-curator serve`` and lets 1, then 4, trainer processes lease and ack
``--batch`` trajectories at a time through CuratorClient (Arrow decoded to numpy views, JSON with
orjson). In the same run it times a raw psycopg SELECT of the same rows (the floor) and prints p50 / p99
latency, MB/s and the ratios to the raw select.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.lease --trajectories 100000
    DATABASE_URL=... python -m bench.lease --trajectories 8000 --batches 10      # a quick run
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from service.store.dbadmin import create_database, drop_database, libpq_url

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 1024
PER_GROUP = 8
PROMPT_TOKENS = 128


def store(url: str, n_trajectories: int, seed: int = 0) -> int:
    """Setup: ready groups of PER_GROUP trajectories x TOKENS tokens, written with binary COPY; -> groups."""
    rng = np.random.default_rng(seed)
    n_groups = n_trajectories // PER_GROUP
    mask = np.r_[np.zeros(PROMPT_TOKENS, np.uint8), np.ones(TOKENS - PROMPT_TOKENS, np.uint8)].tobytes()
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute(
            "INSERT INTO prompts (id, dataset, messages, reference, metadata) VALUES ('bp', 'bench', '[]', '{}', '{}')"
        )
        for start in range(0, n_groups, 500):
            ids = [f"bench-{i}" for i in range(start, min(start + 500, n_groups))]
            pks = [
                conn.execute(
                    "INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash,"
                    " n_trajectories, n_tokens, status, ready_at) VALUES (%s, 'bp', 'bench', 1, '{}', '{}', '', %s, %s,"
                    " 'ready', now()) RETURNING pk",
                    (gid, PER_GROUP, PER_GROUP * TOKENS),
                ).fetchone()[0]
                for gid in ids
            ]
            _copy_trajectories(conn, pks, mask, rng)
            conn.commit()
    return n_groups


def _copy_trajectories(
    conn: psycopg.Connection, pks: list[int], mask: bytes, rng: np.random.Generator, *,
    per_group: int = PER_GROUP, tokens_per: int = TOKENS, prompt_tokens: int = PROMPT_TOKENS,
) -> None:
    cols = "group_pk, idx, messages, final_answer, token_ids, loss_mask, logprobs, seq_len, num_tokens, num_turns,"
    cols += " finish_reason, metadata, total_reward, advantage, action"
    types = [
        "int8",
        "int2",
        "jsonb",
        "text",
        "bytea",
        "bytea",
        "bytea",
        "int4",
        "int4",
        "int2",
        "varchar",
        "jsonb",
    ]
    types += ["float8", "float8", "varchar"]
    tokens = rng.integers(0, 150_000, size=(len(pks), per_group, tokens_per), dtype=np.int32)
    logprobs = (-rng.random(size=(len(pks), per_group, tokens_per)) * 3).astype(np.float32)
    with conn.cursor().copy(f"COPY trajectories ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(types)
        for g, pk in enumerate(pks):
            for j in range(per_group):
                row = (pk, j, "[]", "", tokens[g, j].tobytes(), mask, logprobs[g, j].tobytes(), tokens_per)
                cp.write_row(
                    (*row, tokens_per - prompt_tokens, 1, "stop", "{}", float(j % 2), (j - 3.5) / 2.3, "keep")
                )


def reset(url: str) -> None:
    """Every group ready again, no leases: each configuration starts from the same queue."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            "UPDATE groups SET status = 'ready', lease_id = NULL, consumed_at = NULL, staleness = NULL"
        )
        conn.execute("DELETE FROM leases")
        conn.execute("VACUUM ANALYZE groups")
        conn.execute("VACUUM ANALYZE leases")


def trainer(url: str, fmt: str, batch: int, n: int, out: multiprocessing.Queue, start: Any = None) -> None:
    """Lease + ack ``n`` batches; reports (lease+ack seconds, lease seconds, answer bytes) per batch. ``start``: a
    barrier the trainers pass together after their imports and warm-up lease, so that no trainer's measured
    leases share the cores with another one still starting (a spawned process's imports are ~1 s of CPU: on
    2 cores they were the 4-trainer runs' p99)."""
    import httpx

    from service.client import CuratorClient

    class Counting(httpx.HTTPTransport):
        bytes = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.url.path.endswith("/lease"):
                response.read()
                Counting.bytes += len(response.content)
            return response

    rows = []
    with CuratorClient(url, timeout=120, transport=Counting()) as client:
        tid = f"bench-{os.getpid()}"
        warm = client.lease(tid, max_trajectories=batch, format=fmt, as_numpy=fmt == "arrow")  # type: ignore[arg-type]
        if (
            warm is not None
        ):  # not counted: first imports and connections of this process and its server worker
            client.ack(warm["batch_id"])
        # this process's imports (numpy, pyarrow, the bench's own) are ~10^6 objects that every full collection
        # walks: ~70-100 ms, once every ~10 leases of 256 trajectories, counted in a lease's time (the slowest
        # 1-trainer lease was always the 10th). Frozen, a collection walks what the leases made: the bench times
        # the service, not the client's garbage collector
        gc.collect()
        gc.freeze()
        if start is not None:
            start.wait(timeout=600)
        for _ in range(n):
            before = Counting.bytes
            t0 = time.perf_counter()
            got = client.lease(tid, max_trajectories=batch, format=fmt, as_numpy=fmt == "arrow")  # type: ignore[arg-type]
            t1 = time.perf_counter()
            if got is None:
                break
            client.ack(got["batch_id"])
            rows.append((time.perf_counter() - t0, t1 - t0, Counting.bytes - before))
    out.put(rows)


def run_config(server_url: str, fmt: str, trainers: int, batch: int, n: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Barrier(trainers)
    procs = [ctx.Process(target=trainer, args=(server_url, fmt, batch, n, out, start)) for _ in range(trainers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    rows = [r for _ in procs for r in out.get(timeout=1800)]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    total = np.array([r[0] for r in rows]) * 1e3
    lease = np.array([r[1] for r in rows]) * 1e3
    mb = sum(r[2] for r in rows) / 1e6
    busy = float(np.sum(total)) / 1e3 / trainers  # seconds each trainer spent in lease + ack
    return {
        "batches": len(rows),
        "p50": float(np.percentile(total, 50)),
        "p99": float(np.percentile(total, 99)),
        "lease_p50": float(np.percentile(lease, 50)),
        "lease_p99": float(np.percentile(lease, 99)),
        "mb_per_batch": mb / max(len(rows), 1),
        "mbps": mb / busy if busy else 0.0,
        "wall": wall,
    }


def raw_select(url: str, batch: int, n: int, binary: bool) -> dict[str, float]:
    """The same rows with plain psycopg (no JSON, no HTTP): the floor; bytea as hex text or binary."""
    groups = batch // PER_GROUP
    sql = (
        "SELECT g.id, g.prompt_id, g.policy_version, t.idx, t.token_ids, t.loss_mask, t.logprobs, t.advantage,"
        " t.total_reward FROM trajectories t JOIN groups g ON g.pk = t.group_pk WHERE t.group_pk = ANY(%s)"
        " ORDER BY t.group_pk, t.idx"
    )
    lat = []
    with psycopg.connect(libpq_url(url)) as conn:
        for i in range(n):
            pks = list(range(1 + i * groups, 1 + (i + 1) * groups))
            t0 = time.perf_counter()
            with conn.cursor(binary=binary) as cur:
                rows = cur.execute(sql, (pks,)).fetchall()
            lat.append((time.perf_counter() - t0) * 1e3)
            assert len(rows) == batch
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))}


def measure(url: str, server_url: str, args: argparse.Namespace, n_raw: int) -> dict[tuple[int, str], dict]:
    """Each configuration from a full queue, with the raw SELECTs of the same rows timed just before it."""
    results = {}
    for trainers in (1, 4):
        for fmt in ("json", "arrow"):
            reset(url)
            raw = {binary: raw_select(url, args.batch, n_raw, binary=binary) for binary in (False, True)}
            results[(trainers, fmt)] = run_config(server_url, fmt, trainers, args.batch, args.batches) | {
                "raw": raw[False],
                "raw_bin": raw[True],
            }
    return results


def report(results: dict[tuple[int, str], dict], batch: int) -> None:
    print(
        f"lease + ack of {batch} trajectories x {TOKENS} tokens; raw = psycopg SELECT of the same rows "
        "(bytea as text | binary), timed just before each configuration"
    )
    head = f"{'trainers':>8} {'format':>6} {'batches':>7} {'MB/batch':>8} {'p50 ms':>7} {'p99 ms':>7} {'lease p50':>9}"
    print(f"{head} {'MB/s':>5} {'raw p50|p99 text':>16} {'binary':>11} {'p50/raw':>7} {'p99/raw':>7}")
    for (trainers, fmt), r in results.items():
        raw, raw_bin = r["raw"], r["raw_bin"]
        print(
            f"{trainers:>8} {fmt:>6} {r['batches']:>7} {r['mb_per_batch']:>8.2f} {r['p50']:>7.1f} {r['p99']:>7.1f} "
            f"{r['lease_p50']:>9.1f} {r['mbps']:>5.0f} {raw['p50']:>7.1f} |{raw['p99']:>7.1f} "
            f"{raw_bin['p50']:>5.1f}|{raw_bin['p99']:>5.1f} {r['p50'] / raw['p50']:>7.2f} {r['p99'] / raw['p99']:>7.2f}"
        )
    arrow, js = results[(1, "arrow")], results[(1, "json")]
    print(
        f"targets (1 trainer): Arrow p99 {arrow['p99']:.0f} ms <= 100 and <= 3x raw p99 ({3 * arrow['raw']['p99']:.0f} ms);"
        f" JSON p99 {js['p99']:.0f} ms <= 400"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=512, help="trajectories per lease")
    ap.add_argument("--batches", type=int, default=40, help="leases per trainer and configuration")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    args = ap.parse_args()
    from service.store.db import to_sqlalchemy_url
    from service.store.migrate import upgrade
    from tests.conftest import start_server, stop_server

    server = to_sqlalchemy_url(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    url = create_database(server, 'bench')
    try:
        upgrade(url)
        t0 = time.perf_counter()
        n_groups = store(url, args.trajectories)
        print(
            f"stored {n_groups * PER_GROUP} trajectories x {TOKENS} tokens in {time.perf_counter() - t0:.0f} s"
        )
        if 4 * args.batches * args.batch > n_groups * PER_GROUP:
            print(
                f"note: 4 trainers x {args.batches} batches need more trajectories; they stop when the queue empties"
            )
        live = start_server(url, workers=args.workers)
        try:
            results = measure(url, live.url, args, min(args.batches, n_groups * PER_GROUP // args.batch))
        finally:
            stop_server(live)
    finally:
        drop_database(server, url)
    report(results, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())

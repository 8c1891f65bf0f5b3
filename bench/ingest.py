"""Ingest benchmark (not a test): groups of 8 trajectories x 1,024 tokens through HTTP vs raw psycopg COPY.

Prints groups/s, MB/s, p50/p99 latency, the service's RSS and the ratio API / COPY for each body format (JSON, and
Arrow: the token arrays as Arrow columns, ``service.ingest.arrow_body``), all measured in one run, into one
database: each run's groups get their own ids. The COPY floor is binary COPY of the same rows, decoded before
the clock starts (the database's work alone); the bodies are also encoded before the clock starts.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.ingest --groups 2000 --clients 8
    ... python -m bench.ingest --batch 50  # 50 groups a request ({"groups": [...]}); COPY commits every 50 anyway
    ... python -m bench.ingest --wire arrow  # one format only
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson
import psycopg

from service.store.dbadmin import create_database, drop_database, libpq_url

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 1024
PER_GROUP = 8


def make_group(i: int, rng: random.Random) -> dict:
    words = ["the", "answer", "is", "therefore", "we", "compute", "step", "so", "x", "=", "42"]
    trajs = []
    for j in range(PER_GROUP):
        text_ = " ".join(rng.choice(words) for _ in range(90))  # ~500 chars per trajectory, ~4 KB a group
        trajs.append({
            "messages": [{"role": "assistant", "content": text_}],
            "token_ids": [rng.randrange(150_000) for _ in range(TOKENS)],
            "loss_mask": [0] * 128 + [1] * (TOKENS - 128),
            # as a sampler reports them: float32 values (vLLM's, the trainer's) written as doubles, mostly near 0
            # (a peaked distribution), so up to 17 significant digits and up to 20 after the point
            "logprobs": [float(np.float32(-rng.expovariate(4.0))) for _ in range(TOKENS)],
            "finish_reason": "stop" if j % 4 else "length",
        })
    return {
        "id": f"bench-{i}", "prompt_id": f"bp-{i % 500}", "policy_version": 1,
        "prompt": {"dataset": "bench", "messages": [{"role": "user", "content": "q"}], "reference": {"answer": "42"}},
        "sampling": {"temperature": 1.0, "max_tokens": TOKENS}, "trajectories": trajs,
    }


def rss_mb(pid: int) -> float:
    """RSS of a process and its children (uvicorn workers), in MB."""
    total = 0
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def request_bodies(groups: list[dict], batch: int, wire: str) -> list[bytes]:
    """The groups ``batch`` a request (one group's body as is, more as ``{"groups": [...]}``), encoded as ``wire``
    sends them; each format's groups get ids of their own (one database holds every run)."""
    from service.ingest.arrow_body import encode_groups

    groups = [{**g, "id": f"{g['id']}-{wire}"} for g in groups]
    chunks = [groups[i] for i in range(len(groups))] if batch <= 1 else \
        [{"groups": groups[i : i + batch]} for i in range(0, len(groups), batch)]
    return [encode_groups(c) if wire == "arrow" else orjson.dumps(c) for c in chunks]


def bench_api(url: str, bodies: list[bytes], clients: int, workers: int, media: str) -> dict[str, float]:
    from tests.conftest import start_server, stop_server

    server = start_server(url, workers=workers)
    lat: list[float] = []
    peak = 0.0
    try:
        def post(body: bytes, http: httpx.Client) -> None:
            t0 = time.perf_counter()
            r = http.post("/v1/groups", content=body, headers={"content-type": media})
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 201, r.text

        def run(chunk: list[bytes]) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for b in chunk:
                    post(b, http)

        chunks = [bodies[i::clients] for i in range(clients)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            futs = [pool.submit(run, c) for c in chunks]
            while not all(f.done() for f in futs):
                peak = max(peak, rss_mb(server.proc.pid))
                time.sleep(0.2)
            for f in futs:
                f.result()
        elapsed = time.perf_counter() - t0
    finally:
        stop_server(server)
    lat.sort()
    return {"s": elapsed, "p50": lat[len(lat) // 2] * 1e3, "p99": lat[int(len(lat) * 0.99) - 1] * 1e3, "rss": peak}


def bench_copy(url: str, groups: list[dict]) -> float:
    """The same rows written with raw psycopg binary COPY (bytea arrays), one group's INSERT and COPY at a time and
    a commit every 50, from rows decoded before the clock starts: the floor for what the API could do."""
    from service.ingest.repository import TRAJECTORY_COLUMNS

    rows = [[(j, orjson.dumps(t["messages"]).decode(), t["messages"][-1]["content"],
              np.asarray(t["token_ids"], "<i4").tobytes(), np.asarray(t["loss_mask"], "u1").tobytes(),
              np.asarray(t["logprobs"], "<f4").tobytes(), TOKENS, sum(t["loss_mask"]), 1, t["finish_reason"], "{}")
             for j, t in enumerate(g["trajectories"])] for g in groups]
    columns = TRAJECTORY_COLUMNS[:12]
    assert columns[:4] == ("group_pk", "idx", "messages", "final_answer") and columns[11] == "metadata", columns
    types = ["int8", "int2", "jsonb", "text", "bytea", "bytea", "bytea", "int4", "int4", "int2", "varchar", "jsonb"]
    t0 = time.perf_counter()
    with psycopg.connect(libpq_url(url)) as conn:
        for n, (g, members) in enumerate(zip(groups, rows, strict=True)):
            with conn.cursor() as cur:
                pk = cur.execute(
                    "INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, n_trajectories, n_tokens)"
                    " VALUES (%s, %s, 'bench', 1, '{}', '{}', '', 8, 8192) RETURNING pk",
                    (g["id"] + "-copy", g["prompt_id"]),
                ).fetchone()[0]
                with cur.copy(f"COPY trajectories ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(types)
                    for row in members:
                        cp.write_row((pk, *row))
            if n % 50 == 49:
                conn.commit()
        conn.commit()
    return time.perf_counter() - t0


def checkpoint(url: str) -> None:
    """Each side starts with no dirty pages of the one before it to write (a checkpoint inside one side's clock
    moved the ratio by 0.3 between runs)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("CHECKPOINT")


WIRES = {"json": "application/json", "arrow": "application/vnd.apache.arrow.stream"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--batch", type=int, default=1, help="groups a request (above 1: {\"groups\": [...]})")
    ap.add_argument("--wire", choices=[*WIRES, "both"], default="both", help="the request body's format")
    args = ap.parse_args()
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    from service.store.db import to_sqlalchemy_url
    from service.store.migrate import upgrade

    server = to_sqlalchemy_url(server)
    rng = random.Random(0)
    groups = [make_group(i, rng) for i in range(args.groups)]
    wires = list(WIRES) if args.wire == "both" else [args.wire]
    bodies = {w: request_bodies(groups, args.batch, w) for w in wires}
    url = create_database(server, 'bench')
    try:
        upgrade(url)
        api = {}
        for w in wires:
            checkpoint(url)
            api[w] = bench_api(url, bodies[w], args.clients, args.workers, WIRES[w])
        checkpoint(url)
        copy_s = bench_copy(url, groups)
    finally:
        drop_database(server, url)
    copy_gps = args.groups / copy_s
    json_mb = sum(len(orjson.dumps(g)) for g in groups) / 1e6
    print(f"payload: {args.groups} groups x {PER_GROUP} trajectories x {TOKENS} tokens, {json_mb / args.groups * 1e3:.0f} KB/group JSON")
    for w in wires:
        mb = sum(map(len, bodies[w])) / 1e6
        a = api[w]
        print(f"API {w:5s} ({args.clients} clients, {args.workers} workers, {args.batch} groups a request): "
              f"{args.groups / a['s']:7.1f} groups/s  {mb / a['s']:6.1f} MB/s  p50 {a['p50']:.1f} ms  p99 {a['p99']:.1f} ms  "
              f"service RSS peak {a['rss']:.0f} MB")
    print(f"COPY (1 connection, binary, bytea):  {copy_gps:7.1f} groups/s")
    for w in wires:
        print(f"ratio API {w} / COPY: {args.groups / api[w]['s'] / copy_gps:.2f}")


if __name__ == "__main__":
    sys.exit(main())

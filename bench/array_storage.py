"""How to store token ids / log-probs: PostgreSQL int4[] / float4[] arrays vs raw little-endian bytea.

COPY in N rows of T tokens each way, then read them back into numpy, in one run; prints the ratios.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.array_storage --rows 4000
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import psycopg
from sqlalchemy.engine import make_url

from service.store.db import to_sqlalchemy_url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    url = make_url(to_sqlalchemy_url(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")))
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 150_000, (args.rows, args.tokens), dtype=np.int32)
    lps = -rng.random((args.rows, args.tokens), dtype=np.float32)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_arr; DROP TABLE IF EXISTS bench_bytes")
        conn.execute("CREATE UNLOGGED TABLE bench_arr (i int, ids int4[], lps float4[])")
        conn.execute("CREATE UNLOGGED TABLE bench_bytes (i int, ids bytea, lps bytea)")
        timings = {}
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY bench_arr FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int4", "int4[]", "float4[]"])
            for i in range(args.rows):
                cp.write_row((i, ids[i].tolist(), lps[i].tolist()))
        timings["copy int4[]/float4[]"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY bench_bytes FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int4", "bytea", "bytea"])
            for i in range(args.rows):
                cp.write_row((i, ids[i].tobytes(), lps[i].tobytes()))
        timings["copy bytea"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = conn.execute("SELECT ids, lps FROM bench_arr ORDER BY i").fetchall()
        back_a = np.array([r[0] for r in rows], dtype=np.int32)
        timings["read int4[]/float4[]"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = conn.execute("SELECT ids, lps FROM bench_bytes ORDER BY i").fetchall()
        back_b = np.stack([np.frombuffer(r[0], "<i4") for r in rows])
        timings["read bytea"] = time.perf_counter() - t0
        assert (back_a == ids).all() and (back_b == ids).all()
        sizes = dict(conn.execute("SELECT 'arr', pg_total_relation_size('bench_arr') UNION ALL "
                                  "SELECT 'bytes', pg_total_relation_size('bench_bytes')").fetchall())
        conn.execute("DROP TABLE bench_arr; DROP TABLE bench_bytes")
    for k, v in timings.items():
        print(f"{k:24s} {v * 1e3:8.0f} ms  ({args.rows / v:8.0f} rows/s)")
    print(f"COPY in:  arrays / bytea = {timings['copy int4[]/float4[]'] / timings['copy bytea']:.1f}x slower")
    print(f"read back: arrays / bytea = {timings['read int4[]/float4[]'] / timings['read bytea']:.1f}x slower")
    print(f"on disk:  arrays {sizes['arr'] / 1e6:.1f} MB, bytea {sizes['bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

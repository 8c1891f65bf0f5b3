"""Auth overhead benchmark (not a test): the same requests with auth off (no key exists) and on (a
Bearer key looked up and its digest compared), side by side in one run, in one process over ASGI.

Prints per-request p50 / p99 and the ratio on / off for a read (GET /v1/policy) and a small write
(POST /v1/groups, 4 trajectories).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.auth --requests 500
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth.keys import provision
from service.store.db import to_sqlalchemy_url
from service.store.dbadmin import create_database, drop_database
from service.store.migrate import upgrade


def make_group(group_id: str) -> dict:
    trajectory = {"messages": [{"role": "assistant", "content": "the answer is 42"}], "finish_reason": "stop"}
    prompt = {"dataset": "bench", "messages": [{"role": "user", "content": "6 * 7?"}], "reference": {"answer": "42"}}
    return {"id": group_id, "prompt_id": "p", "policy_version": 0, "prompt": prompt, "trajectories": [trajectory] * 4}


def _time(client: TestClient, n: int, headers: dict[str, str], write: bool, tag: str) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        start = time.perf_counter()
        if write:
            r = client.post("/v1/groups", json=make_group(f"{tag}-{i}"), headers=headers)
        else:
            r = client.get("/v1/policy", headers=headers)
        out[i] = time.perf_counter() - start
        assert r.status_code in (200, 201), r.text
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    args = ap.parse_args()
    if not os.environ.get("DATABASE_URL"):
        raise SystemExit("error: bench.auth needs a PostgreSQL server it may create databases on: set "
                         "DATABASE_URL, e.g. DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres "
                         "python -m bench.auth")
    server = to_sqlalchemy_url(os.environ["DATABASE_URL"])
    urls = {mode: create_database(server, "gcbench") for mode in ("off", "on")}
    try:
        for url in urls.values():
            upgrade(url)
        token = provision(urls["on"], {"bench": "admin"})["bench"]
        clients = {m: TestClient(create_app(database_url=u)) for m, u in urls.items()}
        headers = {"off": {}, "on": {"Authorization": f"Bearer {token}"}}
        for write in (False, True):
            times: dict[str, list[np.ndarray]] = {"off": [], "on": []}
            for rnd in range(4):  # interleaved rounds: drift on a shared machine hits both modes alike
                for mode in ("off", "on"):
                    times[mode].append(_time(clients[mode], args.requests // 4, headers[mode], write, f"{mode}{rnd}"))
            merged = {m: np.concatenate(t) * 1000 for m, t in times.items()}
            name = "POST /v1/groups" if write else "GET /v1/policy"
            p50 = {m: float(np.percentile(v, 50)) for m, v in merged.items()}
            p99 = {m: float(np.percentile(v, 99)) for m, v in merged.items()}
            print(f"{name:16s} off p50 {p50['off']:.2f} ms p99 {p99['off']:.2f} ms | "
                  f"on p50 {p50['on']:.2f} ms p99 {p99['on']:.2f} ms | on/off p50 {p50['on'] / p50['off']:.2f}x")
    finally:
        for url in urls.values():
            drop_database(server, url)


if __name__ == "__main__":
    main()

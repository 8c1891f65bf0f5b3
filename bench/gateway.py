"""Agent-gateway benchmark (not a test): what the session gateway adds to a call, and what it writes.

Starts ``fake_vllm`` (``tests.service.sessions.fake_upstream``: vLLM's wire format, no model, so the
upstream's own time is tiny and measured on its own) and ``grpo-curator serve`` (one process) on a fresh
database, its gateway pointed at the fake. Then, over real HTTP on loopback:

- latency: the same multi-turn chat bodies sent one at a time straight to the upstream (with the fields the
  gateway adds: ``return_token_ids``, ``logprobs``) and through a session's ``{base_url}/chat/completions``,
  interleaved call by call; p50 / p99 of each and the gateway's added p50 / p99 (target: added p50 <= 5 ms);
- throughput: C sessions (16 and 64 by default) open at once, each making its turns back to back; calls/s of
  the call phase, through the gateway and (the ceiling) straight to the upstream at the same concurrency;
- rows written: the rows in the database's tables counted before and after a phase of known calls (and the
  tuples PostgreSQL counted as inserted / updated in ``pg_stat_user_tables``, settled 11 s before each
  count unless ``--no-pg-stats``), per call, per session open and per session finish (a finished session of group size 1 is ingested as a group of one trajectory).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.gateway
    DATABASE_URL=... python -m bench.gateway --calls 60 --sessions 4 --turns 4 --concurrency 2 4   # a smoke run
    DATABASE_URL=... python -m bench.gateway --no-pg-stats --compare /tmp/before   # this tree against another

``--compare DIR``: a second API served from another checkout of the project (``git worktree add /tmp/before
HEAD``: the code before a change), on a database of its own, measured in the same run -- each latency turn
goes straight to the upstream, then through this tree's gateway, then through DIR's, interleaved call by
call, and each throughput phase runs against both back to back -- so a before / after comparison shares the
machine's load (on a busy machine, numbers from two runs do not compare).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from service.store.dbadmin import create_database, drop_database, libpq_url

TABLES_SQL = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"


def session_body(group_id: str) -> dict[str, Any]:
    return {"group_id": group_id, "group_size": 1, "policy_version": 0, "prompt_id": "bench-gateway",
            "prompt": {"dataset": "bench-agents", "messages": [{"role": "user", "content": "add 2 and 3"}],
                       "reference": {"answer": "5"}}}


def turn_body(turn: int) -> dict[str, Any]:
    """An agent's chat body at ``turn``: the user's task, then per earlier turn the model's reply and a tool's
    output (the history grows as a real agent's does)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
    for k in range(turn):
        messages += [{"role": "assistant", "content": "fak"}, {"role": "user", "content": f"tool add returned {k + 5}"}]
    return {"model": "fake", "messages": messages, "max_tokens": 8, "temperature": 1.0}


def direct_body(turn: int) -> dict[str, Any]:
    """The same body as the gateway forwards it (service.sessions.upstream.upstream_body for chat)."""
    return {**turn_body(turn), "return_token_ids": True, "logprobs": True}


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# -- database counts --------------------------------------------------------------------------------------
def table_counts(db: str, settle_s: float = 0.0) -> dict[str, dict[str, int]]:
    """Per table: rows now (COUNT(*)) and PostgreSQL's cumulative inserted / updated / deleted tuples (exact
    only after ``settle_s`` > 10: an idle backend flushes its table counters up to 10 s late)."""
    time.sleep(settle_s)
    with psycopg.connect(libpq_url(db), autocommit=True) as conn:
        stats = {r[0]: r[1:] for r in conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables").fetchall()}
        out = {}
        for (table,) in conn.execute(TABLES_SQL).fetchall():
            rows = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]  # noqa: S608 (catalog names)
            ins, upd, dele = stats.get(table, (0, 0, 0))
            out[table] = {"rows": rows, "ins": ins, "upd": upd, "del": dele}
        return out


def delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], per: int) -> dict[str, Any]:
    """Changed tables -> {table: {rows, ins, upd, del} per unit}, and the totals per unit."""
    tables: dict[str, dict[str, float]] = {}
    for table, now in after.items():
        was = before.get(table, {"rows": 0, "ins": 0, "upd": 0, "del": 0})
        d = {k: (now[k] - was[k]) / per for k in ("rows", "ins", "upd", "del")}
        if any(d.values()):
            tables[table] = d
    total = {k: sum(t[k] for t in tables.values()) for k in ("rows", "ins", "upd", "del")}
    return {"tables": tables, "total": total}


# -- sessions ---------------------------------------------------------------------------------------------
def open_session(http: httpx.Client, url: str) -> dict[str, Any]:
    r = http.post(url + "/v1/sessions", json=session_body(f"bg-{uuid.uuid4().hex[:12]}"))
    r.raise_for_status()
    return r.json()


def finish_session(http: httpx.Client, s: dict[str, Any]) -> None:
    r = http.post(s["base_url"] + "/finish", json={"rewards": {"reward": 1.0}},
                  headers={"Authorization": f"Bearer {s['api_key']}"})
    r.raise_for_status()


def gateway_call(http: httpx.Client, s: dict[str, Any], turn: int) -> None:
    r = http.post(s["base_url"] + "/chat/completions", json=turn_body(turn),
                  headers={"Authorization": f"Bearer {s['api_key']}"})
    if r.status_code != 200:
        raise RuntimeError(f"gateway call {turn}: {r.status_code} {r.text[:300]}")


def latency(url: str, upstream: str, sessions: int, turns: int, other: str | None = None) -> dict[str, Any]:
    """``sessions`` x ``turns`` calls one at a time, each turn straight to the upstream then through the gateway
    (then through ``other``'s gateway, when given: ``"compare"`` in the result)."""
    urls = [url] if other is None else [url, other]
    direct: list[float] = []
    gated: list[list[float]] = [[] for _ in urls]
    with httpx.Client(timeout=60) as http:
        for _ in range(3):  # warm both paths (connections, the API's first queries)
            http.post(upstream + "/chat/completions", json=direct_body(0)).raise_for_status()
        for u in urls:
            warm = open_session(http, u)
            gateway_call(http, warm, 0)
            finish_session(http, warm)
        for _ in range(sessions):
            opened = [open_session(http, u) for u in urls]
            for turn in range(turns):
                t0 = time.perf_counter()
                r = http.post(upstream + "/chat/completions", json=direct_body(turn))
                direct.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                for s, times in zip(opened, gated, strict=True):
                    t1 = time.perf_counter()
                    gateway_call(http, s, turn)
                    times.append((time.perf_counter() - t1) * 1000)
            for s in opened:
                finish_session(http, s)
    out = _latency_summary(direct, gated[0])
    if other is not None:
        out["compare"] = _latency_summary(direct, gated[1])
    return out


def _latency_summary(direct: list[float], gated: list[float]) -> dict[str, Any]:
    added = [g - d for g, d in zip(gated, direct, strict=True)]
    return {"calls": len(gated), "direct_p50_ms": statistics.median(direct), "direct_p99_ms": percentile(direct, 0.99),
            "gateway_p50_ms": statistics.median(gated), "gateway_p99_ms": percentile(gated, 0.99),
            "added_p50_ms": statistics.median(gated) - statistics.median(direct),
            "added_p99_ms": percentile(gated, 0.99) - percentile(direct, 0.99),
            "added_pairwise_p50_ms": statistics.median(added)}


async def _throughput(url: str, upstream: str, concurrency: int, turns: int, via_gateway: bool) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        sessions: list[dict[str, Any]] = []
        if via_gateway:
            created = await asyncio.gather(*(http.post(url + "/v1/sessions",
                                                       json=session_body(f"bt-{uuid.uuid4().hex[:12]}"))
                                             for _ in range(concurrency)))
            for r in created:
                r.raise_for_status()
            sessions = [r.json() for r in created]
        errors: list[str] = []

        async def agent(i: int) -> None:
            for turn in range(turns):
                try:
                    if via_gateway:
                        s = sessions[i]
                        r = await http.post(s["base_url"] + "/chat/completions", json=turn_body(turn),
                                            headers={"Authorization": f"Bearer {s['api_key']}"})
                    else:
                        r = await http.post(upstream + "/chat/completions", json=direct_body(turn))
                except httpx.TransportError as exc:  # counted and shown, not retried
                    errors.append(f"transport: {type(exc).__name__}")
                    continue
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(concurrency)))
        seconds = time.perf_counter() - start
        for s in sessions:
            r = await http.post(s["base_url"] + "/finish", json={"rewards": {"reward": 1.0}},
                                headers={"Authorization": f"Bearer {s['api_key']}"})
            r.raise_for_status()
    calls = concurrency * turns - len(errors)
    return {"concurrency": concurrency, "calls": calls, "failed": len(errors), "errors": sorted(set(errors))[:5],
            "seconds": seconds, "calls_per_s": calls / seconds}


def rows_written(url: str, db: str, sessions: int, turns: int, settle_s: float) -> dict[str, Any]:
    """Rows per session open, per call and per finish, each phase counted on its own."""
    with httpx.Client(timeout=60) as http:
        c0 = table_counts(db, settle_s)
        opened = [open_session(http, url) for _ in range(sessions)]
        c1 = table_counts(db, settle_s)
        for s in opened:
            for turn in range(turns):
                gateway_call(http, s, turn)
        c2 = table_counts(db, settle_s)
        for s in opened:
            finish_session(http, s)
        c3 = table_counts(db, settle_s)
    return {"sessions": sessions, "calls": sessions * turns, "per_open": delta(c0, c1, sessions),
            "per_call": delta(c1, c2, sessions * turns), "per_finish": delta(c2, c3, sessions)}


# -- running it -------------------------------------------------------------------------------------------
def start_tree_server(tree: str, db: str, env: dict[str, str]) -> Any:
    """``grpo-curator serve`` from the checkout at ``tree`` (its own code, this interpreter), as
    ``tests.conftest.start_server`` starts this one's."""
    from service.client import wait_healthy
    from tests.conftest import LiveServer, free_port

    port = free_port()
    full = {**os.environ, "DATABASE_URL": db, "GRPO_CURATOR_EMBEDDED_WORKER": "false",
            "GRPO_CURATOR_LOG_LEVEL": "warning", "PYTHONPATH": tree, **env}
    cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(cmd, env=full, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=60)
    except RuntimeError as exc:
        proc.kill()
        raise RuntimeError(f"{tree}: {exc}: {proc.stderr.read().decode()[-2000:]}") from None  # type: ignore[union-attr]
    return LiveServer(url, db, proc)


def run(args: argparse.Namespace, server_url: str) -> dict[str, Any]:
    from service.store.db import to_sqlalchemy_url
    from service.store.migrate import upgrade
    from tests.conftest import start_server, stop_server
    from tests.service.sessions.upstreams import start_fake_vllm, stop

    load_before = list(os.getloadavg())  # the machine's 1 / 5 / 15 min load: other jobs skew every number
    admin = to_sqlalchemy_url(server_url)
    db = create_database(admin, "gcbgw")
    other_db = create_database(admin, "gcbgw") if args.compare else None
    upstream = server = other = None
    try:
        upgrade(db)
        upstream = start_fake_vllm()
        env = {"GRPO_CURATOR_INFERENCE_URL": upstream.url,
               "GRPO_CURATOR_SESSION_MAX_CALLS": str(max(args.turns, args.latency_turns) + 1)}
        server = start_server(db, env=env)
        if args.compare:
            assert other_db is not None
            upgrade(other_db)
            other = start_tree_server(args.compare, other_db, env)
        lat_sessions = max(1, -(-args.calls // args.latency_turns))
        result: dict[str, Any] = {"latency": latency(server.url, upstream.url, lat_sessions, args.latency_turns,
                                                     other.url if other is not None else None)}
        result["throughput"] = []
        for c in args.concurrency:
            gw = asyncio.run(_throughput(server.url, upstream.url, c, args.turns, via_gateway=True))
            if other is not None:
                cmp = asyncio.run(_throughput(other.url, upstream.url, c, args.turns, via_gateway=True))
                gw["compare_calls_per_s"], gw["compare_failed"] = cmp["calls_per_s"], cmp["failed"]
            up = asyncio.run(_throughput(server.url, upstream.url, c, args.turns, via_gateway=False))
            result["throughput"].append({**gw, "upstream_calls_per_s": up["calls_per_s"], "upstream_failed": up["failed"]})
        result["rows"] = rows_written(server.url, db, args.sessions, args.turns, 11.0 if args.pg_stats else 0.0)
        result["rows"]["pg_stats_exact"] = args.pg_stats
        result["config"] = {"latency_turns": args.latency_turns, "turns": args.turns, "sessions": args.sessions,
                            "concurrency": args.concurrency, "api_workers": 1, "cpus": os.cpu_count(),
                            "compare": args.compare, "load_before": load_before, "load_after": list(os.getloadavg())}
        return result
    finally:
        for s in (server, other):
            if s is not None:
                stop_server(s)
        if upstream is not None:
            stop(upstream)
        for d in (db, other_db):
            if d is not None:
                drop_database(admin, d)


def report(result: dict[str, Any]) -> None:
    lat, config = result["latency"], result["config"]
    print(f"{config['cpus']} CPUs, load average {config['load_before'][0]:.2f} before, "
          f"{config['load_after'][0]:.2f} after (1 min)")
    print(f"latency, one call at a time ({lat['calls']} calls, loopback):")
    print(f"  {'':<22} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'upstream directly':<22} {lat['direct_p50_ms']:>8.2f} {lat['direct_p99_ms']:>8.2f}")
    print(f"  {'through the gateway':<22} {lat['gateway_p50_ms']:>8.2f} {lat['gateway_p99_ms']:>8.2f}")
    verdict = "meets" if lat["added_p50_ms"] <= 5.0 else "misses"
    print(f"  {'added by the gateway':<22} {lat['added_p50_ms']:>8.2f} {lat['added_p99_ms']:>8.2f}"
          f"   ({verdict} the 5 ms p50 target)")
    cmp = lat.get("compare")
    if cmp is not None:
        print(f"  {'--compare ' + str(config['compare']) + ', interleaved:'}")
        print(f"  {'  through its gateway':<22} {cmp['gateway_p50_ms']:>8.2f} {cmp['gateway_p99_ms']:>8.2f}")
        print(f"  {'  added by it':<22} {cmp['added_p50_ms']:>8.2f} {cmp['added_p99_ms']:>8.2f}")
    print(f"throughput ({config['turns']} turns per session, calls back to back):")
    print(f"  {'sessions':>8} {'calls':>6} {'failed':>6} {'gateway calls/s':>16} {'--compare calls/s':>18}"
          f" {'upstream calls/s':>17}  errors")
    for t in result["throughput"]:
        cmp_rate = f"{t['compare_calls_per_s']:.1f}" if "compare_calls_per_s" in t else "-"
        print(f"  {t['concurrency']:>8} {t['calls']:>6} {t['failed']:>6} {t['calls_per_s']:>16.1f} {cmp_rate:>18}"
              f" {t['upstream_calls_per_s']:>17.1f}  {t['errors'] or ''}")
    rows = result["rows"]
    stats = "pg_stat_user_tables" if rows["pg_stats_exact"] else "pg_stat_user_tables, NOT settled: --pg-stats"
    print(f"rows written ({rows['sessions']} sessions, {rows['calls']} calls; rows = COUNT(*) change, "
          f"ins / upd = {stats}):")
    print(f"  {'':<12} {'table':<20} {'rows':>6} {'ins':>6} {'upd':>6}")
    for phase in ("per_open", "per_call", "per_finish"):
        d = rows[phase]
        for table, v in sorted(d["tables"].items()):
            print(f"  {phase:<12} {table:<20} {v['rows']:>6.2f} {v['ins']:>6.2f} {v['upd']:>6.2f}")
        t = d["total"]
        print(f"  {phase:<12} {'(all tables)':<20} {t['rows']:>6.2f} {t['ins']:>6.2f} {t['upd']:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="latency: calls through the gateway (as many direct)")
    parser.add_argument("--latency-turns", type=int, default=8, help="latency: calls per session")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64], help="throughput: sessions at once")
    parser.add_argument("--turns", type=int, default=16, help="throughput and rows: calls per session")
    parser.add_argument("--sessions", type=int, default=20, help="rows written: sessions counted")
    parser.add_argument("--pg-stats", action=argparse.BooleanOptionalAction, default=True,
                        help="wait 11 s before each count so PostgreSQL's inserted / updated tuple counters are "
                             "complete (--no-pg-stats: row counts only are exact)")
    parser.add_argument("--out", default="bench/out", help="where gateway.json goes")
    parser.add_argument("--compare", metavar="DIR", default=None,
                        help="another checkout of the project (e.g. a git worktree at the commit before a change): "
                             "its API measured in the same run, interleaved")
    args = parser.parse_args(argv)
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        print("set DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    result = run(args, server_url)
    report(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'gateway.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

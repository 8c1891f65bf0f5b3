"""bench/gateway.py at a tiny size: it runs end to end against the real service and fake_vllm, the JSON has
its shape, and the rows it counts are the gateway's writes (one session_calls row per call, one session per
open, one group of one trajectory per finished session of group size 1)."""

from __future__ import annotations

import json

import pytest

from bench import gateway


@pytest.mark.slow
def test_gateway_bench_runs_and_counts_one_call_row_per_call(server_url, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DATABASE_URL", server_url)
    argv = ["--calls", "6", "--latency-turns", "3", "--concurrency", "2", "3", "--turns", "2", "--sessions", "2",
            "--no-pg-stats", "--out", str(tmp_path)]
    assert gateway.main(argv) == 0
    body = json.loads((tmp_path / "gateway.json").read_text())
    lat = body["latency"]
    assert lat["calls"] == 6
    assert 0 < lat["direct_p50_ms"] <= lat["direct_p99_ms"] and 0 < lat["gateway_p50_ms"] <= lat["gateway_p99_ms"]
    assert [(t["concurrency"], t["calls"]) for t in body["throughput"]] == [(2, 4), (3, 6)]
    assert all(t["calls_per_s"] > 0 and t["upstream_calls_per_s"] > 0 for t in body["throughput"])
    assert all(t["failed"] == 0 and t["upstream_failed"] == 0 for t in body["throughput"])
    rows = body["rows"]
    assert rows["calls"] == 4 and rows["pg_stats_exact"] is False

    def counted(phase: str) -> dict[str, float]:
        return {table: v["rows"] for table, v in rows[phase]["tables"].items() if v["rows"]}

    assert counted("per_open") == {"agent_sessions": 1.0}
    assert counted("per_call") == {"session_calls": 1.0}
    assert counted("per_finish") == {"groups": 1.0, "trajectories": 1.0}
    printed = capsys.readouterr().out
    assert "added by the gateway" in printed and "per_call" in printed

"""Export memory is constant in the number of rows: the server's peak RSS (VmHWM of the uvicorn process)
while streaming 100k trajectories stays within a bound of its peak after exporting a 1k-trajectory dataset.

(Checked to fail when the cursor is not streamed: without ``yield_per`` the peak went from ~220 MB to ~680 MB.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from tests.conftest import start_server, stop_server

N_GROUPS, PER_GROUP = 25_000, 4  # 100k trajectories of ~1 KB text each (~100 MB of messages)
TOKENS = 256  # token ids / mask / log-probs per trajectory (the rollouts export streams them as Parquet lists)
BOUND_MB = 120  # generous; holding the rows in memory would take several times the 100 MB of text

FILL = [
    """INSERT INTO prompts (id, dataset, messages, reference, metadata)
       VALUES ('p', 'big', '[{"role": "user", "content": "q"}]', '{"answer": "42"}', '{}')""",
    f"""INSERT INTO groups (id, prompt_id, dataset, policy_version, sampling, metadata, body_hash, status,
                           n_trajectories, n_tokens, reward_spec_name, reward_spec_version)
       SELECT 'g' || i, 'p', CASE WHEN i <= 250 THEN 'small' ELSE 'big' END, i % 7, '{{}}', '{{}}', md5(i::text),
              'ready', {PER_GROUP}, 0, 'x', 1
       FROM generate_series(1, {N_GROUPS + 250}) i""",
    # each trajectory also holds 256 tokens: int32 ids, uint8 mask, float32 log-probs (-1.0), ~2.3 KB of arrays
    f"""INSERT INTO trajectories (group_pk, idx, messages, final_answer, seq_len, num_tokens, num_turns,
                                 finish_reason, metadata, total_reward, outcome, advantage, action,
                                 token_ids, loss_mask, logprobs)
       SELECT g.pk, j, jsonb_build_array(jsonb_build_object('role', 'assistant',
                                                            'content', md5(g.pk::text) || repeat('x', 1000) || j)),
              'a', 0, 10, 1, 'stop', '{{}}', j::float, (j % 2)::float, j - 1.5, 'keep',
              decode(repeat('07000000', {TOKENS}), 'hex'), decode(repeat('01', {TOKENS}), 'hex'),
              decode(repeat('000080bf', {TOKENS}), 'hex')
       FROM groups g, generate_series(0, {PER_GROUP - 1}) j""",
    """INSERT INTO rewards (group_pk, idx, spec_name, spec_version, component, kind, value, details, latency_ms)
       SELECT group_pk, idx, 'x', 1, 'c', 'rule.format', outcome, '{}', 0 FROM trajectories""",
    # what autovacuum does to a table this size soon after: without statistics the planner reads each page's
    # groups by a bitmap scan of every later group (~8 ms a page instead of ~1)
    "ANALYZE groups",
]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def download(url: str, params: dict, out: Path) -> int:
    with httpx.stream("GET", f"{url}/v1/export", params=params, timeout=600) as r, out.open("wb") as f:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            f.write(chunk)
    return out.stat().st_size


@pytest.mark.slow
def test_export_100k_trajectories_in_bounded_memory(make_db: Callable[..., str], tmp_path: Path) -> None:
    url = make_db()
    engine = create_engine(url)
    with engine.begin() as conn:
        for stmt in FILL:
            conn.execute(text(stmt))
    engine.dispose()
    server = start_server(url)
    try:
        pid = server.proc.pid
        small = tmp_path / "small.parquet"
        download(server.url, {"format": "rollouts", "filetype": "parquet", "dataset": "small"}, small)
        assert pq.ParquetFile(small).metadata.num_rows == 1000
        first = pq.read_table(small, columns=["token_ids", "loss_mask", "logprobs"]).slice(0, 1).to_pylist()[0]
        assert first == {"token_ids": [7] * TOKENS, "loss_mask": [1] * TOKENS, "logprobs": [-1.0] * TOKENS}
        base = peak_rss_mb(pid)
        measured = {}
        for fmt, filetype, rows in (("rollouts", "parquet", N_GROUPS * PER_GROUP), ("kto", "jsonl", N_GROUPS * PER_GROUP),
                                    ("dpo", "parquet", N_GROUPS), ("verl", "parquet", 1)):
            out = tmp_path / f"{fmt}.{filetype}"
            size = download(server.url, {"format": fmt, "filetype": filetype, "dataset": "big"}, out)
            n = pq.ParquetFile(out).metadata.num_rows if filetype == "parquet" else out.read_bytes().count(b"\n")
            assert n == rows
            measured[fmt] = (size / 2**20, peak_rss_mb(pid))
            out.unlink()
        print(f"\nserver peak RSS after a 1k-row export: {base:.0f} MB; after each 100k export: "
              + ", ".join(f"{k} ({mb:.0f} MB file) {rss:.0f} MB" for k, (mb, rss) in measured.items()))
        assert max(rss for _, rss in measured.values()) - base < BOUND_MB
    finally:
        stop_server(server)

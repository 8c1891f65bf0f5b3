"""Bytes per trajectory with a group's shared prompt stored once (prompt_prefixes, migration 0016) vs whole.

Posts the same groups through POST /v1/groups (the app in-process) into two fresh databases: one as the
service stores them (``service.store.prefix``), one with the dedup turned off (its threshold set out of
reach), then leases every group back from both and checks each array is bit for bit what was posted. Bytes
per trajectory = what the posts added to pg_total_relation_size of every partition of trajectories and
prompt_prefixes (heap, TOAST, indexes; the empty tables' pages subtracted) / trajectories. Two shapes, G = 8 each:

- demo: ``grpo-curator demo``'s letter-sum (char tokenizer: BOS + "xy=" = 4 prompt tokens, max_tokens 3);
- realistic: a 512-token prompt and a 2,048-token response.

Token ids are drawn from [0, 150000) (a 150k vocabulary), log-probs from -3..0 (the prompt's too: no zeros to
compress); each trajectory's message is one short line, so the numbers are the token arrays plus a small
row.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres python -m bench.prompt_dedup
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.app import create_app
from service.client import decode_arrow
from service.delivery.schemas import ARROW_MEDIA_TYPE
from service.ingest.arrow_body import encode_groups
from service.store import prefix
from service.store.db import to_sqlalchemy_url
from service.store.dbadmin import create_database, drop_database
from service.store.migrate import upgrade

G = 8
SHAPES = {"demo": (4, 3), "realistic": (512, 2048)}  # (prompt tokens, response tokens)
DTYPES = {"token_ids": "<i4", "loss_mask": "u1", "logprobs": "<f4", "versions": "<i4"}


def make_groups(n: int, prompt_len: int, response_len: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(n):
        prompt = rng.integers(0, 150_000, prompt_len).tolist()
        prompt_lp = (-3 * rng.random(prompt_len, dtype=np.float32)).tolist()
        trajectories = []
        for j in range(G):
            trajectories.append({
                "messages": [{"role": "assistant", "content": f"The answer is \\boxed{{{j}}}"}],
                "token_ids": prompt + rng.integers(0, 150_000, response_len).tolist(),
                "loss_mask": [0] * prompt_len + [1] * response_len,
                "logprobs": prompt_lp + (-3 * rng.random(response_len, dtype=np.float32)).tolist(),
                "versions": [-1] * prompt_len + [1] * response_len,
                "finish_reason": "stop",
            })
        groups.append({"id": f"b-{i}", "prompt_id": f"bp-{i}", "policy_version": 1, "trajectories": trajectories,
                       "prompt": {"dataset": "bench", "messages": [{"role": "user", "content": "q"}],
                                  "reference": {"answer": "42"}}})
    return groups


def _sizes(url: str) -> tuple[int, int, int]:
    """(bytes of trajectories' partitions, bytes of prompt_prefixes' partitions, trajectories)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        conn.execute(text("CHECKPOINT"))
        size = {t: conn.execute(text(f"SELECT coalesce(sum(pg_total_relation_size(relid)), 0)"
                                     f" FROM pg_partition_tree('{t}')")).scalar_one()
                for t in ("trajectories", "prompt_prefixes")}
        n = conn.execute(text("SELECT count(*) FROM trajectories")).scalar_one()
    engine.dispose()
    return int(size["trajectories"]), int(size["prompt_prefixes"]), int(n)


def _check_lease(client: TestClient, url: str, groups: list[dict[str, Any]]) -> None:
    """Every group leased back: each array exactly as posted."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE trajectories SET total_reward = idx, advantage = idx - 3.5, action = 'keep'"))
        conn.execute(text("UPDATE groups SET status = 'ready', ready_at = now()"))
    engine.dispose()
    posted = {g["id"]: g for g in groups}
    seen = 0
    while True:
        r = client.post("/v1/batches/lease", json={"trainer_id": "bench", "max_groups": 50},
                        headers={"Accept": ARROW_MEDIA_TYPE})
        if r.status_code == 204:
            break
        for g in decode_arrow(r.content, as_numpy=True)["groups"]:
            for sent, got in zip(posted[g["id"]]["trajectories"], g["trajectories"], strict=True):
                for name, dtype in DTYPES.items():
                    assert np.asarray(sent[name], dtype).tobytes() == np.asarray(got[name], dtype).tobytes()
            seen += 1
        client.post(f"/v1/batches/{r.headers['x-batch-id']}/ack").raise_for_status()
    assert seen == len(groups), (seen, len(groups))


def bodies(groups: list[dict[str, Any]]) -> list[bytes]:
    """The bodies of ``POST /v1/groups``, 10 groups each, as Arrow (``service.ingest.arrow_body``: the service stores
    the same bytes as for the JSON body, without parsing the realistic shape's 8 M numbers as JSON): encoded once
    and posted as they are to both databases."""
    return [encode_groups({"groups": groups[start : start + 10]}) for start in range(0, len(groups), 10)]


def run(server: str, template: str, groups: list[dict[str, Any]], dedup: bool,
        posts: list[bytes] | None = None) -> tuple[int, int, int]:
    """(bytes the posts added to trajectories, to prompt_prefixes, trajectories) in a new database; ``posts``:
    ``bodies(groups)`` when already encoded."""
    url = create_database(server, "bench", template=template)
    saved = prefix.MIN_TOKENS
    prefix.MIN_TOKENS = saved if dedup else 1 << 62  # off: no prefix is ever long enough
    try:
        empty = _sizes(url)
        with TestClient(create_app(database_url=url)) as client:
            for body in bodies(groups) if posts is None else posts:
                r = client.post("/v1/groups", content=body, headers={"Content-Type": ARROW_MEDIA_TYPE})
                assert r.status_code == 201, r.text
            full = _sizes(url)
            _check_lease(client, url, groups)
        return full[0] - empty[0], full[1] - empty[1], full[2]
    finally:
        prefix.MIN_TOKENS = saved
        drop_database(server, url)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo-groups", type=int, default=1000, help="groups of the demo's shape (G = 8 each)")
    ap.add_argument("--groups", type=int, default=100, help="groups of the realistic shape (G = 8 each)")
    args = ap.parse_args()
    server = to_sqlalchemy_url(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    template = create_database(server, "bench")
    try:
        upgrade(template)
        print("bytes per trajectory = what the posts added to trajectories + prompt_prefixes"
              " (pg_total_relation_size of their partitions) / trajectories")
        print(f"{'shape':<10} {'groups':>6} {'prompt':>6} {'response':>8} {'whole':>9} {'deduped':>9} {'saved':>6}")
        for name, n in (("demo", args.demo_groups), ("realistic", args.groups)):
            prompt_len, response_len = SHAPES[name]
            groups = make_groups(n, prompt_len, response_len)
            posts = bodies(groups)
            per = [(t + p) / rows for t, p, rows in (run(server, template, groups, dedup=False, posts=posts),
                                                      run(server, template, groups, dedup=True, posts=posts))]
            print(f"{name:<10} {n:>6} {prompt_len:>6} {response_len:>8} {per[0]:>9.0f} {per[1]:>9.0f}"
                  f" {1 - per[1] / per[0]:>6.1%}")
    finally:
        drop_database(server, template)


if __name__ == "__main__":
    main()

"""The rollout producer against the real service (the demo end to end is in test_demo_agent.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from rollout.producer import RolloutConfig, Spool, build_group, run
from rollout.tasks import DEMO_ALPHABET, EOS, letter_sum_prompts, letter_sum_spec
from service.auth import keys
from service.client import CuratorClient
from tests.conftest import ROOT
from trainer.worker import tiny_model_config


@pytest.fixture
def producer_cfg(live_server, tmp_path):
    with CuratorClient(live_server.url) as c:
        c.upsert_prompts(letter_sum_prompts())
        c.create_reward_spec(letter_sum_spec())
        c.set_dataset("letter-sum", reward_spec="letter-sum")
    return RolloutConfig(service_url=live_server.url, producer_id="p1", run_id="t", seed=1,
                         model_config=tiny_model_config(vocab_size=3 + len(DEMO_ALPHABET)),
                         tokenizer="char:" + DEMO_ALPHABET, dataset="letter-sum", group_size=4, max_tokens=2,
                         requests_per_poll=2, spool_dir=str(tmp_path / "spool"))


def test_producer_posts_valid_groups_with_length_when_cut(live_server, producer_cfg):
    with CuratorClient(live_server.url) as c:
        assert run(producer_cfg, c, max_groups=4) == 4
        ids = [g["id"] for g in c.list_groups()["groups"]]
        assert len(ids) == 4
        finishes = []
        for gid in ids:
            g = c.get_group(gid, include_tokens=True)
            assert g["policy_version"] == 0 and g["dataset"] == "letter-sum"
            for t in g["trajectories"]:
                prompt_len = t["loss_mask"].index(1)
                response = t["token_ids"][prompt_len:]
                assert t["loss_mask"] == [0] * prompt_len + [1] * len(response)
                assert all(lp < 0 for lp in t["logprobs"][prompt_len:])
                assert (t["finish_reason"] == "stop") == (response[-1] == EOS)
                if t["finish_reason"] == "length":
                    assert len(response) == producer_cfg.max_tokens and EOS not in response
                finishes.append(t["finish_reason"])
        assert "length" in finishes
        assert not list(Spool(f"{producer_cfg.spool_dir}/p1").pending())
    # every request the producer claimed was marked done after its group was posted
    engine = create_engine(live_server.db_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM sampling_requests WHERE taken_by = 'p1' GROUP BY status")).all()
    engine.dispose()
    assert dict(rows) == {"done": 4}


def test_restart_reposts_spooled_groups_without_duplicates(live_server, producer_cfg):
    from rollout.producer import Policy
    from rollout.tasks import load_tokenizer

    with CuratorClient(live_server.url) as c:
        policy = Policy(producer_cfg, load_tokenizer(producer_cfg.tokenizer))
        policy.refresh()
        [req_a, req_b] = c.sampling_requests(2, producer_id="p1", dataset="letter-sum")
        spool = Spool(f"{producer_cfg.spool_dir}/p1")
        posted = build_group(policy, req_a, producer_cfg)  # crash after the post, before unspooling
        c.post_group(posted)
        spool.put(posted)
        unposted = build_group(policy, req_b, producer_cfg)  # crash after spooling, before the post
        spool.put(unposted)
        assert build_group(policy, req_b, producer_cfg) == unposted  # sampling is deterministic per id
        run(producer_cfg, c, max_groups=0)  # a restarted producer re-posts what the spool holds
        assert spool.pending() == []
        stored = [g["id"] for g in c.list_groups()["groups"]]
        assert sorted(stored) == sorted([posted["id"], unposted["id"]])


def test_producer_killed_mid_run_then_restarted(live_server, producer_cfg, tmp_path, caplog):
    """The producer process is SIGKILLed mid run (whatever its spool holds then); a producer restarted on the
    same config and spool re-posts what the crash left, with no duplicate and no conflicting body. The restart
    runs the producer's loop (rollout.producer.run, what its CLI runs) in this process: a second process only
    imported torch and transformers again."""
    cfg_path = tmp_path / "producer.json"
    raw = {k: getattr(producer_cfg, k) for k in producer_cfg.__dataclass_fields__}
    cfg_path.write_text(json.dumps(raw))
    cmd = [sys.executable, "-m", "rollout.producer", "--config", str(cfg_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    with CuratorClient(live_server.url) as c:
        while time.monotonic() < deadline and len(c.list_groups()["groups"]) < 3:
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = {g["id"] for g in c.list_groups(limit=1000)["groups"]}
        assert len(before) >= 3
        with caplog.at_level(logging.INFO, logger="rollout.producer"):
            assert run(producer_cfg, c, max_groups=2) >= 2  # the spool's groups, then new ones up to 2
        assert "conflicts" not in caplog.text, caplog.text[-2000:]
        after = [g["id"] for g in c.list_groups(limit=1000)["groups"]]
        assert len(after) == len(set(after)) and before <= set(after)
        assert Spool(f"{producer_cfg.spool_dir}/p1").pending() == []


# Attack: the producer's backlog check called a route that refuses scoped keys: a scoped producer died with a 403.
def test_the_shipped_producer_runs_with_a_dataset_scoped_key(live_server) -> None:
    """Issue: producer keys may be scoped to datasets, and the producer passes its key through. The
    rollout producer's backlog check (max_backlog) calls GET /v1/summary, which refuses every scoped key,
    so a producer configured with a scoped key and max_backlog dies with a 403 on its first poll."""
    from rollout.producer import backlog
    from service.client import CuratorClient

    keys.provision(live_server.db_url, {"atk-rollout-a": "producer"})  # a key exists: auth on
    from sqlalchemy import create_engine

    engine = create_engine(live_server.db_url)
    try:
        with Session(engine) as s, s.begin():
            token = keys.create_key(s, "atk-rollout-scoped", "producer", ["ds-a"])
    finally:
        engine.dispose()
    with CuratorClient(live_server.url, api_key=token) as curator:
        # the producer passes its dataset (rollout/producer.py run(): backlog(client, cfg.dataset));
        # a scoped key reading the counts of every dataset stays refused (design: docs/security.md)
        assert backlog(curator, "ds-a") == 0
        from service.client import CuratorError

        with pytest.raises(CuratorError) as err:
            backlog(curator)
        assert err.value.status_code == 403


# -- 5. the new default max_staleness strands stale groups in 'ready', and the producer waits on them ---
# Attack: groups too stale for the default max_staleness stayed 'ready' and counted as backlog: producer and trainer deadlocked.


def test_groups_the_default_staleness_never_leases_do_not_stall_the_producer(live_server, tmp_path):
    """TrainerConfig.max_staleness now defaults to 2 x save_every when checkpoints are written. The service
    applies it only as a lease filter: groups older than that stay 'ready' for ever -- no trainer with
    the default will take them, nothing drops them -- and the producer's back-pressure (`backlog`, used
    with `max_backlog`) counts 'ready' groups, so once `max_backlog` of them pile up the producer pauses
    for good and the trainer gets 204s for good: a deadlock. Real uvicorn server, real client, the
    trainer's and the producer's own functions."""
    from rollout.producer import backlog
    from service.client import CuratorClient
    from tests.service.delivery.helpers import seed_ready
    from trainer.parallel import DistContext
    from trainer.worker import TrainerConfig
    from trainer.worker import lease as trainer_lease

    cfg = TrainerConfig(
        model_config={"model_type": "qwen2"},
        checkpoint_dir=str(tmp_path / "ckpt"),
        save_every=10,
        wait_seconds=0.0,
        max_groups=8,
    )
    assert cfg.max_staleness == 20  # "auto"
    engine = create_engine(live_server.db_url)
    try:
        with CuratorClient(live_server.url) as client:
            seed_ready(client._http, engine, 4, prefix="old", policy_version=3)
            client.publish_policy(30, {})  # the trainer moved on (say the producer was down for a while)
            ctx = DistContext(rank=0, world_size=1, device=torch.device("cpu"))
            assert trainer_lease(client, cfg, ctx) is None  # too stale for the default: right
            # ... but a producer with max_backlog=4 now waits for ever on groups nobody will lease
            assert backlog(client) == 0, (
                "stale groups no trainer will lease still count as the producer's backlog"
            )
    finally:
        engine.dispose()

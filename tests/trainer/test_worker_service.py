"""The trainer worker against the real service: lease -> train -> ack -> publish, and resume."""

from __future__ import annotations

import time

import pytest
import torch

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from trainer.checkpoint import latest_checkpoint, load_trainer_state
from trainer.worker import TrainerConfig, build_model, run, tiny_model_config


def _ready_groups(server, n: int) -> None:
    with CuratorClient(server.url) as c:
        for i in range(n):
            c.post_group(make_group(f"w-{i}", prompt_id=f"wp-{i}", answers=["42", "41", "42", "0"]))
    with Scorer() as scorer:
        result = drain(make_sessionmaker(get_engine(server.db_url)), scorer)
    assert result.ready == n


@pytest.fixture
def cfg(live_server, tmp_path):
    return TrainerConfig(service_url=live_server.url, trainer_id="t-test", model_config=tiny_model_config(vocab_size=512),
                         lr=1e-2, max_groups=2, wait_seconds=0.5, max_idle_polls=1, checkpoint_dir=str(tmp_path / "ckpt"),
                         save_every=1)


def test_worker_trains_acks_publishes_and_resumes(live_server, cfg):
    _ready_groups(live_server, 6)
    initial = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}
    with CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=2)
        assert len(history) == 2
        assert client.get_policy()["version"] == 2
        assert set(client.get_policy()["metrics"]) >= {"loss", "grad_norm", "clip_frac_low", "clip_frac_high"}
        consumed = client.list_groups(status="consumed")["groups"]
        assert len(consumed) == 4
        ckpt = latest_checkpoint(cfg.checkpoint_dir)
        assert load_trainer_state(ckpt).policy_version == 2
        from safetensors.torch import load_file

        trained = load_file(str(ckpt / "model.safetensors"))
        assert any(not torch.equal(trained[k], initial[k]) for k in trained)
        # a restarted worker continues the version count from its checkpoint
        run(cfg, client, max_steps=1)
        assert client.get_policy()["version"] == 3
        assert len(client.list_groups(status="consumed")["groups"]) == 6


# Attack: a lease the heartbeat lost (409) was counted acked, and its groups were trained again when re-leased.
def test_a_lease_the_heartbeat_lost_is_not_counted_acked_and_its_groups_are_not_trained_again(live_server):
    """The heartbeat's 409 (lease expired and reaped while training) is consulted: the batch counts as
    refused, its groups go into the ledger, and when a lease brings them back they are acked untrained."""
    from service.delivery.service import reap_expired
    from trainer.delivery import Heartbeat, Ledger, lease_batch

    with CuratorClient(live_server.url) as c:
        for i in range(2):
            c.post_group(make_group(f"hb-{i}", prompt_id=f"hbp{i}", answers=["42", "41", "42", "0"]))
        factory = make_sessionmaker(get_engine(live_server.db_url))
        with Scorer(processes=1, timeout_s=20) as scorer:
            assert drain(factory, scorer).ready == 2
        heartbeat, ledger = Heartbeat(c, 0.5), Ledger()  # not started: beats by hand
        batch = lease_batch(c, "t", max_groups=4, lease_seconds=0.5)
        heartbeat.hold(batch["batch_id"])
        ledger.add(batch)
        time.sleep(0.8)
        with factory.begin() as s:
            assert reap_expired(s) == 1
        heartbeat.beat()
        assert heartbeat.lost == {batch["batch_id"]}
        assert ledger.settle(c, heartbeat.lost) == 1 and not ledger.pending
        assert sorted(ledger.trained) == ["hb-0", "hb-1"]
        again = lease_batch(c, "t", max_groups=4, lease_seconds=30)
        assert sorted(g["id"] for g in again["groups"]) == ["hb-0", "hb-1"]
        assert ledger.strip(c, again) is None  # nothing left to train: acked at once
        assert not ledger.trained
        assert sorted(g["id"] for g in c.list_groups(status="consumed")["groups"]) == ["hb-0", "hb-1"]

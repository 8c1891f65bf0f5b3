"""A trainer refuses a batch with a token id beyond its vocabulary, and the service honours it: the nack
carries the trainer's ``vocab_size``, the service finds the stored token id >= vocab_size itself and drops
that group as untrainable (it does not come back forever); the trainer trains the rest."""

from __future__ import annotations

import logging

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory
from trainer.worker import TrainerConfig, run, tiny_model_config


def test_the_worker_nacks_an_out_of_vocabulary_batch_and_trains_the_rest(live_server, tmp_path, capsys):
    bad = make_group("oov", prompt_id="p-oov", answers=["42", "41"])
    bad["trajectories"][1] = make_trajectory(answer="41", seed=1, token_ids=[5, 6, 7, 9000, 8, 9, 10, 11, 12, 13])
    with CuratorClient(live_server.url) as c:
        c.post_group(bad)
        c.post_group(make_group("fine", prompt_id="p-fine", answers=["42", "41"]))
    with Scorer() as scorer:
        assert drain(make_sessionmaker(get_engine(live_server.db_url)), scorer).ready == 2
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="t-oov", model_config=tiny_model_config(512),
                        max_groups=1, wait_seconds=0.5, max_idle_polls=2, lr=1e-2)
    with CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=5)
        assert len(history) == 1  # the fine group trained; the bad one was refused, not crashed on
        group = client.get_group("oov")
        assert group["status"] == "dropped"
        assert client.get_group("fine")["status"] == "consumed"
    out = capsys.readouterr().out
    assert out.count("[train] v1 ") == 1 and "reward " in out and "tokens/s" in out and "lease wait" in out


    decisions = [d for d in group.get("decisions", []) if d.get("rule") == "untrainable"]
    assert decisions and "token id 9000" in decisions[0]["reason"] and "vocab_size 512" in decisions[0]["reason"]


# Attack: with one bad group in a batch of two, the trainer logged a WARNING "batch … refused and nacked (its
# groups are dropped)" and an ERROR with the same text: twice, and wrong, since only the bad group is dropped
# and the other goes back to the queue and is trained in a later lease.
def test_a_refused_batch_is_logged_once_naming_the_dropped_group_and_the_rest_going_back(live_server, caplog):
    bad = make_group("vocab-bad", prompt_id="p-vocab-bad", answers=["42", "41"])
    bad["trajectories"][0] = make_trajectory(answer="42", seed=2, token_ids=[5, 6, 7, 999999, 8, 9, 10, 11, 12, 13])
    with CuratorClient(live_server.url) as c:
        c.post_group(bad)
        c.post_group(make_group("vocab-fine", prompt_id="p-vocab-fine", answers=["42", "41"]))
    with Scorer() as scorer:
        assert drain(make_sessionmaker(get_engine(live_server.db_url)), scorer).ready == 2
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="t-vocab", model_config=tiny_model_config(512),
                        max_groups=2, wait_seconds=0.5, max_idle_polls=2, lr=1e-2)
    with caplog.at_level(logging.INFO, logger="trainer"), CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=5)
        assert len(history) == 1  # the good group, leased again after the nack, trained
        assert client.get_group("vocab-bad")["status"] == "dropped"
        assert client.get_group("vocab-fine")["status"] == "consumed"
    refused = [r for r in caplog.records if "refused" in r.getMessage() and r.name.startswith("trainer")]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    line = refused[0].getMessage()
    assert refused[0].levelno == logging.WARNING
    assert "group 'vocab-bad' trajectory 0" in line and "token id 999999" in line and "512" in line
    assert "group(s) 'vocab-bad' dropped" in line and "the other 1 group(s) go back to the queue" in line
    assert "its groups are dropped" not in line and "vocab-fine' dropped" not in line
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("trainer")]

"""A trainer refuses a batch with a token id beyond its vocabulary, and the service honours it: the nack
carries the trainer's ``vocab_size``, the service finds the stored token id >= vocab_size itself and drops
that group as untrainable (it does not come back forever); the trainer trains the rest."""

from __future__ import annotations

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

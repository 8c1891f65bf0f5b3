"""What the real trainer worker loop does with a leased batch, against the real service: a segmented
trajectory (null top-level arrays, `segments`) trains and is acked; a batch whose later PPO update is
non-finite was trained (acked, published with `nonfinite_updates`); a batch with nothing to train is
acked at once even with a checkpoint directory (no lease held until the next checkpoint)."""

from __future__ import annotations

import pytest

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory
from trainer.delivery import unusable
from trainer.worker import TrainerConfig, run, tiny_model_config

MODEL = tiny_model_config(vocab_size=512)


class RecordingClient(CuratorClient):
    """The real HTTP client, recording the trainer's delivery calls in order (lease answers, acks, nacks)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls: list[tuple[str, object]] = []
        self.leased: list[dict] = []

    def lease(self, trainer_id, **kwargs):
        leases = sum(c[0] == "lease" for c in self.calls)
        assert leases < 20, f"the trainer keeps leasing (a nack / requeue poison loop?): {self.calls}"
        batch = super().lease(trainer_id, **kwargs)
        if batch is not None:
            self.leased.append(batch)
        self.calls.append(("lease", None if batch is None else batch["batch_id"]))
        return batch

    def ack(self, batch_id):
        self.calls.append(("ack", batch_id))
        return super().ack(batch_id)

    def nack(self, batch_id, **kwargs):
        self.calls.append(("nack", batch_id))
        return super().nack(batch_id, **kwargs)


def _ready(server, groups: list[dict]) -> None:
    with CuratorClient(server.url) as c:
        for g in groups:
            c.post_group(g)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(make_sessionmaker(get_engine(server.db_url)), scorer).ready == len(groups)


def _segmented(answer: str, k: int, seed: int) -> dict:
    t = make_trajectory(answer=answer, seed=seed)
    for key in ("token_ids", "loss_mask", "logprobs"):
        del t[key]
    t["segments"] = []
    for j in range(k):
        s = make_trajectory(seed=seed * 100 + j, prompt_len=3, response_len=4)
        t["segments"].append({key: s[key] for key in ("token_ids", "loss_mask", "logprobs")})
    return t


def _cfg(server, **kw) -> TrainerConfig:
    base = dict(service_url=server.url, trainer_id="t-out", model_config=MODEL, lr=1e-2, max_groups=1,
                wait_seconds=0.3, max_idle_polls=1)
    return TrainerConfig(**{**base, **kw})


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_segmented_group_is_leased_trained_and_acked_not_nacked(live_server, tmp_path, checkpointed):
    g = make_group("seg", prompt_id="p-seg", answers=["42", "41", "42", "0"])
    g["trajectories"][0] = _segmented("42", 3, 1)
    g["trajectories"][1] = _segmented("41", 2, 2)
    _ready(live_server, [g])
    extra = {"checkpoint_dir": str(tmp_path / "ck"), "save_every": 1} if checkpointed else {}
    with RecordingClient(live_server.url) as client:
        history = run(_cfg(live_server, **extra), client, max_steps=3)
        assert len(history) == 1 and history[0]["updates"] == 1.0
        (batch,) = client.leased
        trajs = batch["groups"][0]["trajectories"]
        assert trajs[0]["token_ids"] is None and len(trajs[0]["segments"]) == 3  # really delivered segmented
        assert unusable(batch, need_logprobs=False, vocab_size=512) is None
        # every segment's response tokens trained: 3 + 2 segments x 4 response tokens (minus the shift's
        # first target position, which is a prompt token) + 2 plain trajectories x 6
        assert history[0]["loss_tokens"] == 5 * 4 + 2 * 6
        assert ("ack", batch["batch_id"]) in client.calls and not any(c[0] == "nack" for c in client.calls)
        assert client.get_group("seg")["status"] == "consumed"
        assert client.get_policy()["version"] == 1


def test_a_non_finite_second_update_keeps_the_first_acks_and_publishes_it(live_server):
    """ppo_epochs=2 with AdamW at lr 1e25: the first update is finite, the second is not. The batch was
    trained: acked (consumed, never nacked), version 1 published with updates 1 and nonfinite_updates 1."""
    _ready(live_server, [make_group("nf", prompt_id="p-nf", answers=["42", "41", "42", "0"])])
    with RecordingClient(live_server.url) as client:
        history = run(_cfg(live_server, lr=1e25, ppo_epochs=2, max_grad_norm=None), client, max_steps=3)
        assert len(history) == 1
        assert history[0]["updates"] == 1.0 and history[0]["nonfinite_updates"] == 1.0
        assert history[0]["skipped"] == 0.0
        assert [c[0] for c in client.calls if c[0] != "lease"] == ["ack"]
        assert client.get_group("nf")["status"] == "consumed"
        policy = client.get_policy()
        assert policy["version"] == 1 and policy["metrics"]["nonfinite_updates"] == 1.0


def test_a_batch_with_nothing_to_train_is_acked_at_once_with_a_checkpoint_dir(live_server, tmp_path):
    """All loss_mask 0: no update depends on the batch, so it is acked before the next lease (not held
    until the next checkpoint, which with save_every=10 would be never in this run)."""
    g = make_group("zero", prompt_id="p-zero", answers=["42", "41", "42", "0"])
    for t in g["trajectories"]:
        t["loss_mask"] = [0] * len(t["loss_mask"])
    ok = make_group("ok", prompt_id="p-ok", answers=["42", "41", "42", "0"])
    _ready(live_server, [g, ok])
    cfg = _cfg(live_server, checkpoint_dir=str(tmp_path / "ck"), save_every=10, max_idle_polls=1)
    with RecordingClient(live_server.url) as client:
        history = run(cfg, client, max_steps=5)
        assert len(history) == 1  # the ok group trained; the zero one took no update, published nothing
        zero = next(b["batch_id"] for b in client.leased if b["groups"][0]["id"] == "zero")
        at = client.calls.index(("lease", zero))
        assert client.calls[at + 1] == ("ack", zero)  # acked before anything else was leased
        assert client.get_group("zero")["status"] == "consumed"
        assert client.get_policy()["version"] == 1

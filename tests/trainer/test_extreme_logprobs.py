"""Behaviour log-probs at the edges never stop the trainer: its metrics are float64 (a float32 mean of
|log pi_old - log pi_behaviour| near 3.4e38 was inf), a metric JSON cannot carry is left out of the
published version with a warning naming it (httpx raised "Out of range float values are not JSON
compliant"; with a checkpoint directory the batch was not acked yet, so it came back: a poison loop), and a
batch with extreme-but-legal log-probs trains, publishes and is acked, with or without a checkpoint dir."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from service.client import CuratorClient
from service.ingest.schemas import LOGPROB_FLOOR, LOGPROB_SLACK
from tests.helpers import make_group
from tests.trainer.batches import make_batch, tiny_model
from tests.trainer.test_worker_outcomes import RecordingClient, _cfg, _ready
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step
from trainer.worker import run


def _behaviour(batch: dict, value: float) -> dict:
    out = copy.deepcopy(batch)
    for g in out["groups"]:
        for t in g["trajectories"]:
            t["logprobs"] = [value if m else 0.0 for m in t["loss_mask"]]
    return out


@pytest.mark.parametrize("value", [-3.4e38, 3.4e38, LOGPROB_FLOOR, LOGPROB_SLACK])
def test_the_step_metrics_stay_finite_at_float32_extremes(value):
    """Even values ingest now refuses (data stored before the rule) give finite metrics and an update."""
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = train_step(PolicyLogprobs(model, 6), opt, pack_batch(_behaviour(make_batch(seed=1), value), 10_000),
                         StepConfig())
    assert metrics["skipped"] == 0.0 and metrics["updates"] == 1.0
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad
    assert metrics["behaviour_mismatch"] == pytest.approx(abs(value), rel=1e-3, abs=10.0)


def test_publishing_leaves_out_a_non_finite_metric_and_names_it(live_server, caplog):
    with caplog.at_level(logging.WARNING, logger="service.client"), CuratorClient(live_server.url) as c:
        c.publish_policy(1, {"loss": 0.5, "behaviour_mismatch": float("inf"), "by": {"x": float("nan"), "y": 1.0}})
        assert c.get_policy()["metrics"] == {"loss": 0.5, "by": {"y": 1.0}}
    text = caplog.text
    assert "behaviour_mismatch" in text and "by.x" in text


class StaleStoreClient(RecordingClient):
    """Hands the trainer behaviour log-probs of -3.4e38, as a database filled before ingest's rule would."""

    def lease(self, trainer_id, **kwargs):
        batch = super().lease(trainer_id, **kwargs)
        if batch is not None:
            batch.update(_behaviour(batch, -3.4e38))
        return batch


def _trained_published_acked(client: RecordingClient, history: list[dict]) -> None:
    assert len(history) == 1 and history[0]["updates"] == 1.0
    (batch,) = client.leased
    assert ("ack", batch["batch_id"]) in client.calls and not any(c[0] == "nack" for c in client.calls)
    assert client.get_group(batch["groups"][0]["id"])["status"] == "consumed"
    policy = client.get_policy()
    assert policy["version"] == 1 and all(math.isfinite(v) for v in policy["metrics"].values()
                                           if isinstance(v, float))


@pytest.mark.parametrize("checkpointed", [False, True])
def test_extreme_but_legal_logprobs_train_publish_and_ack(live_server, tmp_path, checkpointed):
    g = make_group("edge", prompt_id="p-edge", answers=["42", "41", "42", "0"])
    for i, t in enumerate(g["trajectories"]):
        t["logprobs"] = [(LOGPROB_FLOOR if i % 2 else LOGPROB_SLACK) if m else 0.0 for m in t["loss_mask"]]
    _ready(live_server, [g])
    extra = {"checkpoint_dir": str(tmp_path / "ck"), "save_every": 1} if checkpointed else {}
    with RecordingClient(live_server.url) as client:
        history = run(_cfg(live_server, **extra), client, max_steps=1)
        _trained_published_acked(client, history)
        assert history[0]["behaviour_mismatch"] > 1e4


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_batch_of_absurd_stored_logprobs_is_no_poison_loop(live_server, tmp_path, checkpointed):
    _ready(live_server, [make_group("inf", prompt_id="p-inf", answers=["42", "41", "42", "0"])])
    extra = {"checkpoint_dir": str(tmp_path / "ck"), "save_every": 1} if checkpointed else {}
    with StaleStoreClient(live_server.url) as client:
        history = run(_cfg(live_server, **extra), client, max_steps=1)
        _trained_published_acked(client, history)

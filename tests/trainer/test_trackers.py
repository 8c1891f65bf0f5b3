"""Trainer step metrics reach the configured tracker under the names TRL users know."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from service.client import CuratorClient
from tests.trainer.test_worker_service import _ready_groups
from trainer import trackers
from trainer.worker import TrainerConfig, run, tiny_model_config


def _batch(*groups):
    return {"groups": [{"trajectories": [{"total_reward": r, "loss_mask": [1] * n + [0]} for r, n in g]} for g in groups]}


def test_batch_metrics_against_numpy():
    batch = _batch([(1.0, 3), (1.0, 5), (1.0, 4), (1.0, 4)], [(1.0, 2), (0.0, 9), (0.0, 1), (1.0, 8)])
    got = trackers.batch_metrics(batch)
    rewards = np.array([[1, 1, 1, 1], [1, 0, 0, 1]], dtype=float)
    assert got["reward"] == pytest.approx(rewards.mean())
    assert got["reward_std"] == pytest.approx(rewards.std(axis=1).mean())  # 0.25
    assert got["frac_reward_zero_std"] == 0.5
    lengths = [3, 5, 4, 4, 2, 9, 1, 8]  # the loss mask's ones, not the padded length
    assert got["completions/mean_length"] == pytest.approx(np.mean(lengths))
    assert (got["completions/min_length"], got["completions/max_length"]) == (1.0, 9.0)


def test_batch_metrics_edges():
    assert trackers.batch_metrics(None) == {} and trackers.batch_metrics({"groups": []}) == {}
    one = trackers.batch_metrics(_batch([(0.5, 2)]))  # a group of one has std 0
    assert one["frac_reward_zero_std"] == 1.0 and one["reward_std"] == 0.0
    unscored = trackers.batch_metrics({"groups": [{"trajectories": [{"total_reward": None, "token_ids": [1, 2]}]}]})
    assert "reward" not in unscored and unscored["completions/mean_length"] == 2.0


def test_trl_names():
    step = {"loss": 0.5, "pg_loss": 0.4, "kl_ref": 0.01, "entropy": 2.0, "clip_frac_low": 0.02,
            "clip_frac_high": 0.03, "grad_norm": 1.5, "approx_kl": 0.001, "tis_weight": 0.9}
    got = trackers.trl_metrics(step)
    assert got["kl"] == 0.01 and got["entropy"] == 2.0 and got["loss"] == 0.5 and got["grad_norm"] == 1.5
    assert got["clip_ratio"] == got["clip_ratio/region_mean"] == pytest.approx(0.05)
    assert (got["clip_ratio/low_mean"], got["clip_ratio/high_mean"]) == (0.02, 0.03)
    assert got["train/approx_kl"] == 0.001 and got["train/tis_weight"] == 0.9
    assert "kl" not in trackers.trl_metrics({"approx_kl": 0.1})  # no reference model: no `kl`, as in TRL


def test_configuration_errors(tmp_path):
    assert trackers.from_env(env={}).trackers == []
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        trackers.from_env(env={"GRPO_CURATOR_TRACKERS": "jsonl,comet", "GRPO_CURATOR_TRACKER_DIR": str(tmp_path)})
    for name in ("wandb", "mlflow", "tensorboard"):
        if importlib.util.find_spec(name) is None:
            with pytest.raises(ValueError, match=rf"pip install 'grpo-curator\[{name}\]'"):
                trackers.from_env(env={"GRPO_CURATOR_TRACKERS": name})


def test_the_trainer_logs_each_step(live_server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CURATOR_TRACKERS", "jsonl")
    monkeypatch.setenv("GRPO_CURATOR_TRACKER_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GRPO_CURATOR_TRACKER_RUN", "r1")
    _ready_groups(live_server, 4)
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="t-track", model_config=tiny_model_config(vocab_size=512),
                        lr=1e-2, max_groups=2, wait_seconds=0.5, max_idle_polls=1)
    with CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=2)
    lines = [json.loads(line) for line in (tmp_path / "runs" / "r1.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line, step in zip(lines, history, strict=True):
        assert line["loss"] == pytest.approx(step["loss"]) and line["entropy"] == pytest.approx(step["entropy"])
        assert {"clip_ratio", "frac_reward_zero_std", "completions/mean_length", "reward"} <= set(line)
        assert line["frac_reward_zero_std"] == 0.0  # curated: zero-variance groups never reach the trainer

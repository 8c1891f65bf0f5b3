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
    assert got["reward_std"] == pytest.approx(rewards.std(ddof=1))  # TRL's: the batch's sample std
    assert got["reward_std_in_group"] == pytest.approx(rewards.std(axis=1).mean())  # ours: 0.25
    assert got["frac_reward_zero_std"] == 0.5
    lengths = [3, 5, 4, 4, 2, 9, 1, 8]  # the loss mask's ones, not the padded length
    assert got["completions/mean_length"] == pytest.approx(np.mean(lengths))
    assert (got["completions/min_length"], got["completions/max_length"]) == (1.0, 9.0)


def test_batch_metrics_edges():
    assert trackers.batch_metrics(None) == {} and trackers.batch_metrics({"groups": []}) == {}
    one = trackers.batch_metrics(_batch([(0.5, 2)]))  # a group of one has std 0
    assert one["frac_reward_zero_std"] == 1.0 and one["reward_std_in_group"] == 0.0
    assert "reward_std" not in one  # one reward: TRL's sample std is undefined (NaN there), not logged
    unscored = trackers.batch_metrics({"groups": [{"trajectories": [{"total_reward": None, "token_ids": [1, 2]}]}]})
    assert "reward" not in unscored and unscored["completions/mean_length"] == 2.0


def test_trl_names():
    step = {"loss": 0.5, "pg_loss": 0.4, "kl_ref": 0.01, "entropy": 2.0, "clip_frac_low": 0.02,
            "clip_frac_high": 0.03, "grad_norm": 1.5, "approx_kl": 0.001, "tis_weight": 0.9}
    got = trackers.trl_metrics(step)
    assert got["kl"] == 0.01 and got["entropy"] == 2.0 and got["loss"] == 0.5 and got["grad_norm"] == 1.5
    assert got["clip_ratio"] == got["clip_ratio/region_mean"] == pytest.approx(0.05)
    assert (got["clip_ratio/low_mean"], got["clip_ratio/high_mean"]) == (0.02, 0.03)
    assert got["approx_kl"] == 0.001 and got["tis_weight"] == 0.9  # ours keep their names
    assert (got["clip_ratio/low_min"], got["clip_ratio/high_max"]) == (0.02, 0.03)
    assert "kl" not in trackers.trl_metrics({"approx_kl": 0.1})  # no reference model: no `kl`, as in TRL
    assert trackers.trl_metrics({"lr": 1e-6})["learning_rate"] == 1e-6
    assert trackers.with_prefix({"reward": 1.0, "rewards/correct/mean": 0.5}) == {
        "train/reward": 1.0, "train/rewards/correct/mean": 0.5}  # W&B / TensorBoard, as transformers' callbacks


def test_component_rewards_and_clipped_ratio_when_the_batch_carries_them():
    batch = {"groups": [{"trajectories": [
        {"total_reward": 1.0, "token_ids": [1, 2, 3], "finish_reason": "stop", "rewards": {"correct": 1.0, "fmt": 0.0}},
        {"total_reward": 0.0, "token_ids": [1, 2], "finish_reason": "length", "rewards": {"correct": 0.0, "fmt": None}},
        {"total_reward": 1.0, "token_ids": [1], "finish_reason": "stop", "rewards": {"correct": 1.0, "fmt": float("nan")}},
    ]}]}
    got = trackers.batch_metrics(batch)
    assert got["rewards/correct/mean"] == pytest.approx(2 / 3)
    assert got["rewards/correct/std"] == pytest.approx(np.std([1, 0, 1], ddof=1))
    assert got["rewards/fmt/mean"] == 0.0 and "rewards/fmt/std" not in got  # errored / NaN values left out
    assert got["completions/clipped_ratio"] == pytest.approx(1 / 3)
    assert trackers.batch_tokens(batch) == 6


def test_num_tokens_accumulates_and_learning_rate_comes_from_the_config(tmp_path):
    made = trackers.from_env({"lr": 3e-6}, env={"GRPO_CURATOR_TRACKERS": "jsonl", "GRPO_CURATOR_TRACKER_DIR": str(tmp_path),
                                                 "GRPO_CURATOR_TRACKER_RUN": "r"})
    batch = {"groups": [{"trajectories": [{"total_reward": 1.0, "token_ids": [1, 2, 3]}]}]}
    made.log_step(1, {"loss": 0.1}, batch)
    made.log_step(2, {"loss": 0.1}, batch)
    made.close()
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["num_tokens"] for line in lines] == [3.0, 6.0]
    assert all(line["learning_rate"] == 3e-6 for line in lines)
    assert "train/loss" not in lines[0] and lines[0]["loss"] == 0.1  # JSONL: TRL's log-history names


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
        assert {"clip_ratio", "frac_reward_zero_std", "completions/mean_length", "reward", "num_tokens",
                "learning_rate", "clip_ratio/low_min", "clip_ratio/high_max"} <= set(line)
        assert line["learning_rate"] == cfg.lr
        assert line["frac_reward_zero_std"] == 0.0  # curated: zero-variance groups never reach the trainer


def test_a_real_step_logs_component_rewards_and_clipped_ratio_from_the_lease(live_server, tmp_path, monkeypatch):
    """One hand-built group through the real pipeline (scorer, curation keeping cut members) and one real
    trainer step on a tiny model: the tracker line holds TRL's ``rewards/correct/mean|std`` of the group's
    verifier values (1, 0, 1, 0) and ``completions/clipped_ratio`` = 1/4 (member 1 cut at ``length``)."""
    from reward_models.scoring import Scorer
    from service.store.db import get_engine, make_sessionmaker
    from service.worker.pipeline import drain
    from tests.helpers import make_group, make_trajectory

    monkeypatch.setenv("GRPO_CURATOR_TRACKERS", "jsonl")
    monkeypatch.setenv("GRPO_CURATOR_TRACKER_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GRPO_CURATOR_TRACKER_RUN", "cut")
    group = make_group("cut-0", prompt_id="cut-p", answers=["42", "41", "42", "0"])
    group["trajectories"][1] = make_trajectory(answer="41", seed=1, finish_reason="length")
    with CuratorClient(live_server.url) as c:
        c.create_curation_policy({"name": "keep-cut", "finish_reason_actions": {"length": "keep"}})
        c.set_dataset("toy", curation_policy="keep-cut")
        c.post_group(group)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(make_sessionmaker(get_engine(live_server.db_url)), scorer).ready == 1
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="t-cut", model_config=tiny_model_config(vocab_size=512),
                        lr=1e-2, max_groups=1, wait_seconds=0.5, max_idle_polls=1)
    with CuratorClient(live_server.url) as client:
        assert len(run(cfg, client, max_steps=1)) == 1
    (line,) = [json.loads(x) for x in (tmp_path / "runs" / "cut.jsonl").read_text().splitlines()]
    assert line["rewards/correct/mean"] == 0.5
    assert line["rewards/correct/std"] == pytest.approx(float(np.std([1, 0, 1, 0], ddof=1)))
    assert line["completions/clipped_ratio"] == 0.25

"""What the trainer worker says and does with a batch it cannot train, and what it prints per update."""

from __future__ import annotations

import pytest

from trainer.delivery import unusable
from trainer.worker import config_from_args, progress_line


def test_a_token_outside_the_vocabulary_is_named_with_group_trajectory_position_and_size():
    batch = {"groups": [{"id": "g-9", "trajectories": [
        {"index": 0, "token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": None, "advantage": 1.0},
        {"index": 1, "token_ids": [1, 700, 3], "loss_mask": [0, 1, 1], "logprobs": None, "advantage": -1.0},
    ]}]}
    reason = unusable(batch, need_logprobs=False, vocab_size=512)
    assert reason == ("group 'g-9' trajectory 1: token id 700 at position 1 is outside the model's vocabulary "
                      "(vocab_size 512)")
    batch["groups"][0]["trajectories"][1]["token_ids"][1] = -1
    assert "token id -1 at position 1" in unusable(batch, need_logprobs=False, vocab_size=512)
    batch["groups"][0]["trajectories"][1]["token_ids"][1] = 511
    assert unusable(batch, need_logprobs=False, vocab_size=512) is None


def test_progress_line_shows_version_loss_reward_throughput_and_lease_wait():
    line = progress_line(7, {"loss": -0.01234, "reward_mean": 0.5, "groups": 8, "tokens_per_s": 12345.6,
                             "lease_wait_s": 0.25, "updates": 1.0})
    assert line == "[train] v7  loss -0.0123  reward 0.500  groups 8  tokens/s 12,346  lease wait 0.25s"


def test_train_help_lists_every_config_field_with_its_default(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--help"])
    text = capsys.readouterr().out
    for name in ("micro_token_budget", "ppo_epochs", "max_staleness", "loss.tis_cap", "loss.kl_mode"):
        assert name in text
    assert "lease_seconds            default 300.0" in text

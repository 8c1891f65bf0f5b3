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


def _seg(i: int, ids: list[int], mask: list[int], lp: list[float] | None = None) -> dict:
    return {"segment_index": i, "is_last": False, "token_ids": ids, "loss_mask": mask, "logprobs": lp,
            "advantage": None}


def _one(traj: dict) -> dict:
    return {"batch_id": "b", "groups": [{"id": "g-s", "policy_version": 0, "trajectories": [traj]}]}


def test_a_segmented_trajectory_with_null_top_level_arrays_is_usable_and_each_segment_is_checked():
    """The service sends a segmented trajectory with null top-level arrays: usable. Each segment's
    vocabulary, lengths and advantage are checked, naming the segment, also with (ignored) top-level arrays."""
    traj = {"index": 3, "token_ids": None, "loss_mask": None, "logprobs": None, "advantage": 1.0,
            "segments": [_seg(0, [1, 2, 3], [0, 1, 1]), _seg(1, [3, 4, 5], [0, 0, 1])]}
    assert unusable(_one(traj), need_logprobs=False, vocab_size=256) is None
    traj["segments"][1]["token_ids"] = [3, 999999, 5]
    want = ("group 'g-s' trajectory 3: segment 1: token id 999999 at position 1 is outside the model's "
            "vocabulary (vocab_size 256)")
    assert unusable(_one(traj), need_logprobs=False, vocab_size=256) == want
    traj["token_ids"], traj["loss_mask"] = [1], [0]  # a dummy top-level array does not hide the segment
    assert unusable(_one(traj), need_logprobs=False, vocab_size=256) == want
    traj["segments"][1]["token_ids"] = [3, 4]
    assert "segment 1: token_ids, loss_mask, logprobs differ in length" in unusable(_one(traj), False, 256)
    traj["segments"][1]["token_ids"] = [3, 4, 5]
    traj["segments"][0]["logprobs"] = [0.0, -1.0, -1.0]
    assert "segment 1: no behaviour logprobs" in unusable(_one(traj), need_logprobs=True, vocab_size=256)
    traj["advantage"] = None  # segments without their own advantage take the trajectory's: none here
    assert "segment 0: no advantage" in unusable(_one(traj), False, 256)
    traj["segments"] = []
    assert "empty segments list" in unusable(_one(traj), False, 256)


@pytest.mark.parametrize(("field", "value", "want"), [
    ("versions", [0, 0], "trajectory 1: versions has 2 entries for 4 token ids"),
    ("logprobs", [None, None, -0.5, -0.5], "trajectory 1: logprobs has a null at position 0"),
    ("versions", [0, 0, None, 1], "trajectory 1: versions has a null at position 2"),
    ("advantage", float("nan"), "trajectory 1: advantage nan is not a finite number"),
])
def test_misaligned_versions_and_null_entries_are_refused_naming_the_trajectory(field, value, want):
    """Before: pack_batch raised ValueError / TypeError outside any handler (the trainer crashed)."""
    from trainer.packing import pack_batch

    traj = {"index": 1, "token_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1], "logprobs": None,
            "versions": None, "advantage": 1.0}
    assert unusable(_one(traj), need_logprobs=False, vocab_size=256) is None
    pack_batch(_one(traj), 64)
    traj[field] = value
    assert unusable(_one(traj), need_logprobs=False, vocab_size=256) == f"group 'g-s' {want}"
